"""The access log of both doors, in process: the real servicer on a grpc.aio server and the real
HTTP app (driven by the `openai` package over an ASGI transport) on one fake engine. Each call
leaves one `llmserve.access` line whose fields are parsed: OK calls with their token counts,
refusals at INFO with the field, internal failures at ERROR with the error id the client got,
and --disable-log-requests (access_log.configure) leaves only failures."""

from __future__ import annotations

import asyncio
import logging

import grpc
import httpx2 as httpx
import pytest

from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from scheduler_svc.api import access_log
from scheduler_svc.api.admission import Admission
from scheduler_svc.api.grpc.handlers import add_llmserve_servicer
from scheduler_svc.api.grpc.servicer import LLMServeServicer
from scheduler_svc.api.http.app import build_app
from scheduler_svc.api.http.context import HttpContext
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.validation import SizeLimits
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason
from scheduler_svc.core.tokenizer import Tokenizer
from scheduler_svc.messages import CoreStats, RequestError
from step_protocol.domain import ExecutorInfo

openai = pytest.importorskip("openai")

SECRET = "executor exploded at /srv/secret/model"
CORE_ID = "c0ffee123456"
INFO = ExecutorInfo(model_name="tiny", model_path="", vocab_size=512, eos_token_ids=(2,),
                    max_model_len=256, block_size=16, num_blocks=129, cuda_graph_sizes=(),
                    max_num_seqs=8, max_num_batched_tokens=8192, device="cpu", dtype="float32")


class FakeEngine:
    """EngineClient's surface: one token per output up to max_tokens; `fail` makes the next
    request fail with an engine INTERNAL error ("internal") or an unexpected exception ("bug")."""

    def __init__(self):
        self.info, self.stats, self.num_requests, self.core_lost = INFO, CoreStats(), 0, None
        self.fail = None

    async def generate(self, prompt_ids, params):
        fail, self.fail = self.fail, None
        if fail == "internal":
            raise RequestError("INTERNAL", SECRET)
        if fail == "bug":
            raise KeyError(SECRET)
        if fail == "core":  # the engine core logged the real text under its own id
            raise RequestError("INTERNAL", f"internal error (error id {CORE_ID})")
        for i in range(params.n):
            for k in range(params.max_tokens):
                last = k == params.max_tokens - 1
                yield RequestOutput(k, [7], "a", FinishReason.LENGTH if last else None, "",
                                    len(prompt_ids), k + 1, index=i)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from executor_svc.model_loader.random_model import build_tokenizer

    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer(folder, vocab_size=INFO.vocab_size, max_model_len=INFO.max_model_len)
    return Tokenizer(folder)


def _run(tokenizer, calls):
    """Serves both doors on one fake engine and runs `calls(stub, client, engine)`."""
    async def main():
        engine = FakeEngine()
        pool = TokenizePool(tokenizer, 1, max_pending=16)
        server = grpc.aio.server()
        admission = Admission(engine, pool, SizeLimits(), 16, True)  # both doors', as served
        add_llmserve_servicer(LLMServeServicer(admission, "tiny"), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        app = build_app(HttpContext(admission, tokenizer, "tiny"), 1 << 20)
        transport = httpx.ASGITransport(app=app)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel, \
                    httpx.AsyncClient(transport=transport, base_url="http://test") as http, \
                    openai.AsyncOpenAI(base_url="http://test/v1", api_key="-", http_client=http,
                                       max_retries=0) as client:
                return await calls(pb_grpc.LLMServeStub(channel), client, engine)
        finally:
            await server.stop(None)
            pool.close()
    return asyncio.run(main())


def _lines(caplog) -> list[tuple[int, dict]]:
    return [(r.levelno, access_log.parse_line(r.getMessage())) for r in caplog.records
            if r.name == "llmserve.access"]


def _grpc_error(e: grpc.aio.AioRpcError) -> tuple[str, str]:
    return e.code().name, e.details()


async def _generate(stub, **params):
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7, 8]), request_id="req-1",
                             params=pb.SamplingParams(**params))
    return [m async for m in stub.Generate(req)]


