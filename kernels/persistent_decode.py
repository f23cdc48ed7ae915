"""The persistent decode step: a dense Llama-family decoder's every layer, for 1..MAX_ROWS decode
rows, in ONE launch (issue 27 item 4; `--persistent-decode`, docs/kernels.md).

The skinny decode path (kernels/skinny_gemm.py, skinny_rope.py) runs a layer as six dependent
launches; each launch's ramp and tail cost ~2.5 µs even as programmatic dependent launches, which
at the SmolLM2 shape is most of a step. Here one program per SM stays resident for the whole step
and walks the step's *stages* in order, a grid-wide barrier between two stages:

    embed           X = embedding[ids], R0 = 0                       items: rows
    per layer:
      qkv + rope    R1 = X + R0; qkv = rmsnorm(R1) @ Wqkv; rope;      items: (Hq + 2 Hk) D / BN_QKV
                    q -> Q, k and v -> the paged cache
      attention     the split-K decode attention's programs           items: rows * Hk * splits
                    (merge_last: a (row, kv head)'s last split done merges its heads)
      merge         its reduce (skipped with one split, merge_last)  items: rows * Hq
      o_proj        O = ATT @ Wo                                     items: H / BN_O
      gate_up       R0 = O + R1; GU = rmsnorm(R0) @ Wgu              items: 2 I / BN_GU
      down          X = (silu(gate) * up) @ Wd                       items: H / BN_D
    final norm      out = rmsnorm(X + R0) * final_norm               items: rows

A stage's items are spread over the programs (item i runs on program i % P), and every item is
the body of the existing kernel's program (`_rope_item`, `_decode_split`, `_decode_merge`,
`_skinny_acc`): the same math, one code. Layer l's weights and caches are read from an int64
table of addresses [L, 8] (`layer_table`), so nothing is copied or restacked.

The grid barriers (kernels/grid_sync.py): a counter per barrier, `counters(shape)` int32 in all;
a program arrives when its items of a stage are done, and waits in its first item of the next
stage -- a GEMV item after loading its first weight tile, so the barrier's latency hides behind
that load. The last program out (counter 0 counts exits) zeroes every barrier counter, and the
last split of a (row, kv head) its split counter, so each launch starts from zero and a CUDA graph
replays it unchanged. Every program must be resident at once: P <= the SM count, one program an
SM (8 warps, up to 255 registers). The table's addresses are 16-byte aligned (checked) and
hinted so, or the weight loads would be 2 bytes a thread. One-row GEMV items load weight tiles of
~tile_bytes (K tiles per stage), two in flight, each summed over K at once (a [BLOCK_N] fp32
accumulator: the registers for large tiles).

staged=True launches each stage apart (one launch a stage, no barrier): the same code, run by the
Triton interpreter on CPU (which runs programs one after another, so a spinning barrier would never
end) and by the CUDA tests as the bit-exact reference of the persistent launch.

Scope (the wrapper raises ValueError outside it; the model refuses the flag at start): NeoX rope,
no q/k norm, no qkv bias, no sliding window, a KV cache in the model's dtype (16-bit), head_dim a
power of two >= 16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention_decode import LOG2E, MAX_SPLITS, _decode_merge, _decode_split
from kernels.grid_sync import grid_arrive, grid_wait
from kernels.norm import rms_norm_row
from kernels.persistent_items import _address, _gemv_item, _merge_if_last
from kernels.persistent_layout import MAX_ROWS, STAGES, DecoderShape, counters, layer_table  # noqa: F401 - public
from kernels.skinny_rope import _rope_item

# layer_table's columns, as the kernel reads them
WQKV, WO, WGU, WD, NORM1, NORM2, KCACHE, VCACHE = (tl.constexpr(i) for i in range(8))


@triton.jit
def _persistent_decode_kernel(
    ids_ptr, embed_ptr, pos_ptr, slot_ptr, bt_ptr, seq_lens_ptr, cos_sin_ptr, tab_ptr, final_norm_ptr,
    out_ptr, x_ptr, r0_ptr, r1_ptr, q_ptr, att_ptr, o_ptr, gu_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, bar_ptr,
    M, step_begin, step_end, num_splits, stride_cos_sin, stride_cb, stride_cs, stride_ch, stride_bt, eps, qk_scale,
    H: tl.constexpr, H_PAD: tl.constexpr, I: tl.constexpr, NUM_LAYERS: tl.constexpr,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, DOT: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
    BN_D: tl.constexpr, BK_QKV: tl.constexpr, BK_O: tl.constexpr, BK_GU: tl.constexpr, BK_D: tl.constexpr,
    ATT_BLOCK_N: tl.constexpr, GROUP_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr, DIRECT: tl.constexpr, NORM_BLOCK: tl.constexpr, BARRIER: tl.constexpr,
    BAR_PAD: tl.constexpr, LAYER_STAGES: tl.constexpr, BARRIERS_ONLY: tl.constexpr = False,
    PREFETCH: tl.constexpr = False, REDUCE_EACH: tl.constexpr = False, MERGE_LAST: tl.constexpr = False,
):
    pid, P = tl.program_id(0), tl.num_programs(0)
    BAR_MERGE: tl.constexpr = NUM_LAYERS * LAYER_STAGES + 3  # the split counters' offset in bar_ptr
    dt = embed_ptr.dtype.element_ty
    Q: tl.constexpr = NUM_HEADS * HEAD_DIM
    T_QKV: tl.constexpr = (H + BK_QKV - 1) // BK_QKV  # K tiles of each GEMV
    T_O: tl.constexpr = (Q + BK_O - 1) // BK_O
    T_GU: tl.constexpr = (H + BK_GU - 1) // BK_GU
    T_D: tl.constexpr = (I + BK_D - 1) // BK_D
    for step in range(step_begin, step_end):
        layer = (step - 1) // LAYER_STAGES
        stage = (step - 1) % LAYER_STAGES
        row = tab_ptr + layer * 8
        # barrier k's counter is bar_ptr[1 + k]: this step waits for the previous step's
        wait = bar_ptr + step
        first = P if BARRIER else 0  # the count a program's first item of the step waits for
        if BARRIERS_ONLY:  # a benchmark of the barriers alone: no stage does any work
            if BARRIER and step > step_begin:
                grid_wait(wait, P)
        elif step == 0:  # embed
            for m in range(pid, M, P):
                offs = tl.arange(0, H_PAD)
                tok = tl.load(ids_ptr + m).to(tl.int64)
                e = tl.load(embed_ptr + tok * H + offs, mask=offs < H)
                tl.store(x_ptr + m * H + offs, e, mask=offs < H)
                tl.store(r0_ptr + m * H + offs, tl.zeros([H_PAD], dt), mask=offs < H)
        elif step == NUM_LAYERS * LAYER_STAGES + 1:  # final norm
            for m in range(pid, M, P):
                if BARRIER:
                    grid_wait(wait, tl.where(m == pid, P, 0))
                offs = tl.arange(0, H_PAD)  # (the sum goes to R1 as a new residual, which nothing reads)
                y = rms_norm_row(x_ptr, r0_ptr, final_norm_ptr, r1_ptr, m, H, H, H, eps, H, offs, offs < H, True)
                tl.store(out_ptr + m * H + offs, y.to(out_ptr.dtype.element_ty), mask=offs < H)
        elif stage == 0:  # input norm + qkv + rope + KV write; the first W tile before the wait
            k_cache = _address(row, KCACHE, dt)
            for item in range(pid, (NUM_HEADS + 2 * NUM_KV_HEADS) * (HEAD_DIM // BN_QKV), P):
                _rope_item(x_ptr, r0_ptr, _address(row, NORM1, dt), r1_ptr,
                           _address(row, WQKV, dt), x_ptr, pos_ptr, cos_sin_ptr, slot_ptr,
                           q_ptr, k_cache, _address(row, VCACHE, dt), item,
                           M, H, H, H, H, stride_cos_sin, Q, stride_cb, stride_cs, stride_ch, eps,
                           H, T_QKV, True, False, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE,
                           BLOCK_M, BN_QKV, BK_QKV, NORM_BLOCK, False, DOT, wait,
                           tl.where(item == pid, first, 0), BARRIER, PREFETCH, REDUCE_EACH)
        elif stage == 1:  # attention, split-K over the context
            k_cache = _address(row, KCACHE, dt)
            v_cache = _address(row, VCACHE, dt)
            for item in range(pid, M * NUM_KV_HEADS * num_splits, P):
                if BARRIER:
                    grid_wait(wait, tl.where(item == pid, P, 0))
                seq, kv_head = item // (NUM_KV_HEADS * num_splits), (item // num_splits) % NUM_KV_HEADS
                _decode_split(q_ptr, k_cache, v_cache, bt_ptr, seq_lens_ptr, att_ptr, part_acc_ptr, part_m_ptr,
                              part_l_ptr, seq_lens_ptr, seq_lens_ptr, qk_scale, Q, HEAD_DIM,
                              stride_cb, stride_cs, stride_ch, stride_bt, Q, HEAD_DIM, num_splits, 0,
                              seq, kv_head, item % num_splits, NUM_KV_HEADS, NUM_HEADS // NUM_KV_HEADS, GROUP_PAD,
                              HEAD_DIM, BLOCK_SIZE, ATT_BLOCK_N, DIRECT, False, False, False)
                if MERGE_LAST and not DIRECT:  # the (row, kv head)'s last split done merges its heads
                    _merge_if_last(att_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
                                   bar_ptr + BAR_MERGE + seq * NUM_KV_HEADS + kv_head, num_splits, seq, kv_head,
                                   Q, NUM_HEADS, NUM_HEADS // NUM_KV_HEADS, HEAD_DIM, SPLITS_PAD)
        elif stage == 2:  # merge the splits
            if not DIRECT and not MERGE_LAST:
                for item in range(pid, M * NUM_HEADS, P):
                    if BARRIER:
                        grid_wait(wait, tl.where(item == pid, P, 0))
                    _decode_merge(att_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, Q, HEAD_DIM, NUM_HEADS,
                                  num_splits, item // NUM_HEADS, item % NUM_HEADS, HEAD_DIM, SPLITS_PAD)
        elif stage == 3:  # o_proj
            w = _address(row, WO, dt)
            for item in range(pid, tl.cdiv(H, BN_O), P):
                _gemv_item(att_ptr, att_ptr, att_ptr, att_ptr, w, o_ptr, item, M, H, Q, H, eps, wait,
                           tl.where(item == pid, first, 0), Q, T_O, 0, BLOCK_M, BN_O, BK_O, NORM_BLOCK, DOT, BARRIER,
                           PREFETCH, REDUCE_EACH)
        elif stage == 4:  # post-attention norm (+ the residual) + gate_up
            w = _address(row, WGU, dt)
            nw = _address(row, NORM2, dt)
            for item in range(pid, tl.cdiv(2 * I, BN_GU), P):
                _gemv_item(o_ptr, r1_ptr, nw, r0_ptr, w, gu_ptr, item, M, 2 * I, H, 2 * I, eps, wait,
                           tl.where(item == pid, first, 0), H, T_GU, 1, BLOCK_M, BN_GU, BK_GU, NORM_BLOCK, DOT,
                           BARRIER, PREFETCH, REDUCE_EACH)
        else:  # silu * mul + down_proj
            w = _address(row, WD, dt)
            for item in range(pid, tl.cdiv(H, BN_D), P):
                _gemv_item(gu_ptr, gu_ptr, gu_ptr, gu_ptr, w, x_ptr, item, M, H, 2 * I, H, eps, wait,
                           tl.where(item == pid, first, 0), I, T_D, 2, BLOCK_M, BN_D, BK_D, NORM_BLOCK, DOT,
                           BARRIER, PREFETCH, REDUCE_EACH)
        if BARRIER:
            if step + 1 < step_end:
                grid_arrive(bar_ptr + 1 + step)
    if BARRIER:  # the last program out zeroes every counter for the next launch
        if tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") == P - 1:
            offs = tl.arange(0, BAR_PAD)
            tl.store(bar_ptr + offs, tl.zeros([BAR_PAD], tl.int32), mask=offs < step_end + 1)


def _block_n(n: int, programs: int, lo: int, hi: int) -> int:
    """Columns an item: about one item a program, a power of two in [lo, hi]."""
    return max(lo, min(hi, triton.next_power_of_2(triton.cdiv(n, programs))))


def persistent_decode_triton(
    input_ids: torch.Tensor,  # [M] int32/int64, 1 <= M <= MAX_ROWS
    positions: torch.Tensor,  # [M]
    slot_mapping: torch.Tensor,  # [M]; < 0 skipped
    block_tables: torch.Tensor,  # [M, max_blocks] int32
    seq_lens: torch.Tensor,  # [M] int32: context after this step
    embed: torch.Tensor,  # [V, H]
    table: torch.Tensor,  # layer_table(...)
    final_norm: torch.Tensor,  # [H]
    cos_sin_cache: torch.Tensor,  # [max_position, head_dim] float32
    k_cache: torch.Tensor,  # layer 0's (its strides and block size: every layer's)
    shape: DecoderShape,
    eps: float,
    barrier: torch.Tensor | None = None,  # [counters(shape)] int32 zeros, kept for every launch (not staged)
    staged: bool = False,  # one launch a stage, no barrier (the interpreter; the reference)
    num_programs: int | None = None,  # default: the SM count x programs_per_sm (4 interpreted)
    num_warps: int = 8,
    programs_per_sm: int = 1,  # > 1: only where that many fit an SM at once (checked: else ValueError)
    barriers_only: bool = False,  # benchmarks: the launch's barriers without the stages' work
    prefetch: bool = True,  # GEMV items keep two weight tiles in flight (_skinny_acc's PREFETCH; same bits)
    block_k: int | None = None,  # every GEMV's K tile; None: one row's from tile_bytes a stage, else 256
    tile_bytes: int = 32768,  # one row, block_k=None: a weight tile's bytes (K tile = tile_bytes / its columns)
    max_block_n: int = 32,  # the o, gate_up and down items' most columns
    reduce_each: bool = True,  # GEMV items sum each tile over K at once (_skinny_acc's REDUCE_EACH)
    merge_last: bool = True,  # a (row, kv head)'s last attention split merges the splits (no merge stage)
    num_splits: int | None = None,  # attention splits of the context (tests; default: from the programs)
    attention_block_n: int = 64,  # context tokens an attention tile
) -> torch.Tensor:
    """The decoder's final hidden states [M, H] (final norm applied) for one decode step; writes
    this step's k and v into every layer's cache."""
    m, h = input_ids.shape[0], shape.hidden
    d, hq, hk = shape.head_dim, shape.num_heads, shape.num_kv_heads
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"the persistent decode step takes 1..{MAX_ROWS} rows, got {m}")
    if d < 16 or d & (d - 1) or hq % hk:
        raise ValueError(f"head_dim {d} must be a power of two >= 16 and {hq} heads a multiple of {hk}")
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping), ("seq_lens", seq_lens)):
        if t.shape != (m,):
            raise ValueError(f"{name} must be [{m}], got {tuple(t.shape)}")
    if block_tables.shape[0] != m or tuple(table.shape) != (shape.num_layers, 8) or table.dtype != torch.int64:
        raise ValueError("block_tables must have a row a token and table be layer_table(...)")
    if embed.shape[1] != h or final_norm.shape != (h,) or k_cache.dtype != embed.dtype:
        raise ValueError("embed [V, H], final_norm [H] and the caches in the model's dtype")
    if not staged and (barrier is None or barrier.dtype != torch.int32 or barrier.numel() < counters(shape)):
        raise ValueError(f"a persistent launch takes barrier: [{counters(shape)}] int32 zeros")
    dev = embed.device
    on_gpu = dev.type == "cuda"
    programs = num_programs or (torch.cuda.get_device_properties(dev).multi_processor_count * programs_per_sm
                                if on_gpu else 4)
    dot = m > 1  # 2..8 rows: one 16-row tl.dot tile (skinny_gemm.py)
    lo = 16 if dot else 2
    max_context = block_tables.shape[1] * k_cache.shape[1]
    splits = num_splits or max(1, min(programs // (m * hk), MAX_SPLITS, triton.cdiv(max_context, attention_block_n)))
    f32 = dict(device=dev, dtype=torch.float32)
    new = dict(device=dev, dtype=embed.dtype)
    i = shape.intermediate
    out, x, r0, r1, o = (torch.empty(m, h, **new) for _ in range(5))
    q, att, gu = torch.empty(m, hq, d, **new), torch.empty(m, hq * d, **new), torch.empty(m, 2 * i, **new)
    part_acc = torch.empty(m, hq, splits, d, **f32)
    part_m, part_l = torch.empty(m, hq, splits, **f32), torch.empty(m, hq, splits, **f32)
    block_m = 16 if dot else 1
    consts = dict(
        H=h, H_PAD=triton.next_power_of_2(h), I=i, NUM_LAYERS=shape.num_layers, NUM_HEADS=hq, NUM_KV_HEADS=hk,
        HEAD_DIM=d, BLOCK_SIZE=k_cache.shape[1], BLOCK_M=block_m, DOT=dot,
        BN_QKV=_block_n((hq + 2 * hk) * d, programs, lo, d), BN_O=_block_n(h, programs, lo, max_block_n),
        BN_GU=_block_n(2 * i, programs, lo, max_block_n), BN_D=_block_n(h, programs, lo, max_block_n),
        ATT_BLOCK_N=attention_block_n, GROUP_PAD=max(16, triton.next_power_of_2(hq // hk)),
        SPLITS_PAD=triton.next_power_of_2(splits), DIRECT=splits == 1,
        NORM_BLOCK=max(256, min(triton.next_power_of_2(h), 8192 // block_m)),  # the norms are over H
    )
    for stage, k in (("QKV", h), ("O", hq * d), ("GU", h), ("D", i)):  # a GEMV's K tile
        tile = max(16, tile_bytes // (consts[f"BN_{stage}"] * embed.element_size()))
        consts[f"BK_{stage}"] = block_k or (256 if dot else min(triton.next_power_of_2(k), tile))
    steps = shape.num_layers * STAGES + 2
    bar = barrier if barrier is not None else torch.zeros(counters(shape), dtype=torch.int32, device=dev)

    args = (input_ids, embed, positions, slot_mapping, block_tables, seq_lens, cos_sin_cache, table, final_norm,
            out, x, r0, r1, q, att, o, gu, part_acc, part_m, part_l, bar, m)
    strides = (splits, cos_sin_cache.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
               block_tables.stride(0), eps, d ** -0.5 * LOG2E)
    consts.update(BARRIER=not staged, BAR_PAD=triton.next_power_of_2(counters(shape)), LAYER_STAGES=STAGES,
                  BARRIERS_ONLY=barriers_only, PREFETCH=prefetch, REDUCE_EACH=reduce_each,
                  MERGE_LAST=merge_last, num_warps=num_warps, num_stages=2)
    if staged:
        for step in range(steps):
            _persistent_decode_kernel[(programs,)](*args, step, step + 1, *strides, **consts)
        return out
    if on_gpu:  # a program that cannot start until another ends would wait at the first barrier forever
        compiled = _persistent_decode_kernel.warmup(*args, 0, steps, *strides, grid=(programs,), **consts)
        _check_resident(compiled, num_warps, programs, dev)
    _persistent_decode_kernel[(programs,)](*args, 0, steps, *strides, **consts)
    return out


def _check_resident(compiled, num_warps: int, programs: int, device: torch.device) -> None:
    """Raises ValueError unless `programs` programs of `compiled` fit the GPU's SMs at once."""
    compiled._init_handles()
    props = torch.cuda.get_device_properties(device)
    per_sm = triton.cdiv(programs, props.multi_processor_count)
    regs = -(-compiled.n_regs // 8) * 8 * 32 * num_warps * per_sm  # allocated 8 registers at a time
    shared = compiled.metadata.shared * per_sm
    threads = 32 * num_warps * per_sm
    if (regs > getattr(props, "regs_per_multiprocessor", 65536) or  # 64K on every GPU since Kepler
            shared > props.shared_memory_per_multiprocessor
            or threads > props.max_threads_per_multi_processor):
        raise ValueError(f"{programs} programs of {num_warps} warps ({compiled.n_regs} registers a thread, "
                         f"{compiled.metadata.shared} B shared) do not fit {props.multi_processor_count} SMs at once")
