"""The pipe between the scheduler's two processes, slow consumers and process hygiene, end to end:
huge messages fail their request only, a stalled API process loses no stream, a client that
stops reading loses its slot, and no process outlives its parent on any way out.

Process checks read /proc (Linux): a process under test is started in a session of its own,
so its process group is everything it started."""

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import ROOT, free_port, free_ports, generate
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from tests.integration.conftest import CPU_EXECUTOR, start_cluster

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
BACKLOG, FRAME = 200, 4096  # tokens a stream may hold unread; bytes of the largest pipe message
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
       "LLMSERVE_INTERNAL_TOKEN": "test-token-of-the-process-tests"}


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, process group, state) of a process, None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[2]), fields[0]


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[2] != "Z"  # a zombie has exited already


def _live_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _alive(int(p))]


def _group(pgid: int) -> list[int]:
    return [pid for pid in _live_pids() if (_stat(pid) or (0, 0, ""))[1] == pgid]


def _children(pid: int) -> list[int]:
    return [p for p in _live_pids() if (_stat(p) or (0, 0, ""))[0] == pid]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def _engine_core_of(api_pid: int, timeout: float = 30) -> int:
    _wait_until(lambda: _children(api_pid), timeout, "the API process starts its engine core")
    (core,) = _children(api_pid)  # one child: the core, and no multiprocessing resource tracker
    assert "core_process" in _cmdline(core)
    return core


@pytest.fixture(scope="module")
def cluster(model_dirs, tmp_path_factory):
    c = start_cluster(tmp_path_factory, model_dirs["llama"], "pipe", scheduler_args=[
        "--max-stream-backlog", str(BACKLOG), "--max-pipe-frame-bytes", str(FRAME)])
    yield c
    c.stop()  # SIGTERM to each service
    assert [p.returncode for p in c.procs] == [0, 0], c.logs()


def _assert_all_alive(cluster, core_pid: int) -> None:
    assert [p.poll() for p in cluster.procs] == [None, None], cluster.logs()
    assert _alive(core_pid) and _engine_core_of(cluster.procs[1].pid) == core_pid


def test_huge_requests_fail_alone_and_the_server_keeps_serving(cluster):
    core = _engine_core_of(cluster.procs[1].pid)
    reference, _, _ = generate(cluster.stub, prompt_ids=[5, 6, 7], max_tokens=6, temperature=0.0,
                               ignore_eos=True)
    stop = ["s" * 1024 + str(i) for i in range(1024)]  # ~1 MiB of stop strings
    with pytest.raises(grpc.RpcError) as err:
        generate(cluster.stub, prompt_ids=[5, 6, 7], max_tokens=4, stop=stop, timeout=60)
    # A stop-string limit may refuse it first (INVALID_ARGUMENT); the pipe's limit otherwise.
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
    # Within every API limit, but larger than the largest message between the processes:
    long_prompt = [3 + i % 500 for i in range(2000)]
    with pytest.raises(grpc.RpcError) as err:
        generate(cluster.stub, prompt_ids=long_prompt, max_tokens=4, timeout=60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{FRAME}-byte limit" in err.value.details() and "--max-pipe-frame-bytes" in err.value.details()
    ids, _, _ = generate(cluster.stub, prompt_ids=[5, 6, 7], max_tokens=6, temperature=0.0, ignore_eos=True)
    assert ids == reference
    _assert_all_alive(cluster, core)


def test_a_stalled_api_process_loses_no_stream(cluster):
    api, core = cluster.procs[1].pid, _engine_core_of(cluster.procs[1].pid)
    prompts = [[5 + i, 6, 7] for i in range(6)]
    references = [generate(cluster.stub, prompt_ids=p, max_tokens=300, temperature=0.0, ignore_eos=True)[0]
                  for p in prompts[:2]]
    first_tokens = [cf.Future() for _ in prompts]

    def stream(i: int) -> list[int]:
        req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompts[i]), params=pb.SamplingParams(
            max_tokens=300, temperature=0.0, ignore_eos=True))
        ids = []
        for msg in cluster.stub.Generate(req, timeout=60):
            ids += msg.token_ids
            if not first_tokens[i].done():
                first_tokens[i].set_result(True)
        return ids

    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        streams = [pool.submit(stream, i) for i in range(len(prompts))]
        cf.wait(first_tokens, timeout=30)
        os.kill(api, signal.SIGSTOP)  # the core keeps stepping into a pipe nobody reads
        time.sleep(3)
        os.kill(api, signal.SIGCONT)
        results = [s.result(timeout=60) for s in streams]
    assert results[:2] == references and all(len(ids) == 300 for ids in results)
    _assert_all_alive(cluster, core)


def test_streams_nobody_reads_are_aborted_and_free_their_slots(cluster):
    reference, _, _ = generate(cluster.stub, prompt_ids=[9, 8, 7], max_tokens=40, temperature=0.0,
                               ignore_eos=True)
    num_steps_before = cluster.status().num_steps
    # A small HTTP/2 window: the server's writes block after ~1 KiB unread, as they would
    # after the default window on a real, slower stream.
    lazy = grpc.insecure_channel(cluster.address, options=[("grpc.http2.lookahead_bytes", 1024),
                                                           ("grpc.http2.bdp_probe", 0)])
    calls = [pb_grpc.LLMServeStub(lazy).Generate(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[5, 6, 7 + i]), params=pb.SamplingParams(
            max_tokens=2000, temperature=0.0, ignore_eos=True)), timeout=60) for i in range(3)]
    try:
        ids, _, last = generate(cluster.stub, prompt_ids=[9, 8, 7], max_tokens=40, temperature=0.0,
                                ignore_eos=True)
        assert ids == reference and last.finish_reason == pb.FINISH_REASON_LENGTH
        # Freed while the calls are still open and unread (2000 tokens would take seconds more).
        status = cluster.wait_idle(timeout=20)
        assert (status.num_running, status.free_blocks) == (0, status.total_blocks)
        assert status.num_steps - num_steps_before < 1000
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "read too slowly" in err.value.details()
        assert "read too slowly" in cluster.logs(tail=None)
    finally:
        lazy.close()