def test_ok_calls_on_both_doors_give_one_line_each(tokenizer, caplog):
    async def calls(stub, client, engine):
        streamed = await _generate(stub, max_tokens=5)
        completion = await client.completions.create(model="tiny", prompt="hello there", max_tokens=3)
        chunks = [c async for c in await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True)]
        return streamed, completion, chunks

    with caplog.at_level(logging.INFO, logger="llmserve.access"):
        streamed, completion, chunks = _run(tokenizer, calls)
    lines = _lines(caplog)
    assert [(f["door"], f["method"]) for _, f in lines] == [
        ("grpc", "Generate"), ("http", "POST /v1/completions"), ("http", "POST /v1/chat/completions")]
    assert all(level == logging.INFO and f["outcome"] == "ok" for level, f in lines)
    grpc_line, completion_line, chat_line = (f for _, f in lines)
    assert grpc_line["request_id"] == "req-1" and grpc_line["status"] == "OK"
    assert (int(grpc_line["prompt_tokens"]), int(grpc_line["output_tokens"])) == (4, 5) == \
        (streamed[-1].total_usage.prompt_tokens, streamed[-1].total_usage.completion_tokens)
    assert completion_line["request_id"] == completion.id and completion_line["status"] == "200"
    assert int(completion_line["prompt_tokens"]) == completion.usage.prompt_tokens
    assert int(completion_line["output_tokens"]) == completion.usage.completion_tokens == 3
    assert chat_line["request_id"] == chunks[0].id and int(chat_line["output_tokens"]) == 4
    for f in (grpc_line, completion_line, chat_line):
        assert float(f["duration_ms"]) >= float(f["ttft_ms"]) >= 0 and "message" not in f


def test_refusals_are_info_with_the_field(tokenizer, caplog):
    async def calls(stub, client, engine):
        with pytest.raises(grpc.aio.AioRpcError) as grpc_err:
            await _generate(stub, max_tokens=5, temperature=-1.0)
        with pytest.raises(openai.BadRequestError) as http_err:
            await client.completions.create(model="tiny", prompt="hi", max_tokens=3, top_p=7.0)
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="not-this-one", prompt="hi")
        return _grpc_error(grpc_err.value), http_err.value.body

    with caplog.at_level(logging.INFO, logger="llmserve.access"):
        (code, details), http_body = _run(tokenizer, calls)
    (l1, grpc_line), (l2, http_line), (l3, model_line) = _lines(caplog)
    assert l1 == l2 == l3 == logging.INFO
    assert code == "INVALID_ARGUMENT" and grpc_line["status"] == code
    assert grpc_line["outcome"] == "refused" and grpc_line["message"] == details
    assert grpc_line["param"] == "temperature" and grpc_line["request_id"] == "req-1"
    assert grpc_line["output_tokens"] == "-"  # refused before it ran
    assert http_line["status"] == "400" and http_line["outcome"] == "refused"
    assert http_line["param"] == http_body["param"] == "top_p"
    assert http_line["message"] == http_body["message"]
    assert model_line["status"] == "404" and model_line["param"] == "model"


def test_internal_failures_are_errors_with_the_id_the_client_got(tokenizer, caplog):
    async def calls(stub, client, engine):
        details = []
        for fail in ("internal", "bug"):
            engine.fail = fail
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await _generate(stub, max_tokens=2)
            details.append(_grpc_error(e.value))
        bodies = []
        for fail in ("internal", "bug"):
            engine.fail = fail
            with pytest.raises(openai.InternalServerError) as e:
                await client.completions.create(model="tiny", prompt="hi", max_tokens=2)
            bodies.append(e.value.body["message"])
        return details, bodies

    with caplog.at_level(logging.INFO):
        details, bodies = _run(tokenizer, calls)
    lines = _lines(caplog)
    assert len(lines) == 4 and all(level == logging.ERROR for level, _ in lines)
    client_messages = [d for code, d in details] + bodies
    assert [code for code, _ in details] == ["INTERNAL", "INTERNAL"]
    for (_, f), told in zip(lines, client_messages):
        assert SECRET not in told and told == f"internal error (error id {f['error_id']})"
        assert f["outcome"] == "failed" and f["status"] in ("INTERNAL", "500")
    assert SECRET in lines[0][1]["message"] and SECRET in lines[2][1]["message"]  # the real text
    records = [r for r in caplog.records if r.name == "llmserve.access"]
    assert records[1].exc_info and records[3].exc_info  # the bug's traceback, on its line
    # one log record per failure: no second line for the same error id
    for _, f in lines:
        assert sum(f["error_id"] in r.getMessage() for r in caplog.records) == 1


