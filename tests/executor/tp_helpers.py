"""Runs a function on N gloo ranks (spawned processes) and collects what each returns; the
model-level greedy loop the tensor-parallel tests compare with one rank."""

from __future__ import annotations

import socket
import traceback
from datetime import timedelta

import torch

from executor_svc.models.attention import AttentionMetadata
from executor_svc.parallel.state import SINGLE, TensorParallel


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(rank: int, size: int, port: int) -> TensorParallel:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=60))
    return TensorParallel(rank, size, dist.group.WORLD, dist.group.WORLD)


def _rank_main(rank: int, size: int, port: int, fn, args, queue) -> None:
    torch.set_num_threads(1)
    try:
        result = fn(init_gloo(rank, size, port), *args)
        queue.put((rank, result, None))
    except BaseException:  # noqa: BLE001 - reported to the test
        queue.put((rank, None, traceback.format_exc()))


# What every rank imports, loaded once into the fork server (the forkserver context's preload).
_PRELOAD = ["torch", "torch.distributed", __name__, "tests.executor.conftest", "executor_svc.parallel.ranks",
            "executor_svc.model_loader.safetensors"]


def _rank_context():
    """Ranks forked from one server process that imported torch and the executor once per session:
    fresh processes each call, as spawned ones are, without each paying the imports again (with
    "spawn", ~2.5 s of CPU a rank: 5 s a two-rank call on 2 cores, 10 s a four-rank one)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # (a module that does not import is imported by the rank)
    return ctx


def run_ranks(size: int, fn, *args, timeout: float = 120.0) -> list:
    """fn(tp, *args) on `size` gloo ranks; the results in rank order (a failure raises)."""
    ctx = _rank_context()
    queue, port = ctx.SimpleQueue(), free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, size, port, fn, args, queue), daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    for _ in range(size):
        rank, result, error = queue.get()
        results[rank] = result
        if error:
            errors.append(f"rank {rank}:\n{error}")
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
    assert not errors, "\n".join(errors)
    return [results[r] for r in range(size)]


def _meta(start: int, end: int, block_ids: list[int], block_size: int) -> AttentionMetadata:
    table = torch.tensor([block_ids], dtype=torch.int32)
    pos = torch.arange(start, end)
    slots = table[0, pos // block_size].long() * block_size + pos % block_size
    return AttentionMetadata(slot_mapping=slots, block_tables=table, seq_lens=torch.tensor([end], dtype=torch.int32),
                             query_start_loc=torch.tensor([0, end - start], dtype=torch.int32),
                             max_query_len=end - start, max_seq_len=end, is_decode=end - start == 1)


def model_greedy(tp: TensorParallel, path, prompt: list[int], num_tokens: int, quantization: str = ""):
    """Greedy tokens, the [num_tokens, V] logits they came from and the rank's (query heads,
    KV heads, MLP rows, vocabulary rows), through load_model with tp (and --quantization)."""
    from executor_svc.model_loader.safetensors import load_model
    from executor_svc.startup.kv_cache import allocate_kv_caches

    model = load_model(path, "cpu", torch.float32, quantization=quantization, tp=tp)
    caches = allocate_kv_caches(model.cache_args, 8, 16, torch.float32, torch.device("cpu"))
    blocks, ids, tokens, logits = [3, 1, 6, 2, 5], torch.tensor(prompt), [], []
    start = 0
    with torch.inference_mode():
        for _ in range(num_tokens):
            end = start + len(ids)
            hidden = model(ids, torch.arange(start, end), _meta(start, end, blocks, 16), caches)
            row = model.compute_logits(hidden[-1:])[0]
            logits.append(row.numpy().copy())
            tokens.append(int(row.argmax()))
            ids, start = torch.tensor([tokens[-1]]), end
    attn = model.layers[0].self_attn
    shape = (attn.num_heads, attn.num_kv_heads, model.layers[0].mlp.down_proj.in_features,
             model.embed_tokens.num_embeddings)
    return tokens, logits, shape


def single(fn, *args):
    return fn(SINGLE, *args)


def runner_scenario(tp: TensorParallel, path):
    """Rank 0 drives a ModelRunner (its ranks TensorParallelRanks) through prefills, a chunked
    prefill, decodes with greedy / seeded / penalised sampling and logprobs, a refused plan, rows
    that fail alone (new and cached) and a reset; returns every step's (req_ids, token_ids,
    failed_req_ids, logprobs, prompt logprobs), or ("refused", error).
    The other ranks serve what rank 0 sends and return None."""
    from executor_svc.parallel.ranks import serve_plans
    from executor_svc.worker.plan_checks import PlanError
    from step_protocol.domain import (
        CachedRequestData,
        NewRequestData,
        SamplerParams,
        StepPlan,
    )
    from tests.executor.conftest import make_runner

    runner = make_runner(path, num_kv_blocks=64)
    if tp.size > 1:  # built again on the rank's shard (make_runner builds the single one)
        from executor_svc.config import ExecutorConfig
        from executor_svc.startup.build import build_runner

        runner = build_runner(ExecutorConfig(model=str(path), device="cpu", dtype="float32", max_num_seqs=8,
                                             max_num_batched_tokens=256, num_kv_blocks=64, max_model_len=512), tp)
        if tp.rank != 0:
            serve_plans(runner)
            return runner.info().num_blocks
    sampled = SamplerParams(temperature=0.8, top_k=50, top_p=0.9, seed=7, logprobs=3, repetition_penalty=1.2)
    prompts = [list(range(3, 40)), [7, 99, 12, 300, 41, 5, 6, 8, 250, 11], [60 + i for i in range(30)]]
    out, step = [], 0

    def run(new=(), cached=None, finished=()):
        nonlocal step
        step += 1
        try:
            r = runner.execute(StepPlan(step, list(new), cached or CachedRequestData(), list(finished), []))
        except PlanError as e:
            out.append(("refused", str(e)))
            return
        lp = r.logprobs
        out.append((r.req_ids, r.token_ids, r.failed_req_ids, lp and (lp.logprobs, lp.top_token_ids),
                    r.prompt_logprobs and r.prompt_logprobs.values.logprobs))

    run(new=[NewRequestData(1, prompts[0], SamplerParams(), [1, 2, 3, 4], 0, 37),
             NewRequestData(2, prompts[1], SamplerParams(prompt_logprobs=2), [5, 6, 7, 8], 0, 10),
             NewRequestData(3, prompts[2], sampled, [9, 10, 11, 12], 0, 16)])  # a chunk
    run(cached=_rows((1, 1), (2, 1), (3, 14)))
    for _ in range(6):
        run(cached=_rows((1, 1), (2, 1), (3, 1)))
    run(cached=_rows((1, 1), (1, 1)))  # a request twice: the plan is refused, nothing changes
    bad = NewRequestData(5, prompts[1], SamplerParams(temperature=float("inf")), [13], 0, 10)
    run(new=[bad], cached=_rows((9, 1), (1, 1), (2, 1), (3, 1)))  # 5 (its temperature), 9 (unknown) fail alone
    run(cached=_rows((1, 1), (3, 2)), finished=[2])  # two tokens of 3: 3 fails alone, forgotten on every rank
    run(cached=_rows((1, 1)))
    runner.reset()
    run(new=[NewRequestData(4, prompts[1], sampled, [1, 2], 0, 10)])
    run(cached=_rows((4, 1)))
    if tp.size > 1:
        runner.close()
    return runner.info().num_blocks, out


def _rows(*rows):
    from step_protocol.domain import CachedRequestData

    data = CachedRequestData()
    for req_id, n in rows:
        data.append(req_id, n, [])
    return data
