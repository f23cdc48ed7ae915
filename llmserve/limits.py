"""Per-request limits both services need: the scheduler refuses above them, the executor sizes
its per-row tables for them (and reports them in its handshake)."""

from __future__ import annotations

MAX_STOP_TOKEN_IDS = 256  # stop token ids per request (the scheduler's --max-stop-token-ids default)
MAX_EOS_TOKEN_IDS = 32  # the model's EOS ids, which min_tokens masks too
# ids min_tokens may mask: the stop token ids plus the EOS ids (the executor's table width)
MAX_MIN_TOKENS_STOP_IDS = MAX_STOP_TOKEN_IDS + MAX_EOS_TOKEN_IDS
MAX_LOGIT_BIAS = 300  # logit_bias entries per request (OpenAI's limit)
MAX_LOGPROBS = 20  # top alternatives per position (vLLM's --max-logprobs default)
# llguidance grammar text a request may carry to the executor (structured outputs: the
# constraint's own bounds, llmserve/structured/constraint.py, keep what admission sends far below)
MAX_GRAMMAR_BYTES = 4 << 20
