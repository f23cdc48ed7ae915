"""Several prompts in one /v1/completions request (OpenAI's list of strings or of token-id
lists): each is admitted as a request of its own with the same parameters, and their engine
streams are merged into one whose outputs are indexed as OpenAI indexes the choices: prompt i's
sample j is choice i * n + j. One prompt is the engine's own stream, unchanged."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from scheduler_svc.api.admission import Admission
from scheduler_svc.api.prompts import Prompt
from scheduler_svc.api.request_params import RawParams
from scheduler_svc.api.validation import invalid
from scheduler_svc.core.request import SamplingParams
from scheduler_svc.messages import RequestError

Admitted = tuple[list[int], SamplingParams]  # a prompt's token ids and its sampling parameters
_DONE = object()


async def admit_prompts(admission: Admission, prompts: list[Prompt], raw: RawParams) -> list[Admitted]:
    """Every prompt admitted (tokenized side by side), or the first refusal, its message naming
    the prompt when there are several. Prompts times n is bounded by --max-n: each sample of
    each prompt is a request of the scheduler."""
    n = 1 if raw.n is None else raw.n
    if len(prompts) > 1:
        max_n = admission.sizes.max_n
        if len(prompts) * n > max_n:
            raise invalid(f"prompt has {len(prompts)} prompts of n={n} samples each; one request "
                          f"may ask for at most {max_n} samples in all (--max-n)", "prompt")
        admission.check_capacity(len(prompts) * n)  # all at once: each admit sees only its own

    async def one(i: int, prompt: Prompt) -> Admitted:
        try:
            return await admission.admit(prompt, raw, "")
        except RequestError as e:
            if len(prompts) > 1 and e.param == "prompt":
                e.message = f"prompt {i} (of {len(prompts)}): {e.message}"
            raise

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def merged(engine, admitted: list[Admitted]):
    """The outputs of every prompt's samples as they come, out.index = i * n + j. Closing it
    (or its consumer's cancellation) aborts every request still running; an error of any ends
    them all."""
    if len(admitted) == 1:
        return engine.generate(*admitted[0])
    return _merged(engine, admitted)


async def _merged(engine, admitted: list[Admitted]):
    # a small queue: a pump waits while the client reads slowly, so the engine's own backlog
    # bound (--max-stream-backlog) still sees an unread stream
    queue: asyncio.Queue = asyncio.Queue(maxsize=len(admitted))

    async def pump(i: int, prompt_ids: list[int], params: SamplingParams) -> None:
        try:
            async with aclosing(engine.generate(prompt_ids, params)) as outs:
                async for out in outs:
                    out.index += i * params.n
                    await queue.put(out)
            await queue.put(_DONE)
        except RequestError as e:
            await queue.put(e)

    tasks = [asyncio.create_task(pump(i, ids, params)) for i, (ids, params) in enumerate(admitted)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, RequestError):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
