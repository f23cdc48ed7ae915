"""Issue 28 on the GPU: what --deterministic changes and what it costs (run_all sections det and
detcost).

held_out(): the built-in SmolLM2 in bf16, default mode and --deterministic. Each mode sends the
12 held-out chat/edit requests (benchmarks/determinism.HELD_OUT, greedy, 64 tokens) one at a
time (the reference), again one at a time (prefix-cache hits), all 12 at once, and one at a time
and all at once to a cluster with n-gram speculation on; each case counts the requests whose
tokens differ from the reference. On chat prompts n-gram speculation seldom drafts, so each mode
also sends spec_bench's repeat-a-passage request (128 tokens) with and without speculation
(`passage_spec_differs`: 1 if the tokens differ, and the drafts accepted).

cost(): W1, W3, W2 through both services on llama-1b, default and --deterministic alternating
twice (A-B-A-B), each cluster started afresh.
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
MODES = {"default": [], "deterministic": ["--deterministic"]}


def _differ(stub, prompts, reference, together: bool) -> int:
    from benchmarks.determinism import answer

    def one(p):
        return answer(stub, p, "greedy", 64, logprobs=False)[0]

    if together:
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(one, prompts))
    else:
        got = [one(p) for p in prompts]
    return sum(g != r for g, r in zip(got, reference))


def held_out(out: dict, log_dir: Path, folder: Path) -> None:
    from benchmarks.cluster import Cluster, free_port
    from benchmarks.determinism import HELD_OUT, answer, counters
    from benchmarks.spec_bench import INSTRUCTION, PASSAGE
    from scheduler_svc.core.tokenizer import Tokenizer

    tok = Tokenizer(folder)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in HELD_OUT]
    passage = tok.apply_chat_template([{"role": "user", "content": INSTRUCTION + PASSAGE}])
    for mode, flags in MODES.items():
        row = out[mode] = {"requests": len(prompts)}
        cluster = Cluster(folder, log_dir / mode, ["--device", "cuda", *flags], [], timeout=300)
        try:
            reference = [answer(cluster.stub, p, "greedy", 64, logprobs=False)[0] for p in prompts]
            row["alone_again_cached"] = _differ(cluster.stub, prompts, reference, False)
            row["together"] = _differ(cluster.stub, prompts, reference, True)
            passage_off = answer(cluster.stub, passage, "greedy", 128, logprobs=False)[0]
        finally:
            cluster.stop()
        port = free_port()
        cluster = Cluster(folder, log_dir / f"{mode}-spec", ["--device", "cuda", *flags],
                          ["--speculative-config", SPEC, "--metrics-port", str(port)], timeout=300)
        try:
            row["spec_alone"] = _differ(cluster.stub, prompts, reference, False)
            row["spec_together"] = _differ(cluster.stub, prompts, reference, True)
            accepted = counters(port)["llmserve:spec_decode_num_accepted_tokens_total"]
            row["passage_spec_differs"] = int(answer(cluster.stub, passage, "greedy", 128, logprobs=False)[0] != passage_off)
            row["passage_accepted"] = counters(port)["llmserve:spec_decode_num_accepted_tokens_total"] - accepted
        finally:
            cluster.stop()
        print(f"held-out {mode}: differing of {len(prompts)}: cached {row['alone_again_cached']}, "
              f"together {row['together']}, spec alone {row['spec_alone']}, spec together {row['spec_together']}; "
              f"passage with speculation differs {row['passage_spec_differs']} ({row['passage_accepted']:.0f} drafts accepted)",
              flush=True)


def cost(out: dict, log_dir: Path, model: Path, rounds: int = 2) -> None:
    from benchmarks import workloads
    from benchmarks.harness import _full_system_run

    loads = {"w1": (workloads.w1(), 0.0), "w3": (workloads.w3(), 0.0), "w2": (workloads.w2(), 0.6)}
    out["rows"] = []
    for r in range(rounds):
        for mode, flags in MODES.items():
            row = {"mode": mode, "round": r, **_full_system_run(model, log_dir / f"{mode}{r}", [], loads, tuple(flags))}
            out["rows"].append(row)
            print(f"{mode} round {r}: W1 TPOT {row['w1']['tpot_ms']:.3f} ms, W3 {row['w3']['tok_s']:.0f} tok/s, "
                  f"W2 {row['w2']['tok_s']:.0f} tok/s", flush=True)
