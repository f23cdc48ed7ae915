"""Issue 15: W1 with n-gram speculation on a repetitive real-text task. The model is asked (its
chat template, through the Tokenize RPC) to repeat a ~300-token English passage verbatim; greedy,
EOS ignored, 256 output tokens; at batch 1 and batch 64 (all sent at once), through both
services with and without `--speculative-config` (SPEC_CONFIG). Per batch and mode: TPOT
median, tok/s, TTFT, steps, and the scheduler's spec_decode counters (its Prometheus metrics,
`--metrics-port`, before and after); and whether the greedy outputs with and without
speculation are identical (a mismatch is reported, never raised). docs/benchmarks.md,
"Speculative decoding benchmark (method)".

With `draft` (a model folder sharing the target's tokenizer) the "on" mode is draft-model
speculation instead (draft_config(draft), given to both services); the suite measures a
SmolLM2-135M-shaped random draft for a llama-1b-shaped random target that way (random weights:
acceptance is near zero, so it measures what drafting costs, not what it can save).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from benchmarks.harness import _per_step

SPEC_CONFIG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
INSTRUCTION = "Repeat the following passage exactly, word for word, with nothing before or after it.\n\n"
PASSAGE = (
    "The old lighthouse stood at the edge of the northern cliffs for more than two hundred years. "
    "Every evening, the keeper climbed the one hundred and twelve steps of its narrow spiral stair, "
    "carrying a can of oil and a cloth for the great glass lens. From the lamp room he could see the "
    "whole bay: the fishing boats returning with the tide, the gulls circling above the harbour, and "
    "the dark line of the forest that ran along the coast towards the town. In winter the storms came "
    "from the west, and the waves broke so high against the rocks that the spray reached the windows "
    "of the keeper's cottage. On those nights he did not sleep at all. He sat by the lamp, trimmed the "
    "wick, wound the clockwork that turned the lens, and wrote in his logbook the hour, the wind, the "
    "state of the sea, and the name of every ship that passed. When the lighthouse was finally "
    "automated, the logbooks were sent to the museum in the town, where they fill three long shelves. "
    "Visitors still read them today. Most of the entries are short and plain, but now and then the "
    "keeper added a line of his own: a note about the colour of the sky at dawn, a seal asleep on the "
    "landing stage, or the first swallow of the spring, seen on the same morning every year."
)


def draft_config(draft: Path, k: int = 4) -> dict:
    """--speculative-config of draft-model speculation with the draft at `draft`."""
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}


def chat_prompt(stub, passage: str) -> list[int]:
    """The repeat-this-passage request as token ids, rendered by the server's chat template."""
    from protos.llmserve.v1 import llmserve_pb2 as pb

    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=INSTRUCTION + passage)])
    return list(stub.Tokenize(pb.TokenizeRequest(chat=chat), timeout=30).token_ids)


