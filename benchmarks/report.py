"""Prints the benchmark table from the JSON files run_all wrote."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import spec_bench, w8_fp8


def _load(out_dir: Path, name: str) -> dict:
    f = out_dir / f"{name}.json"
    return json.loads(f.read_text()) if f.exists() else {}


def _fmt(x, unit="", digits=2) -> str:
    if isinstance(x, (int, float)):
        return f"{x:,.{digits}f}{unit}"
    return str(x) if x is not None else "-"


def rows(out_dir: Path) -> list[tuple[str, str, str]]:
    """(what, figure, comparison) rows."""
    w4, full, peers, w5 = (_load(out_dir, n) for n in ("w4", "full", "peers", "w5"))
    r: list[tuple[str, str, str]] = []
    floor1 = w4.get("w4", [{}])[0].get("floor_ms") if w4.get("w4") else None
    s = w4.get("startup")
    if s:
        r.append(("start-up: graph capture", _fmt(s["capture_s"], " s", 1),
                  f"pool {_fmt(s['graph_pool_mib'], ' MiB', 0)}, {len(s['sizes'])} sizes (target <=10 s, <=512 MiB)"))
    first = _load(out_dir, "first")
    for start in ("fresh", "restart"):
        f = first.get(start)
        if f:
            warm, one = first["fresh"]["warm"], f["first"]
            r.append((f"start-up, {start} cache: serving after", _fmt(f["start_s"], " s", 1),
                      f"capture {_fmt(f['capture_s'], ' s', 1)}; Triton compiled {f['compiled']} ({f['from_disk']} from disk)"
                      " (target capture <=10 s fresh, <=5 s restart)"))
            r.append((f"first run after a {start} start / warm", f"W1 {warm['w1']['tpot_ms'] / one['w1']['tpot_ms']:.2f}x",
                      f"W2 {one['w2']['tok_s'] / warm['w2']['tok_s']:.2f}x, W3 {one['w3']['tok_s'] / warm['w3']['tok_s']:.2f}x"
                      " (target >=0.9x)"))
    for row in w4.get("w4", []):
        g, e, f = row["graph_step_ms"], row["eager_step_ms"], row["floor_ms"]
        r.append((f"W4 decode step b={row['batch']} ctx={row['context']}",
                  f"graph {_fmt(g, ' ms', 3)} (dev {_fmt(row['graph_device_ms'], '', 3)})",
                  f"{g / f:.2f}x floor {f:.3f} ms; eager {e:.3f} ms = {e / g:.1f}x graph"))
    hf = peers.get("w1", {})
    for key, label in (("overlap_on", "on"), ("before", "as before issue 12"), ("overlap_off", "off")):
        w1 = full.get(key, {}).get("w1")
        if w1:
            cmp = f"{w1['tpot_ms'] / floor1:.2f}x floor" if floor1 else ""
            if hf:
                cmp += f"; HF eager {hf['hf_eager']:.2f}, static {hf['hf_static']:.2f} ms"
            r.append((f"W1 TPOT full system, overlap {label}", _fmt(w1["tpot_ms"], " ms", 3), cmp + " (target 0.70)"))
    for key in ("inproc_w1_overlap1", "inproc_w1_overlap0"):
        if key in w4:
            r.append((f"W1 TPOT in-process, overlap {key[-1]}", _fmt(w4[key]["tpot_ms"], " ms", 3), ""))
    cb = peers.get("w3_cb_default"), peers.get("w3_cb_cuda_graph")
    w3 = full.get("overlap_on", {}).get("w3")
    if w3:
        best = max((x for x in cb if isinstance(x, (int, float))), default=None)
        ratio = f"{w3['tok_s'] / best:.1f}x best HF CB" if best else ""
        r.append(("W3 tok/s full system", _fmt(w3["tok_s"], "", 0),
                  f"{ratio}; HF CB {_fmt(cb[0], '', 0)} / graphs {_fmt(cb[1], '', 0)} (target 10x)"))
    inproc = w4.get("inproc_w2_overlap1", {}).get("tok_s")
    for key, label in (("overlap_on", "on"), ("before", "as before issue 12"), ("overlap_off", "off")):
        w2 = full.get(key, {}).get("w2")
        if w2:
            cmp = f"{w2['tok_s'] / inproc:.0%} of in-process" if inproc else ""
            r.append((f"W2 tok/s full system, overlap {label}", _fmt(w2["tok_s"], "", 0),
                      f"{cmp}; GPU busy {w2['busy']:.0%} (targets 50k, 95%, 95%)"))
    r += _timing_rows(full)
    for key in ("inproc_w2_overlap1", "inproc_w2_overlap0"):
        if key in w4:
            r.append((f"W2 tok/s in-process, overlap {key[-1]}", _fmt(w4[key]["tok_s"], "", 0),
                      f"GPU busy {w4[key]['busy']:.0%}"))
    for suffix, what in (("_c16", "16 requests"), ("", "saturation")):
        for total, target in (("128", 26), ("512", 35), ("2048", 45)):
            row = w5.get(f"total{total}{suffix}")
            if row:
                r.append((f"W5 llama2-7b {total} tokens/request, {what}", f"{row['graph']:.1f} req/s graph",
                          f"eager {row['eager']:.1f} req/s: {row['gain']:+.0%} (article +{target}%)"))
    r += _smol_rows(_load(out_dir, "smol"))
    w7 = _load(out_dir, "w7")
    for mode in ("caching_on", "caching_off"):
        m = w7.get(mode)
        if m:
            r.append((f"W7 multi-turn chat, prefix {mode.replace('_', ' ')}",
                      f"TTFT p50 {m['ttft_p50_ms']:.1f} / p99 {m['ttft_p99_ms']:.1f} ms",
                      f"{m['tokens_per_s']:,.0f} tok/s; hit rate {m['prefix_cache_hit_rate']:.1%}"))
    if w7.get("ttft_p50_speedup"):
        r.append(("W7 TTFT p50 off / on", f"{w7['ttft_p50_speedup']:.1f}x", "targets: hit rate >= 85%, >= 4x"))
    r += _w2ab_rows(_load(out_dir, "w2ab"))
    r += _w2so_rows(_load(out_dir, "w2so"))
    r += _ab_rows(_load(out_dir, "ab"))
    r += _w6_rows(_load(out_dir, "w6"))
    r += w8_fp8.rows(_load(out_dir, "w8"), full)
    r += spec_bench.rows(_load(out_dir, "spec"))
    r += _intake_rows(_load(out_dir, "intake"))
    r += _det_rows(_load(out_dir, "det"), _load(out_dir, "detcost"))
    return r


def _timing_rows(full: dict) -> list[tuple[str, str, str]]:
    """Where a step's time went (µs per step, both sides of the step stream), W1 and W2."""
    r = []
    for key, label in (("overlap_on", "now"), ("before", "before")):
        for name in ("w1", "w2"):
            p = full.get(key, {}).get(name, {}).get("per_step")
            if p:
                r.append((f"{name.upper()} per step ({label}): device / idle", f"{p['device_us']:.0f} / {p['device_idle_us']:.0f} us",
                          f"executor queued {p['executor_queued_us']:.0f}, launch {p['executor_launch_us']:.0f}; "
                          f"scheduler schedule {p['schedule_us']:.0f}, apply {p['apply_us']:.0f}, "
                          f"wait {p['result_wait_us']:.0f} us"))
    return r


