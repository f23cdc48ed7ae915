"""The environment fallback of every service flag: LLMSERVE_<SERVICE>_<FLAG> gives the default
of --<flag> (read once, while the parser is built; the flag given wins)."""

from __future__ import annotations

import os
from collections.abc import Mapping

TRUE = ("1", "true", "yes", "on")  # what turns a switch on


def env_name(prefix: str, flag: str) -> str:
    """"LLMSERVE_EXECUTOR_", "max-num-seqs" -> "LLMSERVE_EXECUTOR_MAX_NUM_SEQS"."""
    return prefix + flag.upper().replace("-", "_")


def env_default(prefix: str, flag: str, default, environ: Mapping[str, str] = os.environ):
    """The variable of `flag` as the type of `default` (a bool: one of TRUE), else `default`."""
    value = environ.get(env_name(prefix, flag))
    if value is None:
        return default
    if isinstance(default, bool):
        return value.lower() in TRUE
    return type(default)(value)