def read_counters(port: int) -> dict[str, float]:
    """The spec_decode counters from the scheduler's Prometheus endpoint (0 when absent)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for name in COUNTERS:
        prefix = f"llmserve:{name}_total"
        line = next((x for x in text.splitlines()
                     if x.startswith(prefix) and x[len(prefix):len(prefix) + 1] in (" ", "{")), None)
        out[name] = float(line.split()[-1]) if line else 0.0
    return out


async def _one(stub, prompt: list[int], max_tokens: int, t0: float):
    from protos.llmserve.v1 import llmserve_pb2 as pb

    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt), params=pb.SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    ids, times = [], []
    async for msg in stub.Generate(req):
        now = time.perf_counter()
        ids += msg.token_ids
        times += [now] * len(msg.token_ids)
    tpot = (times[-1] - times[0]) / (len(ids) - 1) if len(ids) > 1 else 0.0
    return ids, (times[0] - t0) if times else 0.0, tpot


async def _batch(address: str, prompt: list[int], batch: int, max_tokens: int):
    import asyncio

    import grpc

    from protos.llmserve.v1 import llmserve_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.LLMServeStub(channel)
        t0 = time.perf_counter()
        results = await asyncio.gather(*[_one(stub, prompt, max_tokens, t0) for _ in range(batch)])
        return results, time.perf_counter() - t0


def measure(cluster, port: int, prompt: list[int], batch: int, max_tokens: int) -> tuple[dict, list[list[int]]]:
    """One batch through a running cluster: its figures and its output token ids."""
    import asyncio

    before, status = read_counters(port), cluster.status()
    results, wall = asyncio.run(_batch(cluster.address, prompt, batch, max_tokens))
    after, status_after = read_counters(port), cluster.wait_idle()
    d = {name: after[name] - before[name] for name in COUNTERS}
    drafts, proposed, accepted = (d[name] for name in COUNTERS)
    tokens = sum(len(ids) for ids, _, _ in results)
    figures = dict(
        batch=batch, prompt_tokens=len(prompt), tokens=tokens, wall_s=wall, tok_s=tokens / wall,
        tpot_ms=1e3 * statistics.median(t for _, _, t in results),
        ttft_ms=1e3 * statistics.median(t for _, t, _ in results),
        steps=status_after.num_steps - status.num_steps, num_drafts=drafts, num_draft_tokens=proposed,
        num_accepted_tokens=accepted, acceptance_rate=accepted / proposed if proposed else None,
        # vLLM's mean acceptance length: tokens a verify step yields (its accepted drafts + 1)
        acceptance_length=1 + accepted / drafts if drafts else None,
        per_step=_per_step(status, status_after))  # µs a step on both sides of the stream
    return figures, [ids for ids, _, _ in results]


def _compare(off: list[list[int]], on: list[list[int]]) -> dict:
    """Greedy outputs off vs on: how many requests differ and the first differing position."""
    common = min(len(off), len(on))
    bad = [i for i in range(common) if off[i] != on[i]] + list(range(common, max(len(off), len(on))))
    first = None
    if bad and bad[0] < common:
        a, b = off[bad[0]], on[bad[0]]
        first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return dict(equal=not bad, mismatched_requests=len(bad), first_mismatch_position=first)


def run(out: dict, log_dir: Path, model_folder: Path, device: str, *, passage: str = PASSAGE,
        max_tokens: int = 256, batches: tuple[int, ...] = (1, 64), executor_args: tuple[str, ...] = (),
        draft: Path | None = None) -> None:
    """Fills `out`: "off" / "on" -> "b<batch>" -> figures, "outputs" -> "b<batch>" -> the
    comparison, "tpot_speedup" / "tok_s_ratio" -> "b<batch>" (off / on and on / off), and
    "config", "sample_text" (the start of the batch-1 output without speculation). draft: a
    draft model folder, for draft-model speculation instead of n-gram."""
    from benchmarks.cluster import Cluster, free_port
    from protos.llmserve.v1 import llmserve_pb2 as pb

    spec = SPEC_CONFIG if draft is None else draft_config(draft)
    out["config"] = dict(spec, max_tokens=max_tokens, batches=list(batches), device=device,
                         model=str(model_folder), **({} if draft is None else {"draft": str(draft)}))
    outputs: dict[str, dict[int, list[list[int]]]] = {}
    for mode in ("off", "on"):
        port = free_port()
        args, extra = ["--metrics-port", str(port)], []
        if mode == "on":
            args += ["--speculative-config", json.dumps(spec)]
            extra = [] if draft is None else ["--speculative-config", json.dumps(spec)]  # the executor loads it
        cluster = Cluster(model_folder, log_dir / mode, ["--device", device, *executor_args, *extra], args,
                          timeout=600)
        try:
            prompt = chat_prompt(cluster.stub, passage)
            measure(cluster, port, prompt, 1, 8)  # warm-up
            out[mode], outputs[mode] = {}, {}
            for b in batches:
                out[mode][f"b{b}"], outputs[mode][b] = measure(cluster, port, prompt, b, max_tokens)
            if mode == "off":
                first = outputs["off"][batches[0]][0]
                text = cluster.stub.Detokenize(pb.DetokenizeRequest(token_ids=first), timeout=30).text
                out["sample_text"] = text[:400]
        finally:
            cluster.stop()
    out["outputs"] = {f"b{b}": _compare(outputs["off"][b], outputs["on"][b]) for b in batches}
    out["tpot_speedup"] = {f"b{b}": out["off"][f"b{b}"]["tpot_ms"] / out["on"][f"b{b}"]["tpot_ms"]
                           if out["on"][f"b{b}"]["tpot_ms"] else None for b in batches}
    out["tok_s_ratio"] = {f"b{b}": out["on"][f"b{b}"]["tok_s"] / out["off"][f"b{b}"]["tok_s"] for b in batches}


def rows(spec: dict) -> list[tuple[str, str, str]]:
    """Report rows (benchmarks/report.py): TPOT and tok/s with vs without, acceptance, outputs;
    n-gram (the top level) then draft-model speculation (spec["draft_model"], when run)."""
    r = _rows(spec, "n-gram repeat-passage", "target >= 1.8x", "target: no slowdown")
    draft = spec.get("draft_model")
    if draft:
        r += _rows(draft, "draft-model (SmolLM2-135M shape -> llama-1b shape, random)",
                   "random weights: the cost of drafting", "random weights: the cost of drafting")
    return r


def _rows(spec: dict, label: str, target_b1: str, target_bn: str) -> list[tuple[str, str, str]]:
    r = []
    for key, on in spec.get("on", {}).items():
        off = spec.get("off", {}).get(key)
        if not off:
            continue
        same = spec.get("outputs", {}).get(key, {})
        eq = "equal" if same.get("equal") else (f"{same.get('mismatched_requests')} differ "
                                                f"(from token {same.get('first_mismatch_position')})")
        length, rate = on.get("acceptance_length"), on.get("acceptance_rate")
        acc = f"acceptance length {length:.2f}, rate {rate:.0%}" if length and rate is not None else "no drafts"
        target = target_b1 if on["batch"] == 1 else target_bn
        r.append((f"Spec {label} b={on['batch']} TPOT on / off",
                  f"{on['tpot_ms']:.3f} / {off['tpot_ms']:.3f} ms",
                  f"{off['tpot_ms'] / on['tpot_ms']:.2f}x lower ({target}); {acc}; greedy outputs {eq}"))
        r.append((f"Spec {label} b={on['batch']} tok/s on / off",
                  f"{on['tok_s']:,.0f} / {off['tok_s']:,.0f}",
                  f"{on['tok_s'] / off['tok_s']:.2f}x; steps {on['steps']} / {off['steps']}"))
    return r