def _w6_rows(w6: dict) -> list[tuple[str, str, str]]:
    """W6 serving benchmark: one row per arrival rate (benchmarks/serving.py)."""
    r = []
    for x in w6.get("rates", []):
        rate = "burst" if x["rate"] == float("inf") else f"{x['rate']:g} req/s"
        failed = f"; {x['failed']} failed" if x["failed"] else ""
        r.append((f"W6 serving, {rate}, {x['num_requests']} requests",
                  f"{x['output_throughput']:,.0f} out tok/s, goodput {x['goodput']:.1f} req/s ({x['goodput_share']:.0%})",
                  f"TTFT p50/p99 {_fmt(x['ttft_p50_ms'], '', 1)}/{_fmt(x['ttft_p99_ms'], ' ms', 1)}, "
                  f"TPOT {_fmt(x['tpot_p50_ms'], '', 1)}/{_fmt(x['tpot_p99_ms'], ' ms', 1)}, "
                  f"ITL p99 {_fmt(x['itl_p99_ms'], ' ms', 1)}{failed}"))
    return r


def _w2ab_rows(w2ab: dict) -> list[tuple[str, str, str]]:
    """W2 features off: new vs old (all runs of each, alternating); features on: cost vs off."""
    rows = [x for x in w2ab.get("rows", []) if "off" in x]
    runs = {label: [v for x in rows if x["tree"] == label for v in x["off"]] for label in ("old", "new")}
    r = []
    if runs["old"] and runs["new"]:
        old, new = statistics.median(runs["old"]), statistics.median(runs["new"])
        r.append(("W2 in-process, sampling features off: new vs old", f"{new / old - 1:+.1%}",
                  f"median {new:,.0f} vs {old:,.0f} tok/s over {len(runs['new'])}/{len(runs['old'])} runs (target >= -2%)"))
    feat = next((x for x in rows if "logprobs5" in x), None)
    if feat:
        base = feat["off_median"]  # the same process's runs with the features off
        for key, name in (("logprobs5", "logprobs top-5"), ("penalties", "3 penalties")):
            r.append((f"W2 in-process, {name} on every request", f"{feat[key + '_median'] / base - 1:+.1%}",
                      f"{feat[key + '_median']:,.0f} tok/s vs {base:,.0f} off"))
    return r