def _llmserve(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llmserve", "--http-port", "0", *args], cwd=ROOT, env=ENV,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _serving(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return r.status == health_pb2.HealthCheckResponse.SERVING


def _assert_group_gone(proc: subprocess.Popen) -> None:
    _wait_until(lambda: not _group(proc.pid), 5, f"every process of the group exits: {_group(proc.pid)}")


def test_llmserve_sigterm_exits_0_and_leaves_no_process(model_dirs, tmp_path):
    port, executor_port = free_ports(2)
    proc = _llmserve(["--model", str(model_dirs["llama"]), "--port", str(port),
                      "--executor-port", str(executor_port), "--executor-args", " ".join(CPU_EXECUTOR)],
                     tmp_path / "llmserve.log")
    try:
        _wait_until(lambda: _serving(port) or proc.poll() is not None, 120, "llmserve serves")
        assert proc.poll() is None, (tmp_path / "llmserve.log").read_text()
        assert len(_group(proc.pid)) == 5  # launcher, executor, its gRPC endpoint, API process, engine core
        os.killpg(proc.pid, signal.SIGTERM)  # as systemd and docker stop a service
        assert proc.wait(timeout=30) == 0, (tmp_path / "llmserve.log").read_text()
        _assert_group_gone(proc)
        log = (tmp_path / "llmserve.log").read_text()
        assert "Traceback" not in log
        assert "llmserve: stopping both services (SIGTERM)" in log  # the launcher says why it exits
        assert "llmserve: exiting with code 0 (executor " in log
        assert "llmserve-scheduler: exiting with code 0: stopped by SIGTERM" in log
    finally:
        _kill_group(proc)


def test_llmserve_with_a_missing_model_fails_and_leaves_no_process(tmp_path):
    port, executor_port = free_ports(2)
    proc = _llmserve(["--model", str(tmp_path / "no-such-model"), "--port", str(port),
                      "--executor-port", str(executor_port), "--executor-args", "--device cpu"],
                     tmp_path / "llmserve.log")
    try:
        assert proc.wait(timeout=60) == 1
        _assert_group_gone(proc)
        log = (tmp_path / "llmserve.log").read_text()
        assert "llmserve: the executor exited with code 1; stopping the scheduler" in log
        assert "llmserve: exiting with code 1 (executor 1, scheduler " in log
    finally:
        _kill_group(proc)


def test_ctrl_c_during_start_up_prints_no_traceback_and_leaves_no_process(model_dirs, tmp_path):
    log = tmp_path / "llmserve.log"
    port, executor_port = free_ports(2)
    proc = _llmserve(["--model", str(model_dirs["llama"]), "--port", str(port),
                      "--executor-port", str(executor_port), "--executor-args", "--device cpu"], log)
    try:
        time.sleep(3)  # the executor is still loading; the scheduler waits for it
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the whole group
        assert proc.wait(timeout=30) == 0, log.read_text()
        _assert_group_gone(proc)
        assert "Traceback" not in log.read_text()
    finally:
        _kill_group(proc)


def _service(module: str, args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=ENV,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _lone_scheduler(log: Path) -> subprocess.Popen:
    """A scheduler with no executor at all: its core waits for one, as during any start."""
    port, executor_port = free_ports(2)
    return _service("scheduler_svc", ["--port", str(port),
                                      "--executor-address", f"127.0.0.1:{executor_port}"], log)


def test_each_service_exits_0_on_sigterm_during_start_up(model_dirs, tmp_path):
    scheduler = _lone_scheduler(tmp_path / "scheduler.log")
    executor = _service("executor_svc", ["--model", str(model_dirs["llama"]), "--device", "cpu",
                                         "--port", str(free_port())], tmp_path / "executor.log")
    try:
        _engine_core_of(scheduler.pid)
        time.sleep(1)  # the executor is importing torch or loading
        for proc in (scheduler, executor):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, name in ((scheduler, "scheduler"), (executor, "executor")):
            log = (tmp_path / f"{name}.log").read_text
            assert proc.wait(timeout=30) == 0, log()
            _assert_group_gone(proc)
            assert "Traceback" not in log()
    finally:
        _kill_group(scheduler)
        _kill_group(executor)


def test_the_engine_core_dies_with_a_sigkilled_api_process(tmp_path):
    proc = _lone_scheduler(tmp_path / "scheduler.log")
    try:
        core = _engine_core_of(proc.pid)
        assert sorted(_group(proc.pid)) == sorted([proc.pid, core])  # no resource tracker either
        proc.kill()
        proc.wait()
        _wait_until(lambda: not _alive(core), 5, "the orphaned engine core exits")
    finally:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    """Cleanup after a failed assertion: nothing of a test outlives it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
