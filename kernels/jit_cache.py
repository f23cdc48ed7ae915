"""Triton's JIT in this process: where its compiled kernels are kept, and how many it compiles.

Triton compiles a kernel once per variant: per distinct set of dtypes, constexpr values, integer
arguments equal to 1 or divisible by 16, and pointers aligned to 16 bytes. A variant first met
while serving stalls that step (hundreds of ms to seconds), so the executor meets them all at
start (CUDA graph capture, then executor_svc/startup/warmup.py) and keeps what it compiled on
disk (`set_cache_dir`, the executor's --cache-dir) for the next start.

`jit_counter()` counts the variants compiled in this process through Triton's hooks
(`knobs.runtime.jit_cache_hook`, called before each in-process compile, and
`knobs.compilation.listener`, which says whether the disk cache had it); once `serving` is set,
each compile is also logged as a warning. Triton is imported here only when asked for.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)


def set_cache_dir(path: str) -> str | None:
    """Points Triton's kernel cache at `path` (created if missing), before the first compile:
    `triton.knobs.cache.dir` (which also sets TRITON_CACHE_DIR, so child processes inherit it),
    or the TRITON_CACHE_DIR variable on a Triton without knobs. None (and nothing set) without
    Triton."""
    try:
        import triton
    except ImportError:
        return None
    os.makedirs(path, exist_ok=True)
    knobs = getattr(triton, "knobs", None)
    if hasattr(getattr(knobs, "cache", None), "dir"):
        knobs.cache.dir = path
    else:
        os.environ["TRITON_CACHE_DIR"] = path
    return path


class JitCounter:
    """Counts Triton's compilations in this process. `compiled`: kernel variants compiled (each
    first launch of a variant: built, or loaded from the disk cache); `from_disk`: those the disk
    cache had; `names`: the last variants compiled (for messages). Set `serving` once start-up
    is over: every later compile is then logged as a warning."""

    MAX_NAMES = 256

    def __init__(self):
        self.compiled = self.from_disk = 0
        self.names: list[str] = []
        self.serving = False
        self._lock = threading.Lock()
        self._previous_hook = self._previous_listener = None

    def install(self) -> JitCounter:
        """Chains itself in front of whatever hook and listener were set (they still run)."""
        from triton import knobs

        self._previous_hook = knobs.runtime.jit_cache_hook
        self._previous_listener = knobs.compilation.listener
        knobs.runtime.jit_cache_hook = self._on_compile
        knobs.compilation.listener = self._on_compiled
        return self

    def _on_compile(self, **hook_args):
        """knobs.runtime.jit_cache_hook(key=, repr=, fn=, compile=, is_manual_warmup=,
        already_compiled=): before each in-process compile."""
        name = hook_args.get("repr", "?")
        with self._lock:
            self.compiled += 1
            self.names = (self.names + [name])[-self.MAX_NAMES:]
        if self.serving:
            log.warning("compiling a Triton kernel variant while serving (not met at start-up): %s", name)
        if self._previous_hook is not None:  # a True answer skips the compile: theirs to give
            return self._previous_hook(**hook_args)
        return None

    def _on_compiled(self, **listener_args):
        """knobs.compilation.listener(src=, metadata=, metadata_group=, times=, cache_hit=)."""
        if listener_args.get("cache_hit"):
            with self._lock:
                self.from_disk += 1
        if self._previous_listener is not None:
            self._previous_listener(**listener_args)


_counter: JitCounter | None = None
_counter_lock = threading.Lock()


def jit_counter() -> JitCounter | None:
    """This process's JitCounter, installed on first call; None without Triton (or without its
    hooks: Triton before knobs)."""
    global _counter
    with _counter_lock:
        if _counter is None:
            try:
                import triton

                if not hasattr(getattr(triton, "knobs", None), "runtime"):
                    return None
            except ImportError:
                return None
            _counter = JitCounter().install()
        return _counter
