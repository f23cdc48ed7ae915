"""What clients that never read their streams cost a normal client, with the server's flags.

Starts the demo model (or --model), runs a normal client alone (back-to-back greedy streams),
then opens N gRPC streams on raw channels that never read a message and runs the normal client
again; prints both medians, their ratio, and how the never-reading streams ended.

    python -m benchmarks.slow_readers --hogs 50 [--seconds 15] [-- scheduler flags...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from benchmarks.cluster import Cluster, generate
from executor_svc.model_loader.random_model import demo_model_path
from protos.llmserve.v1 import llmserve_pb2 as pb
from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc


def normal_latencies(cluster: Cluster, seconds: float, max_tokens: int) -> list[float]:
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        ids, _, _ = generate(cluster.stub, prompt_ids=[9, 8, 7], max_tokens=max_tokens,
                             temperature=0.0, ignore_eos=True)
        assert len(ids) == max_tokens
        out.append(time.monotonic() - start)
    return out


# A client whose transport takes little unread: grpc's default client grows its stream window by
# BDP probing (a default channel took 4000 unread tokens, ~240 KB, without the server's write
# ever blocking), so the server cannot tell it from a reader until that window is full.
SMALL_WINDOW = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


def open_hogs(cluster: Cluster, n: int, max_tokens: int, small_window: bool = True):
    """n calls on n channels of their own, never read."""
    options = SMALL_WINDOW if small_window else []
    channels = [grpc.insecure_channel(cluster.address, options=options) for _ in range(n)]
    calls = [pb_grpc.LLMServeStub(ch).Generate(pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[5, 6, 7 + i % 50]), params=pb.SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True)), timeout=600)
        for i, ch in enumerate(channels)]
    return channels, calls


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hogs", type=int, default=50)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--max-tokens", type=int, default=32, help="tokens of each normal request")
    p.add_argument("--hog-tokens", type=int, default=4000)
    p.add_argument("--default-window", action="store_true",
                   help="hogs on default grpc channels (BDP-grown windows) instead of small ones")
    p.add_argument("--model", default="")
    p.add_argument("scheduler_args", nargs="*")
    a = p.parse_args()
    model = Path(a.model) if a.model else demo_model_path()
    with tempfile.TemporaryDirectory() as logs:
        cluster = Cluster(model, Path(logs), ["--device", "cpu"], a.scheduler_args)
        try:
            normal_latencies(cluster, 2, a.max_tokens)  # warm up
            alone = normal_latencies(cluster, a.seconds, a.max_tokens)
            start = time.monotonic()
            channels, calls = open_hogs(cluster, a.hogs, a.hog_tokens, not a.default_window)
            loaded = normal_latencies(cluster, a.seconds, a.max_tokens)
            s = cluster.status()
            print(f"after {time.monotonic() - start:.1f} s: running {s.num_running}, "
                  f"free blocks {s.free_blocks}/{s.total_blocks}")
            m0, m1 = statistics.median(alone), statistics.median(loaded)
            print(f"normal client alone: median {m0 * 1e3:.0f} ms ({len(alone)} requests); with "
                  f"{a.hogs} never-reading streams: median {m1 * 1e3:.0f} ms ({len(loaded)} requests,"
                  f" p90 {sorted(loaded)[int(0.9 * len(loaded))] * 1e3:.0f} ms); ratio {m1 / m0:.2f}")
            ends: dict[str, int] = {}
            for call in calls:
                if s.num_running:  # still running: the server did not cut them
                    call.cancel()
                try:
                    for _ in call:
                        pass
                    code = "OK"
                except grpc.RpcError as e:
                    code = e.code().name
                ends[code] = ends.get(code, 0) + 1
            for ch in channels:
                ch.close()
            print(f"the never-reading streams ended: {ends}")
            print("aborted (log lines):", cluster.logs().count("read too slowly"))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
