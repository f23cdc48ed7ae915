"""A stand-in executor for measuring the scheduler alone: every step takes a fixed time.

It follows the step-plan protocol (rows sample when their chunk reaches the end of the tokens
the scheduler sent; decode rows carry none) and answers each plan after `--step-ms`, keeping
one plan queued like the real executor, so the scheduler process's own ceiling can be measured
on any CPU machine:  python -m benchmarks.fake_executor --model DIR --port 50061 --step-ms 4
"""

from __future__ import annotations

import argparse
import asyncio

import grpc

from protos.llmserve.executor.v1 import executor_pb2 as pb
from protos.llmserve.executor.v1 import executor_pb2_grpc as pb_grpc


class FakeExecutor(pb_grpc.ExecutorServicer):
    def __init__(self, model: str, step_s: float, vocab_size: int = 1024, max_num_seqs: int = 256):
        self.model, self.step_s, self.vocab, self.max_num_seqs = model, step_s, vocab_size, max_num_seqs
        self.known: dict[int, int] = {}  # req_id -> tokens the scheduler sent
        self.computed: dict[int, int] = {}

    async def Handshake(self, request, context):
        return pb.ExecutorInfo(
            model_name="fake", model_path=self.model, vocab_size=self.vocab, eos_token_ids=[1],
            max_model_len=4096, block_size=16, num_blocks=100_000, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=8192, device="cpu", dtype="none")

    async def Reset(self, request, context):
        self.known.clear()
        self.computed.clear()
        return pb.ResetResponse()

    def _run(self, plan: pb.StepPlan) -> pb.StepResult:
        for req_id in (*plan.finished_req_ids, *plan.preempted_req_ids):
            self.known.pop(req_id, None)
            self.computed.pop(req_id, None)
        rows = [(r.req_id, r.num_scheduled_tokens) for r in plan.new_requests]
        for r in plan.new_requests:
            self.known[r.req_id], self.computed[r.req_id] = len(r.token_ids), r.num_computed_tokens
        c = plan.cached_requests  # columns; block ids do not matter here
        rows += zip(c.req_ids, c.num_scheduled_tokens)
        result = pb.StepResult(step_id=plan.step_id, forward_us=int(self.step_s * 1e6))
        for req_id, n in rows:
            self.computed[req_id] += n
            if self.computed[req_id] >= self.known[req_id]:
                result.req_ids.append(req_id)
                result.token_ids.append(3 + (req_id * 7 + self.computed[req_id]) % (self.vocab - 3))
        return result

    async def Execute(self, request_iterator, context):
        busy_until = asyncio.get_running_loop().time()
        async for plan in request_iterator:  # steps run back to back, like a busy GPU
            loop = asyncio.get_running_loop()
            busy_until = max(busy_until, loop.time()) + self.step_s
            result = self._run(plan)
            await asyncio.sleep(max(0.0, busy_until - loop.time()))
            yield result


async def serve(model: str, port: int, step_ms: float, max_num_seqs: int = 256) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExecutorServicer_to_server(FakeExecutor(model, step_ms / 1e3, max_num_seqs=max_num_seqs), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="folder with the tokenizer the scheduler loads")
    p.add_argument("--port", type=int, default=50061)
    p.add_argument("--step-ms", type=float, default=4.0)
    p.add_argument("--max-num-seqs", type=int, default=256, help="rows a step may hold (the handshake's)")
    args = p.parse_args()
    asyncio.run(serve(args.model, args.port, args.step_ms, args.max_num_seqs))


if __name__ == "__main__":
    main()