def test_disabled_logs_only_failures(tokenizer, caplog):
    async def calls(stub, client, engine):
        await _generate(stub, max_tokens=2)
        await client.completions.create(model="tiny", prompt="hi", max_tokens=2)
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model="tiny", prompt="hi", max_tokens=2, top_p=7.0)
        engine.fail = "internal"
        with pytest.raises(openai.InternalServerError):
            await client.completions.create(model="tiny", prompt="hi", max_tokens=2)

    access_log.configure(enabled=False)
    try:
        with caplog.at_level(logging.INFO):  # the root's level: the access logger's own decides
            _run(tokenizer, calls)
    finally:
        access_log.configure(enabled=True)
    lines = _lines(caplog)
    assert [(level, f["status"]) for level, f in lines] == [(logging.ERROR, "500")]


def test_format_and_parse_round_trip():
    fields = [("a", None), ("b", 3), ("c", 'say "hi" = x\\y'), ("d", "")]
    assert access_log.parse_line(access_log.format_fields(fields)) == \
        {"a": "-", "b": "3", "c": 'say "hi" = x\\y', "d": ""}


def test_a_stream_that_fails_logs_the_error_event_it_sent(tokenizer, caplog):
    """The status line has gone (200): the line carries the in-band error's status and id."""
    async def calls(stub, client, engine):
        engine.fail = "internal"
        with pytest.raises(openai.APIError) as e:
            async for _ in await client.completions.create(model="tiny", prompt="hi", max_tokens=2,
                                                           stream=True):
                pass
        return str(e.value)

    with caplog.at_level(logging.INFO, logger="llmserve.access"):
        told = _run(tokenizer, calls)
    [(level, f)] = _lines(caplog)
    assert level == logging.ERROR and (f["status"], f["outcome"]) == ("500", "failed")
    assert f"internal error (error id {f['error_id']})" in told and SECRET in f["message"]


def test_the_guards_refusals_have_lines_too(tokenizer, caplog):
    """The API-key guard's 401 (before any route) is logged; the probes' /health is not."""
    engine = FakeEngine()
    pool = TokenizePool(tokenizer, 1, max_pending=4)
    app = build_app(HttpContext(Admission(engine, pool, SizeLimits(), 16, True), tokenizer, "tiny",
                                api_key="k"), 1 << 20)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return (await c.get("/v1/models")).status_code, (await c.get("/health")).status_code

    with caplog.at_level(logging.INFO, logger="llmserve.access"):
        try:
            statuses = asyncio.run(main())
        finally:
            pool.close()
    [(level, f)] = _lines(caplog)  # /health is not logged
    assert statuses[0] == 401 and (level, f["status"], f["outcome"]) == (logging.INFO, "401", "refused")
    assert f["method"] == "GET /v1/models" and "API key" in f["message"]


def test_an_error_id_from_the_engine_core_is_kept(tokenizer, caplog):
    """A row the core failed comes with the id the core logged the real text under: the client
    gets that id on both doors, and the access line has it too (one id to grep for)."""
    async def calls(stub, client, engine):
        engine.fail = "core"
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await _generate(stub, max_tokens=2)
        engine.fail = "core"
        with pytest.raises(openai.InternalServerError) as h:
            await client.completions.create(model="tiny", prompt="hi", max_tokens=2)
        return e.value.details(), h.value.body["message"]

    with caplog.at_level(logging.INFO, logger="llmserve.access"):
        told = _run(tokenizer, calls)
    assert told == (f"internal error (error id {CORE_ID})",) * 2
    assert [(level, f["error_id"]) for level, f in _lines(caplog)] == [(logging.ERROR, CORE_ID)] * 2
