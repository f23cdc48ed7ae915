"""One log format for every llmserve process: time, process[pid] (and a tag, e.g. a rank),
level, logger: message."""

from __future__ import annotations

import logging
import os


def log_format(process: str, tag: str = "") -> str:
    """The format of `process` ("scheduler", "engine-core", "executor")."""
    return f"%(asctime)s {process}[{os.getpid()}]{' ' + tag if tag else ''} %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str, process: str, tag: str = "") -> None:
    """The root logger at `level` in log_format(process, tag)."""
    logging.basicConfig(level=level.upper(), format=log_format(process, tag))
