"""One request's failure stays that request's, in the engine core.

An exception while the core works for one request used to end the core process (and every
stream with it). What depends on a request's own content is contained to that request:

- applying a sampled token to it: detokenization, stop strings. The scheduler core contains
  that itself, row by row in `Scheduler.update_from_output`, and hands the requests it failed
  over with `Scheduler.take_failed`; `with_failed` turns them into errors when that update's
  outputs are published;
- adding it (`add_all_or_none`) and encoding its outputs (`send_or_fail`), for core_process.py.

The request is finished in the scheduler (its slot and blocks go back, as for an abort) and
answered INTERNAL; the step goes on for every other request. Anything else that raises in the
step loop is a fault of the scheduler's own state, which no single request explains: the core
fails every request and starts a fresh scheduler (core_process.EngineCore.run).
"""

from __future__ import annotations

import logging
import uuid

from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.samples import sample_requests
from scheduler_svc.core.scheduler import Scheduler
from scheduler_svc.messages import AddRequest, Outputs, RequestError
from scheduler_svc.pipe import Channel, ChannelClosed, FrameTooLarge, UndeliverableMessage

log = logging.getLogger("llmserve.engine_core")


def request_failed(req_id: int, what: str, exc: BaseException) -> RequestError:
    """Logs the failure with its traceback under an error id; the error to answer with (the API
    process logs its text and shows the client INTERNAL with an id, never Python's text)."""
    error_id = uuid.uuid4().hex[:12]
    log.error("request %d failed while %s (error id %s): %s: %s", req_id, what, error_id,
              type(exc).__name__, exc, exc_info=exc)
    return RequestError("INTERNAL", f"the engine core failed this request while {what} "
                        f"(error id {error_id}): {type(exc).__name__}: {exc}")


def with_failed(scheduler: Scheduler, outputs: list[RequestOutput], errors: list) -> tuple[list, list]:
    """outputs, and errors with those of the requests the scheduler failed alone since the last
    call (Scheduler.take_failed; they have no output), each logged with its traceback under an
    error id. Free when nothing failed (a dict's truth value)."""
    failed = scheduler.take_failed()
    if not failed:
        return outputs, errors
    return outputs, [*errors, *((i, request_failed(i, "applying a step's token", e)) for i, e in failed.items())]


def add_all_or_none(scheduler: Scheduler, cmd: AddRequest) -> RequestError | None:
    """Adds the samples of one client request, all or none; the error to answer them with when
    this request makes anything raise (the core carries on)."""
    try:
        for request in sample_requests(cmd.req_id, cmd.prompt_token_ids, cmd.params):
            scheduler.add_request(request)
        return None
    except ValueError as e:  # validation let through a request the core can never run
        error = RequestError("INVALID_ARGUMENT", str(e))
    except Exception as e:  # noqa: BLE001 - e.g. a prompt the detokenizer cannot take
        error = request_failed(cmd.req_id, "adding it", e)
    for i in range(cmd.req_id, cmd.req_id + max(1, cmd.params.n)):  # those added before it
        try:
            scheduler.abort_request(i)
        except Exception:  # noqa: BLE001 - one added halfway, not queued: it holds only its entry
            scheduler.requests.pop(i, None)
    return error


def send_or_fail(channel: Channel, scheduler: Scheduler | None, req_id: int, message, stats: tuple) -> None:
    """Sends one request's Outputs (`message()` builds and encodes it); one that cannot be
    encoded or cross the pipe fails that request alone (aborted: its slot and blocks go back)."""
    try:
        channel.send_nowait(message())
        return
    except ChannelClosed:
        raise
    except UndeliverableMessage as e:
        log.warning("request %d failed: its output cannot reach the API process: %s", req_id, e)
        code = "RESOURCE_EXHAUSTED" if isinstance(e, FrameTooLarge) else "INTERNAL"
        error = RequestError(code, f"an output of this request could not be delivered: {e}")
    except Exception as e:  # noqa: BLE001 - an output that does not encode
        error = request_failed(req_id, "encoding its output", e)
    if scheduler is not None:
        scheduler.abort_request(req_id)
    channel.send_nowait(Outputs([], [(req_id, error)], stats))
