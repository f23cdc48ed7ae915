"""What every route of the HTTP API shares: the admission, tokenizer and model name, and the
body parser (large bodies off the event loop)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import lru_cache

from fastapi import Request

from scheduler_svc.api.admission import Admission
from scheduler_svc.api.engine_client import EngineClient
from scheduler_svc.api.http import errors
from scheduler_svc.api.tools.plan import ToolSettings
from scheduler_svc.core.tokenizer import Tokenizer

# Bodies above this are parsed on a worker thread (~10 ms a MB of JSON).
INLINE_MAX_BODY_BYTES = 256 << 10


@dataclass
class HttpContext:
    admission: Admission
    tokenizer: Tokenizer
    model_name: str
    api_key: str = ""
    metrics: object = None  # api.metrics.Metrics (render() -> Prometheus text)
    enable_tokenizer_info_endpoint: bool = False  # GET /tokenizer_info (tokenizer_info.py)
    tools: ToolSettings = ToolSettings()  # tool calling's flags (api/tools/)
    # bounds of the kept responses (responses/store.py; --responses-store-max-*); 0 = none kept
    responses_store_max_entries: int = 0
    responses_store_max_bytes: int = 0

    @property
    def engine(self) -> EngineClient:
        return self.admission.engine

    def __post_init__(self):
        tokenizer = self.tokenizer
        self.token_text = lru_cache(maxsize=1 << 16)(
            lambda t: tokenizer.decode([t], skip_special_tokens=False))

    def check_model(self, model: str | None) -> None:
        if model and model != self.model_name:
            raise errors.HttpError(404, f"the model '{model}' does not exist; this server serves "
                                   f"'{self.model_name}' (GET /v1/models)", "model", "model_not_found")


async def parse(request: Request, model: type):
    """The body as `model`; ValidationError (answered 400) when it is not."""
    body = await request.body()
    if len(body) > INLINE_MAX_BODY_BYTES:
        return await asyncio.to_thread(model.model_validate_json, body)
    return model.model_validate_json(body)