def _w2so_rows(w2so: dict) -> list[tuple[str, str, str]]:
    """W2 with structured outputs: 1 in 8 and every request constrained, against none."""
    m = w2so.get("medians")
    if not m:
        return [("W2 structured outputs", "failed", w2so.get("error", "")[-200:])] if w2so else []
    return [(f"W2 in-process, {what} with a JSON schema", f"{-w2so[key]:+.1%}",
             f"median {m[name]:,.0f} vs {m['none_as_' + name]:,.0f} tok/s unconstrained at the same "
             f"lengths (W2 itself {m['none']:,.0f}; target >= -{target}%)")
            for what, key, name, target in (("1 in 8 requests", "loss_one_in_8", "one_in_8", 10),
                                            ("every request", "loss_all", "all", 25))]


def _ab_rows(ab: dict) -> list[tuple[str, str, str]]:
    """Both services, old tree vs this one alternating: medians, the new/old ratio, and the
    host's per-step figures (executor launch, scheduler schedule + apply, device idle)."""
    ok = [x for x in ab.get("rows", []) if "w1" in x]
    r = []
    for name, key, unit, fmt in (("w1", "tpot_ms", "ms TPOT", ".3f"), ("w2", "tok_s", "tok/s", ",.0f"),
                                 ("w3", "tok_s", "tok/s", ",.0f")):
        med = {}
        for label in ("old", "new"):
            runs = [x[name] for x in ok if x["tree"] == label and name in x]
            if runs:
                step = [x.get("per_step") or {} for x in runs]
                host = {k: statistics.median(p.get(k, 0) for p in step)
                        for k in ("executor_launch_us", "schedule_us", "apply_us", "device_idle_us", "device_us")}
                med[label] = (statistics.median(x[key] for x in runs), host)
        if len(med) < 2:
            continue
        (o, ho), (n, hn) = med["old"], med["new"]
        r.append((f"A-B {name.upper()} {unit} new / old", f"{n / o:.3f}x", f"{n:{fmt}} vs {o:{fmt}}"))
        r.append((f"A-B {name.upper()} per step new / old", "launch / sched+apply / idle / device us",
                  " vs ".join(f"{h['executor_launch_us']:.0f} / {h['schedule_us'] + h['apply_us']:.0f} / "
                              f"{h['device_idle_us']:.0f} / {h['device_us']:.0f}" for h in (hn, ho))))
    return r


