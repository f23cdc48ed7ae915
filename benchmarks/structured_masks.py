"""Structured outputs on the built-in model's vocabulary (SmolLM2, 49,152 ids): compile time
(cold and cached), per-token mask and consume times along random walks through every grammar
of tests/data/structured, masks of a batch filled at once, and whether a compile drops the GIL.

    python -m benchmarks.structured_masks [--tokenizer FOLDER] [--walks 4] [--out file.json]

Without --tokenizer the built-in GGUF is converted once into a temporary cache (needs torch).
Figures: docs/scheduler.md, "Structured outputs".
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.structured_walk import Vocab, corpus, walk
from llmserve import structured as st
from llmserve.structured.matcher import BatchMasks, allowed_ids, new_bitmask


def builtin_folder() -> Path:
    import torch

    from executor_svc.model_loader.gguf import converted_folder
    from executor_svc.model_loader.source import builtin_gguf

    return converted_folder(builtin_gguf(), Path(tempfile.mkdtemp()), torch.float32)


def specs() -> list[tuple[str, st.Constraint]]:
    out = [(f"json:{e['name']}", st.json_schema(e["schema"], "json")) for e in corpus("schemas")]
    out += [(f"regex:{e['name']}", st.regex(e["regex"], "regex")) for e in corpus("regexes")]
    out += [(f"choice:{e['name']}", st.choice(e["choices"], "choice")) for e in corpus("choices")]
    return out + [(f"grammar:{e['name']}", st.grammar(e["grammar"], "grammar")) for e in corpus("grammars")]


def pct(xs: list[float]) -> dict:
    a = np.array(xs) * 1e6
    return {"n": len(xs), "p50_us": round(float(np.percentile(a, 50)), 1),
            "p99_us": round(float(np.percentile(a, 99)), 1), "max_us": round(float(a.max()), 1),
            "mean_us": round(float(a.mean()), 1)}


class TimedMatcher:
    """A Matcher whose fill_bitmask and consume are timed (the walk calls them)."""

    def __init__(self, m: st.Matcher, masks: list, consumes: list, first: list):
        self.m, self.masks, self.consumes, self.first = m, masks, consumes, first
        self.vocab_size, self.steps = m.vocab_size, 0

    def fill_bitmask(self, out, row=0):
        t = time.perf_counter()
        self.m.fill_bitmask(out, row)
        (self.first if self.steps == 0 else self.masks).append(time.perf_counter() - t)
        self.steps += 1

    def consume(self, ids):
        t = time.perf_counter()
        ok = self.m.consume(ids)
        self.consumes.append(time.perf_counter() - t)
        return ok

    def is_stopped(self):
        return self.m.is_stopped()

    @property
    def error(self):
        return self.m.error


def gil_check(compiler: st.GrammarCompiler) -> dict:
    """A 2,000-property schema compiled while a Python thread counts: the count moves."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(2000)}}
    count, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    time.sleep(0.2)
    before, start = count[0], time.perf_counter()
    base_rate = before / 0.2
    try:
        compiler.compile(st.json_schema(schema, "json"))
    except st.ConstraintError:
        pass
    elapsed, during = time.perf_counter() - start, count[0] - before
    stop.set()
    spinner.join()
    return {"compile_s": round(elapsed, 3), "python_thread_rate_during": round(during / elapsed / base_rate, 2)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default="", help="a tokenizer folder (default: the built-in model's)")
    p.add_argument("--walks", type=int, default=4)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    from scheduler_svc.core.tokenizer import Tokenizer

    tok = Tokenizer(args.tokenizer or builtin_folder())
    vocab_size = tok.vocab_size
    t = time.perf_counter()
    ll = st.ll_tokenizer(tok.hf.to_str(), vocab_size, tok.eos_token_ids)
    report: dict = {"vocab_size": vocab_size, "ll_tokenizer_s": round(time.perf_counter() - t, 3)}
    compiler = st.GrammarCompiler(ll, st.CompileLimits(timeout_s=30))
    vocab, rng = Vocab.of(tok, vocab_size), np.random.default_rng(0)
    cold, cached, copies, masks, firsts, consumes, per_kind, tokens = [], [], [], [], [], [], {}, 0
    compiled = []
    for name, spec in specs():
        t = time.perf_counter()
        grammar = compiler.compile(spec)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        compiler.compile(spec)
        cached.append(time.perf_counter() - t)
        kind_masks = per_kind.setdefault(name.split(":")[0], [])
        for _ in range(args.walks):
            t = time.perf_counter()
            m = grammar.matcher()
            copies.append(time.perf_counter() - t)
            start = len(masks)
            tokens += len(walk(TimedMatcher(m, masks, consumes, firsts), vocab, rng))
            kind_masks += masks[start:]
        compiled.append(grammar)
    report.update(num_grammars=len(compiled), num_tokens=tokens, compile_cold=pct(cold),
                  compile_cached=pct(cached), new_matcher=pct(copies), first_mask=pct(firsts),
                  mask=pct(masks), consume=pct(consumes),
                  mask_by_kind={k: pct(v) for k, v in per_kind.items()})
    report["batch_masks"] = batch_masks(compiled, vocab, rng)
    report["gil"] = gil_check(st.GrammarCompiler(ll, st.CompileLimits(timeout_s=60)))
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


def batch_masks(compiled: list, vocab: Vocab, rng: np.random.Generator) -> dict:
    """Rows of different grammars, each a few tokens in: their masks one by one (a loop on
    this thread) against all at once (BatchMasks)."""
    out = {}
    batch = BatchMasks()
    for rows in (8, 64, 256):
        matchers = []
        for i in range(rows):
            m = compiled[i % len(compiled)].matcher()
            mask = new_bitmask(1, vocab.size)
            for _ in range(int(rng.integers(0, 6))):
                m.fill_bitmask(mask)
                ids = allowed_ids(mask[0], vocab.size)
                ids = ids[~np.isin(ids, vocab.eos_ids)]
                if not ids.size:
                    break
                m.consume([int(rng.choice(ids))])
            matchers.append(m)
        mask = new_bitmask(rows, vocab.size)
        one, together = [], []
        for _ in range(20):
            t = time.perf_counter()
            for row, m in enumerate(matchers):
                m.fill_bitmask(mask, row)
            one.append(time.perf_counter() - t)
            t = time.perf_counter()
            batch.fill(list(zip(matchers, range(rows))), mask)
            together.append(time.perf_counter() - t)
        out[rows] = {"loop_us": round(float(np.median(one)) * 1e6), "batch_us": round(float(np.median(together)) * 1e6)}
    return out


if __name__ == "__main__":
    main()
