"""The HTTP API in process on an engine whose output is given: each sample's text arrives in the
pieces a test chooses (one engine output each), so the tool-call responses are exact; the
official `openai` client talks to it through starlette's TestClient."""

from __future__ import annotations

import contextlib

from starlette.testclient import TestClient

from llmserve.structured.constraint import to_grammar
from scheduler_svc.api.admission import Admission
from scheduler_svc.api.http.app import build_app
from scheduler_svc.api.http.context import HttpContext
from scheduler_svc.api.tokenize_pool import TokenizePool
from scheduler_svc.api.tools.plan import ToolSettings
from scheduler_svc.api.validation import SizeLimits
from scheduler_svc.core.outputs import RequestOutput
from scheduler_svc.core.request import FinishReason
from scheduler_svc.messages import CoreStats
from step_protocol.domain import ExecutorInfo

INFO = ExecutorInfo(model_name="tiny", model_path="", vocab_size=512, eos_token_ids=(2,),
                    max_model_len=2048, block_size=16, num_blocks=513, cuda_graph_sizes=(),
                    max_num_seqs=64, max_num_batched_tokens=8192, device="cpu", dtype="float32",
                    max_logprobs=20, max_logit_bias=300, max_min_tokens_stop_ids=64)


class ScriptedEngine:
    """EngineClient's surface for Admission; `script[i]` is sample i's pieces of text and
    `finish` how the samples end. Remembers the prompts it was given."""

    def __init__(self):
        self.info, self.stats, self.num_requests, self.core_lost = INFO, CoreStats(), 0, None
        self.script: list[list[str]] = [[""]]
        self.finish = FinishReason.EOS
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], params):
        self.prompts.append(list(prompt_ids))
        for i in range(params.n):
            pieces = self.script[i % len(self.script)]
            for k, piece in enumerate(pieces):
                last = k == len(pieces) - 1
                yield RequestOutput(100 + i, [10 + k], piece, self.finish if last else None, "",
                                    len(prompt_ids), k + 1, index=i)


class AcceptedGrammars:
    """Admission's grammar check, accepting every constraint (the engine's output is given)."""

    def __init__(self):
        self.checked = []

    async def check(self, constraint) -> str:
        self.checked.append(constraint)
        return to_grammar(constraint)


@contextlib.contextmanager
def serving(tokenizer, settings: ToolSettings, grammars=None, **context):
    """(openai client, engine) of an app with these tool flags (and this grammar check, and
    these other HttpContext fields)."""
    import openai

    engine = ScriptedEngine()
    pool = TokenizePool(tokenizer, num_workers=1, max_pending=64)
    admission = Admission(engine, pool, SizeLimits(), max_waiting=64, prefix_caching=False,
                          grammars=grammars)
    app = build_app(HttpContext(admission, tokenizer, "tiny", tools=settings, **context), 64 << 20)
    try:
        with TestClient(app) as http, openai.OpenAI(base_url="http://testserver/v1", api_key="k",
                                                    http_client=http, max_retries=0) as client:
            yield client, engine
    finally:
        pool.close()
