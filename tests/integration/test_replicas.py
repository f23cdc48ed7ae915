"""Replicas behind client-side load balancing (docs/deploy.md): a gRPC client with the
`round_robin` policy over two local scheduler+executor replicas gets every request served,
with the same tokens as one replica alone, and both replicas do part of the work."""

import json

import grpc

from benchmarks.cluster import generate
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc
from tests.integration.conftest import start_cluster

ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
PROMPT, MAX_TOKENS, NUM_REQUESTS = [3, 14, 15, 92, 65], 8, 8


def test_round_robin_client_uses_both_replicas(llama_cluster, model_dirs, tmp_path_factory):
    second = start_cluster(tmp_path_factory, model_dirs["llama"], "replica2")
    replicas = [llama_cluster, second]
    try:
        want = generate(llama_cluster.stub, prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)[0]
        assert len(want) == MAX_TOKENS

        before = [r.status().num_steps for r in replicas]
        target = "ipv4:" + ",".join(r.address for r in replicas)  # what DNS gives for a headless Service
        with grpc.insecure_channel(target, options=[("grpc.service_config", ROUND_ROBIN)]) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pb_grpc.LLMServeStub(channel)
            for _ in range(NUM_REQUESTS):
                assert generate(stub, prompt_ids=PROMPT, max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)[0] == want
        # a request takes at least MAX_TOKENS steps (1 prefill + 7 decode; planning ahead may add
        # one), and an idle replica takes none
        steps = [r.status().num_steps - b for r, b in zip(replicas, before)]
        assert sum(steps) >= NUM_REQUESTS * MAX_TOKENS, steps
        assert min(steps) >= 2 * MAX_TOKENS, f"round_robin left a replica (nearly) idle: {steps}"
    finally:
        second.stop()
