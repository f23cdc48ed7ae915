"""W2 in-process with structured outputs (issue 25's "Fast"): the same 256 requests with 1 in 8
carrying a JSON schema, and with every one carrying one, each against the same requests without
constraints run to exactly the lengths the constrained run produced (a constrained row ends
where its grammar does, often before W2's length: without the matched lengths the difference
would be the work left out, not the cost of the masks). Alternating (benchmarks/METHOD: the
variants in one run, interleaved); tok/s = output tokens / wall.

    python benchmarks/w2_structured.py [--reps N] [--model FOLDER]

The schemas are one string property each (8 distinct names, so 8 grammars): free text inside
JSON, where the mask allows most of the vocabulary and costs the matcher most per token. The
outputs that end (EOS) must validate. Constrained rows sample eagerly (docs/scheduler.md,
"Structured outputs"). Prints one JSON line (W2SO ...)."""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jsonschema  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from benchmarks import inprocess, workloads  # noqa: E402
from executor_svc.config import ExecutorConfig  # noqa: E402
from executor_svc.startup.build import build_runner  # noqa: E402
from llmserve.structured.constraint import json_schema, to_grammar  # noqa: E402
from scheduler_svc.core.request import Request, SamplingParams  # noqa: E402

SCHEMAS = [{"type": "object", "properties": {f"answer_{k}": {"type": "string"}},
            "required": [f"answer_{k}"], "additionalProperties": False} for k in range(8)]
CONSTRAINTS = [json_schema(s, "response_format.json_schema.schema") for s in SCHEMAS]
GRAMMARS = [to_grammar(c) for c in CONSTRAINTS]


def requests(every: int, num_requests: int = 256, lengths: dict | None = None) -> list[Request]:
    """W2's requests; every `every`-th one (0: none) carries a schema (and stops at its EOS);
    lengths: output lengths by request id instead of W2's."""
    out = []
    for i, (prompt, out_len) in enumerate(workloads.w2(num_requests)):
        k = i // every % 8 if every and i % every == 0 else None
        extra = {} if k is None else dict(constraint=CONSTRAINTS[k], grammar=GRAMMARS[k])
        out.append(Request(i + 1, list(prompt), SamplingParams(
            max_tokens=lengths[i + 1] if lengths else out_len, temperature=0.6, seed=i,
            ignore_eos=k is None, **extra)))
    return out


def run(runner, tokenizer, eos: set[int], every: int, num_requests: int = 256,
        lengths: dict | None = None) -> tuple[dict, dict]:
    """(figures, output length by request id)."""
    reqs = requests(every, num_requests, lengths)
    tokens, wall, busy = inprocess.run_requests(runner, reqs)  # a grammar failure raises there
    ended = valid = 0
    for r in reqs:
        ids = tokens[r.req_id]
        if r.params.constraint is not None and ids and ids[-1] in eos:
            ended += 1
            schema = SCHEMAS[GRAMMARS.index(r.params.grammar)]
            jsonschema.validate(json.loads(tokenizer.decode(ids[:-1], skip_special_tokens=False)), schema)
            valid += 1
    return dict(tok_s=round(sum(map(len, tokens.values())) / wall, 1), busy=round(busy, 3),
                tokens=sum(map(len, tokens.values())),
                constrained=sum(r.params.constraint is not None for r in reqs), ended=ended,
                valid=valid), {r: len(t) for r, t in tokens.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--model", default="/tmp/llmserve-bench/llama-1b")  # harness.model_path("llama-1b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--requests", type=int, default=256)  # fewer: a CPU smoke run
    args = p.parse_args()
    runner = build_runner(ExecutorConfig.from_args(["--model", args.model, "--device", args.device,
                                                    "--insecure-no-auth"]))
    tokenizer = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    eos = set(runner.info().eos_token_ids)
    inprocess.run_workload(runner, workloads.w2(min(64, args.requests)), temperature=0.6)  # warm-up
    run(runner, tokenizer, eos, 1, args.requests)  # and the grammars' first compile
    rows: dict[str, list] = {"none": [], "one_in_8": [], "none_as_one_in_8": [], "all": [], "none_as_all": []}
    for _ in range(args.reps):
        rows["none"].append(run(runner, tokenizer, eos, 0, args.requests)[0])
        for name, every in (("one_in_8", 8), ("all", 1)):
            figures, lengths = run(runner, tokenizer, eos, every, args.requests)
            rows[name].append(figures)
            rows["none_as_" + name].append(run(runner, tokenizer, eos, 0, args.requests, lengths)[0])
    medians = {k: statistics.median(x["tok_s"] for x in v) for k, v in rows.items()}
    print("W2SO " + json.dumps(dict(
        rows=rows, medians=medians,
        loss_one_in_8=round(1 - medians["one_in_8"] / medians["none_as_one_in_8"], 4),
        loss_all=round(1 - medians["all"] / medians["none_as_all"], 4))), flush=True)

if __name__ == "__main__":
    main()