def _smol_rows(smol: dict) -> list[tuple[str, str, str]]:
    r = []
    a = smol.get("agreement")
    if a:
        r.append(("SmolLM2-135M bf16 teacher-forced top-1 vs fp32 CPU", f"{a['rate']:.2%}",
                  f"{a['agree']}/{a['total']} tokens (target 99%); graphs == eager: {smol.get('graph_equals_eager')}"))
    for name in ("w1", "w3"):
        w = smol.get("overlap_on", {}).get(name)
        if w:
            figure = _fmt(w["tpot_ms"], " ms TPOT", 3) if name == "w1" else _fmt(w["tok_s"], " tok/s", 0)
            r.append((f"SmolLM2-135M {name.upper()} full system", figure, f"GPU busy {w['busy']:.0%}"))
    return r


def print_table(out_dir: Path) -> None:
    table = rows(out_dir)
    w = [max(len(x[i]) for x in table) if table else 0 for i in range(3)]
    print()
    for a, b, c in table:
        print(f"{a:<{w[0]}} | {b:<{w[1]}} | {c}")


def _intake_rows(intake: dict) -> list[tuple[str, str, str]]:
    """W3 against the fake executor, pacing on and off: tok/s, steps, TTFT p90 per run."""
    out = []
    for pacing in ("on", "off"):
        rows = [x for x in intake.get("rows", []) if x.get("pacing") == pacing]
        if rows:
            out.append((f"W3 intake, fake executor 1.5 ms, pacing {pacing}",
                        " / ".join(f"{x['tok_s']:,.0f}" for x in rows) + " tok/s",
                        "steps " + " / ".join(str(x["steps"]) for x in rows) + "; TTFT p90 "
                        + " / ".join(f"{x['ttft_ms'][1]:.0f}" for x in rows) + " ms (~270 steps: all in at once)"))
    return out


def _det_rows(det: dict, cost: dict) -> list[tuple[str, str, str]]:
    """Issue 28: held-out answers differing from the request alone; --deterministic's cost."""
    r = []
    for mode in ("default", "deterministic"):
        d = det.get(mode)
        if d:
            r.append((f"held-out SmolLM2 answers differing, {mode}", f"{d['together']}/{d['requests']} together",
                      f"cached {d['alone_again_cached']}, speculation alone {d['spec_alone']}, "
                      f"together {d['spec_together']}; passage with speculation differs "
                      f"{d.get('passage_spec_differs', '-')} (target 0 in deterministic mode)"))
    rows = cost.get("rows", [])
    for name, key, unit in (("W1 TPOT", "tpot_ms", " ms"), ("W3", "tok_s", " tok/s"), ("W2", "tok_s", " tok/s")):
        w = name.split()[0].lower()
        by_mode = {m: [x[w][key] for x in rows if x["mode"] == m] for m in ("default", "deterministic")}
        if all(by_mode.values()):
            a, b = statistics.median(by_mode["default"]), statistics.median(by_mode["deterministic"])
            cost_ = b / a - 1 if key == "tpot_ms" else a / b - 1
            r.append((f"{name} --deterministic vs default", f"{_fmt(b, unit, 3 if key == 'tpot_ms' else 0)}",
                      f"default {_fmt(a, unit, 3 if key == 'tpot_ms' else 0)}: cost {cost_:+.1%} (default if <= 10%)"))
    return r
