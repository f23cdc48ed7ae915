"""The engine core dies (SIGKILL, as the OOM killer sends it) under a running scheduler: the
stream in flight fails UNAVAILABLE, the API process says so in one line with the exit code,
health goes NOT_SERVING and back to SERVING, and a fresh core serves the same greedy tokens as
before, through the same executor (its Reset takes the stream over from the killed core).

Reads /proc (Linux) to find the engine core."""

import os
import signal
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import generate
from protos.llmserve.v1 import llmserve_pb2 as pb
from tests.integration.conftest import start_cluster
from tests.integration.reliability.test_pipe_and_processes import _engine_core_of, _wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
PROMPT = [5, 17, 42, 99]


class _HealthWatch:
    """Every status grpc.health.v1 pushed on a Watch stream, without repeats. The server writes
    each change as it happens, so a short NOT_SERVING (the restart took 0.16 s in CI) is seen;
    polling Check from a thread missed it on a loaded 2-core machine. Started only once the
    stream's first status (SERVING) has arrived."""

    def __init__(self, channel):
        self.seen: list = []
        self._call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=120)
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._first.wait(30), "the health Watch stream sent no first status"

    def _run(self):
        try:
            for response in self._call:
                if not self.seen or self.seen[-1] != response.status:
                    self.seen.append(response.status)
                self._first.set()
        except grpc.RpcError:
            pass  # cancelled by stop(), or the deadline

    def stop(self):
        self._call.cancel()
        self._thread.join()


def test_a_sigkilled_engine_core_is_restarted_and_serves_again(model_dirs, tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, model_dirs["llama"], "core-restart")
    try:
        api = cluster.procs[1].pid
        core = _engine_core_of(api)
        reference, _, _ = generate(cluster.stub, prompt_ids=PROMPT, max_tokens=8, temperature=0.0,
                                   ignore_eos=True)
        call = cluster.stub.Generate(pb.GenerateRequest(token_ids=pb.TokenIds(ids=PROMPT), params=pb.SamplingParams(
            max_tokens=2000, temperature=0.0, ignore_eos=True)), timeout=60)
        next(call)  # the stream is running
        watch = _HealthWatch(cluster.channel)
        os.kill(core, signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as err:
            for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        _wait_until(lambda: watch.seen[-1] == health_pb2.HealthCheckResponse.SERVING
                    and health_pb2.HealthCheckResponse.NOT_SERVING in watch.seen, 60, "health comes back")
        watch.stop()
        assert watch.seen == [health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING,
                              health_pb2.HealthCheckResponse.SERVING]
        new_core = _engine_core_of(api)
        assert new_core != core and cluster.procs[1].poll() is None
        ids, _, _ = generate(cluster.stub, prompt_ids=PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True)
        assert ids == reference
        logs = cluster.logs(tail=None)
        lines = [line for line in logs.splitlines() if "llmserve.engine: the engine core process" in line]
        assert len(lines) == 1, logs
        assert lines[0].endswith("the engine core process exited with code -9 (SIGKILL); restarting it; "
                                 "failing 1 requests")
        assert "the engine core restarted" in logs
    finally:
        cluster.stop()
    assert [p.returncode for p in cluster.procs] == [0, 0], cluster.logs()
    assert "exiting with code 0: stopped by SIGTERM" in cluster.logs(tail=None)
