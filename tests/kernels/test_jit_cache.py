"""kernels/jit_cache.py on CPU, against a stand-in of triton 3.6's knobs (the names checked against
its knobs.py and runtime/jit.py: runtime.jit_cache_hook, compilation.listener, cache.dir), and
the executor's --cache-dir."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from executor_svc.config import ExecutorConfig
from kernels import jit_cache


class _Dir:
    """A data descriptor as triton's env_str_callable_default: setting it sets TRITON_CACHE_DIR."""

    def __get__(self, obj, cls):
        return obj.__dict__.get("dir", "/home/.triton/cache")

    def __set__(self, obj, value):
        obj.__dict__["dir"] = value
        import os

        os.environ["TRITON_CACHE_DIR"] = value


@pytest.fixture
def fake_triton(monkeypatch):
    cache_knobs = type("cache_knobs", (), {"dir": _Dir()})
    knobs = types.SimpleNamespace(cache=cache_knobs(),
                                  runtime=types.SimpleNamespace(jit_cache_hook=None),
                                  compilation=types.SimpleNamespace(listener=None))
    module = types.ModuleType("triton")
    module.knobs = knobs
    monkeypatch.setitem(sys.modules, "triton", module)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setattr(jit_cache, "_counter", None)
    return module


def compile_once(knobs, name: str, cache_hit: bool):
    """What JITFunction._do_compile and compiler.compile call, in their order."""
    skip = knobs.runtime.jit_cache_hook(key=name, repr=name, fn=None, compile={}, is_manual_warmup=False,
                                        already_compiled=False)
    if not skip:
        knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=cache_hit)
    return skip


def test_the_cache_dir_goes_to_the_knob(fake_triton, tmp_path):
    import os

    path = str(tmp_path / "c" / "triton")
    assert jit_cache.set_cache_dir(path) == path and os.path.isdir(path)
    assert fake_triton.knobs.cache.dir == path and os.environ["TRITON_CACHE_DIR"] == path  # ranks inherit it


def test_without_the_knob_the_environment_variable(fake_triton, tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(fake_triton, "knobs", types.SimpleNamespace())
    assert jit_cache.set_cache_dir(str(tmp_path)) == str(tmp_path)
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path)


def test_without_triton_nothing(monkeypatch, tmp_path):
    import os

    monkeypatch.setitem(sys.modules, "triton", None)  # import fails
    monkeypatch.setattr(jit_cache, "_counter", None)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    assert jit_cache.set_cache_dir(str(tmp_path / "x")) is None and jit_cache.jit_counter() is None
    assert "TRITON_CACHE_DIR" not in os.environ and not (tmp_path / "x").exists()


def test_the_counter_counts_compiles_and_disk_hits_and_keeps_earlier_hooks(fake_triton, caplog):
    seen = []
    fake_triton.knobs.runtime.jit_cache_hook = lambda **kw: seen.append(kw["key"]) or kw["key"] == "skip"
    fake_triton.knobs.compilation.listener = lambda **kw: seen.append(kw["cache_hit"])
    counter = jit_cache.jit_counter()
    assert counter is jit_cache.jit_counter()  # installed once
    knobs = fake_triton.knobs
    compile_once(knobs, "a", cache_hit=False)
    compile_once(knobs, "b", cache_hit=True)
    assert compile_once(knobs, "skip", cache_hit=False)  # the earlier hook's answer stands
    assert (counter.compiled, counter.from_disk, counter.names) == (3, 1, ["a", "b", "skip"])
    assert seen == ["a", False, "b", True, "skip"]
    assert caplog.text == ""
    counter.serving = True
    with caplog.at_level(logging.WARNING, logger="kernels.jit_cache"):
        compile_once(knobs, "late", cache_hit=False)
    assert "while serving" in caplog.text and "late" in caplog.text and counter.compiled == 4


def test_cache_dir_flag_and_its_environment_fallback(monkeypatch):
    assert ExecutorConfig.from_args(["--device", "cpu"]).cache_dir == ""
    assert ExecutorConfig.from_args(["--device", "cpu", "--cache-dir", "/c"]).cache_dir == "/c"
    monkeypatch.setenv("LLMSERVE_EXECUTOR_CACHE_DIR", "/env")
    assert ExecutorConfig.from_args(["--device", "cpu"]).cache_dir == "/env"
    assert ExecutorConfig.from_args(["--device", "cpu", "--cache-dir", "/flag"]).cache_dir == "/flag"


def test_start_up_points_triton_at_the_cache_dir_only_when_given(fake_triton, tmp_path, monkeypatch):
    from executor_svc.startup.build import prepare_triton

    prepare_triton("")
    assert fake_triton.knobs.cache.dir == "/home/.triton/cache" and jit_cache.jit_counter() is not None
    prepare_triton(str(tmp_path))
    assert fake_triton.knobs.cache.dir == str(tmp_path / "triton")
