"""Steps in flight through both services: the default depth (3) against strict plan/wait/apply,
a depth of 2, and the step timings the status RPC reports."""

import pytest

from benchmarks.cluster import generate
from protos.llmserve.v1 import llmserve_pb2 as pb
from tests.integration.conftest import start_cluster
from tests.integration.test_generate import _prompts


def test_status_says_where_the_step_time_went(llama_cluster):
    def timings():
        status = llama_cluster.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10)
        return status.num_steps, status.step_timings

    steps0, t0 = timings()
    generate(llama_cluster.stub, prompt_ids=[3, 1, 4, 1, 5], max_tokens=12, ignore_eos=True)
    steps1, t1 = timings()
    assert steps1 - steps0 >= 12  # one prefill step, 11 decode steps (at least)
    for name in ("schedule_us", "apply_us", "result_wait_us", "executor_launch_us"):
        assert getattr(t1, name) > getattr(t0, name), name  # each side measured every step
    assert t1.executor_queued_us >= t0.executor_queued_us
    assert t1.device_idle_us == t0.device_idle_us == 0  # measured with CUDA events only
    # the decode rows' text and outputs went out after the next plan: part of apply_us
    assert 0 < t1.apply_deferred_us - t0.apply_deferred_us <= t1.apply_us - t0.apply_us
    # the launches' thread CPU time: part of their wall time (each step rounds down both)
    launch, cpu = t1.executor_launch_us - t0.executor_launch_us, t1.executor_launch_cpu_us - t0.executor_launch_cpu_us
    assert 0 < cpu <= launch + (steps1 - steps0)


@pytest.mark.parametrize("args", [["--no-overlap"], ["--pipeline-depth", "2"]], ids=["sync", "depth2"])
def test_other_depths_give_identical_outputs(llama_cluster, model_dirs, tmp_path_factory, args):
    """The default (3 steps in flight: N+1 and N+2 planned while N runs) against strict
    plan/wait/apply and against 2 in flight."""
    sync = start_cluster(tmp_path_factory, model_dirs["llama"], args[-1].strip("-"), scheduler_args=args)
    try:
        prompts = _prompts(8, seed=4)
        for stub_params in [dict(temperature=0.0), dict(temperature=1.0, top_k=20, seed=7)]:
            for p in prompts:
                a = generate(llama_cluster.stub, prompt_ids=p, max_tokens=16, ignore_eos=True, **stub_params)
                b = generate(sync.stub, prompt_ids=p, max_tokens=16, ignore_eos=True, **stub_params)
                assert a[0] == b[0] and a[1] == b[1]
    finally:
        sync.stop()
