"""A bad row fails alone, across the real executor service: the scheduler's engine (its core,
step loop and executor client, in this process, without the API's validation in front)
serves a busy batch over the executor's Execute stream, and two requests join it that
validation would have refused — one the executor refuses (temperature inf), one whose value
a protobuf field cannot hold (top_k 2^40, left out by the client before the plan goes out).
Each fails alone with INTERNAL and an error id, every other stream is token-exact with a run
without them, and every block comes back."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.cluster import ROOT, free_port
from scheduler_svc.core.request import Request, SamplingParams
from scheduler_svc.core.scheduler import Scheduler, SchedulerCoreConfig
from scheduler_svc.engine.executor_client import ExecutorClient
from scheduler_svc.engine.step_loop import StepLoop

GOOD = {i: [3 + 17 * i + j for j in range(9 + 5 * i)] for i in range(4)}
BAD = {10: SamplingParams(max_tokens=8, temperature=math.inf),  # the executor refuses it
       11: SamplingParams(max_tokens=8, top_k=1 << 40)}  # does not fit the wire's int32


@pytest.fixture(scope="module")
def executor(model_dirs, tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("logs-row-failures") / "executor.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "executor_svc", "--model", str(model_dirs["llama"]),
                             "--port", str(port), "--device", "cpu", "--insecure-no-auth", "--num-kv-blocks", "64",
                             "--max-num-seqs", "8", "--max-num-batched-tokens", "128", "--max-model-len", "256"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(address) as channel:
            health, deadline = health_pb2_grpc.HealthStub(channel), time.monotonic() + 120
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, "the executor did not start"
                try:
                    if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        break
                except grpc.RpcError:
                    time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


async def _serve(address: str, bad: dict[int, SamplingParams]):
    """Three greedy requests decoding; after 3 steps a fourth and the `bad` ones join (depth
    2: the next step is planned before a result is read). Returns (tokens, errors, scheduler)."""
    client = ExecutorClient(address)
    info = await client.connect(timeout=60)
    scheduler = Scheduler(SchedulerCoreConfig(info.num_blocks, info.block_size, info.max_num_seqs,
                                              info.max_num_batched_tokens, info.max_model_len,
                                              eos_token_ids=info.eos_token_ids))
    tokens, errors = {}, []

    def on_outputs(outputs, errs):
        errors.extend(errs)
        for out in outputs:
            tokens.setdefault(out.req_id, []).extend(out.new_token_ids)

    loop = StepLoop(scheduler, client, 2, on_outputs)
    for i in range(3):
        scheduler.add_request(Request(i, GOOD[i], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)))
    try:
        while loop.num_planned < 3:
            await loop.step()
        for req_id, params in bad.items():
            scheduler.add_request(Request(req_id, GOOD[1], params))
        scheduler.add_request(Request(3, GOOD[3], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)))
        await asyncio.wait_for(loop.run_until_idle(), 120)
    finally:
        await client.close()
    return tokens, errors, scheduler


def test_bad_rows_in_a_busy_batch_fail_alone(executor):
    reference, no_errors, _ = asyncio.run(_serve(executor, {}))
    assert not no_errors and sorted(reference) == [0, 1, 2, 3]
    assert all(len(t) == 12 for t in reference.values())
    tokens, errors, scheduler = asyncio.run(_serve(executor, BAD))
    assert tokens == reference  # token-exact: the bad rows changed nothing of the others
    assert sorted(req_id for req_id, _ in errors) == [10, 11]  # each once
    for _, error in errors:
        assert error.code == "INTERNAL" and error.message.startswith("internal error (error id ")
    assert not scheduler.requests and scheduler.num_free_blocks == scheduler.num_total_blocks
