"""prepare_step and the Sampler's prepare (vectorized over rows) equal a straightforward
per-request construction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor_svc.sample.inputs import SampleInputs
from executor_svc.sample.rows import SamplingRows
from executor_svc.sample.sampler import Sampler
from executor_svc.worker.host_device import PackedTwins, TwinGroup
from executor_svc.worker.input_batch import InputBatch
from executor_svc.worker.step_buffers import StepBuffers
from executor_svc.worker.step_inputs import Scheduled, StepLimits, prepare_step, use_token_rows
from step_protocol.domain import NewRequestData, SamplerParams

BS, MAX_BLOCKS, SEQS, TOKENS = 4, 16, 32, 256
LIMITS = StepLimits(block_size=BS, max_model_len=60, max_num_seqs=SEQS, max_num_tokens=TOKENS)
CPU = torch.device("cpu")


def reference(batch: InputBatch, sampling: SamplingRows, rows, counts) -> dict:
    """The per-request loop: every buffer prefix a step writes, and the step facts."""
    ids, use_last, src, pos_all, slots = [], [], [], [], []
    seq_lens, qsl, tables, samp = [], [0], [], []
    for row, n in zip(rows, counts):
        state = batch.states[row]
        start, num_known = int(batch.num_computed[row]), len(state.token_ids)
        end = start + n
        k = max(0, min(end, num_known) - start)
        pos = np.arange(start, end)
        ids += list(state.token_ids[start:start + k]) + [0] * (n - k)
        use_last += [False] * k + [True] * (n - k)
        src += [row] * n
        pos_all += list(pos)
        slots += list(batch.block_table[row][pos // BS].astype(np.int64) * BS + pos % BS)
        tables.append(batch.block_table[row].copy())
        seq_lens.append(end)
        qsl.append(qsl[-1] + n)
        if end >= num_known:
            samp.append((qsl[-1] - 1, row, sampling.temperature[row], sampling.top_k[row], sampling.top_p[row],
                         sampling.seed[row], end))
    cols = list(zip(*samp)) if samp else [[]] * 7
    return dict(input_ids=ids, use_last=use_last, src_rows=src, positions=pos_all, slot_mapping=slots,
                seq_lens=seq_lens, query_start_loc=qsl, block_tables=np.array(tables),
                logits_indices=cols[0], sample_rows=cols[1], temperature=cols[2], top_k=cols[3],
                top_p=cols[4], seeds=cols[5], sample_positions=cols[6])


def random_batch(rng, num_reqs: int) -> tuple[InputBatch, Sampler]:
    batch = InputBatch(SEQS, MAX_BLOCKS)
    sampler = Sampler(SamplingRows(SEQS, 1000, 4, 4, CPU), SampleInputs(SEQS, CPU),
                      torch.zeros(SEQS + 1, dtype=torch.int64))
    for req_id in rng.permutation(100)[:num_reqs].tolist():
        num_known = int(rng.integers(3, 50))
        computed = int(rng.integers(0, num_known + 1))
        blocks = rng.permutation(np.arange(1, 200))[: -(-(num_known + 3) // BS)].tolist()
        params = SamplerParams(temperature=float(rng.choice([0.0, 0.8])), top_k=int(rng.choice([0, 5])),
                                top_p=float(rng.choice([1.0, 0.9])), seed=int(rng.integers(0, 1 << 40)))
        new = NewRequestData(req_id, rng.integers(2, 1000, num_known).tolist(), params, blocks, computed, 0)
        sampler.add_request(batch.add(new).row, new)
    return batch, sampler


def random_step(rng, batch: InputBatch, all_decode: bool):
    rows, counts = [], []
    for row in rng.permutation([s.row for s in batch.requests.values()]).tolist():
        left = int(batch.num_known[row] - batch.num_computed[row])  # known tokens not computed
        if left <= 0:
            rows.append(row), counts.append(1)  # decode: the last sampled token
        elif not all_decode and rng.random() < 0.8:
            rows.append(row), counts.append(int(rng.integers(1, left + 1)))  # a (maybe final) chunk
    return rows, counts


@pytest.mark.parametrize("seed", range(12))
def test_prepare_step_equals_per_request_loop(seed):
    rng = np.random.default_rng(seed)
    batch, sampler = random_batch(rng, int(rng.integers(1, SEQS + 1)))
    if seed % 3 == 0:  # pure decode: the fast path
        batch.num_computed[:] = batch.num_known
    buf = StepBuffers(SEQS, TOKENS, MAX_BLOCKS, CPU)
    for step in range(3):
        rows, counts = random_step(rng, batch, all_decode=seed % 3 == 0)
        if not rows:
            break
        want = reference(batch, sampler.rows, rows, counts)
        before = batch.num_computed.copy()
        got = prepare_step(batch, buf, Scheduled(np.array(rows), np.array(counts)), LIMITS)
        sampling = sampler.prepare(got.sample_rows, got.sample_positions, 0)
        t, b, ns = sum(counts), len(rows), len(want["sample_rows"])
        assert (got.num_reqs, got.num_tokens, got.num_sample, sampling.num_sample) == (b, t, ns, ns)
        assert got.is_decode == (t == b)
        assert got.sample_rows.tolist() == list(want["sample_rows"])
        assert (got.max_query_len, got.max_seq_len) == (max(counts), max(want["seq_lens"]))
        temps, cut = np.array(want["temperature"]), (np.array(want["top_k"]) > 0) | (np.array(want["top_p"]) < 1)
        assert sampling.all_greedy == bool((temps == 0).all())
        assert sampling.need_top_k_top_p == bool((cut & (temps > 0)).any())
        size = {"input_ids": t, "use_last": t, "src_rows": t, "positions": t, "slot_mapping": t,
                "seq_lens": b, "query_start_loc": b + 1, "block_tables": b}
        inputs = sampler.inputs  # the sampler's columns (sample/inputs.py), by their names there
        columns = {"sample_rows": inputs.rows, "sample_positions": inputs.positions, "temperature": inputs.temperature,
                   "top_k": inputs.top_k, "top_p": inputs.top_p, "seeds": inputs.seeds}
        for name, value in want.items():
            twin = columns.get(name) or getattr(buf, name)
            np.testing.assert_array_equal(twin.np[:size.get(name, ns)], np.array(value), err_msg=name)
        before[rows] += counts
        np.testing.assert_array_equal(batch.num_computed, before)


@pytest.mark.parametrize("seed", range(6))
def test_token_rows_make_each_token_a_decode_row(seed):
    """A verify step as token rows: the token columns as without, and token i is attention row
    i: its request's block table, seq_len = its position + 1, one token a row (a decode step's
    layout); the rows that sample and their logits rows the same."""
    rng = np.random.default_rng(100 + seed)
    batch, sampler = random_batch(rng, int(rng.integers(1, 8)))
    batch.num_computed[:] = batch.num_known  # decode and verify rows only
    rows = np.array([s.row for s in batch.requests.values()])
    drafts = rng.integers(0, 5, len(rows))
    sched = Scheduled(rows, drafts + 1, drafts)
    assert use_token_rows(sched, SEQS) and not use_token_rows(sched, int(sched.counts.sum()) - 1)
    assert not use_token_rows(Scheduled(rows, drafts + 2, drafts), SEQS)  # a longer chunk rode along
    assert not use_token_rows(Scheduled(rows, drafts + 1), SEQS)  # no drafts: not a verify step
    start = batch.num_computed.copy()
    want = reference(batch, sampler.rows, rows.tolist(), (drafts + 1).tolist())
    plain = StepBuffers(SEQS, TOKENS, MAX_BLOCKS, CPU)
    flat = StepBuffers(SEQS, TOKENS, MAX_BLOCKS, CPU)
    got = prepare_step(batch, flat, sched, LIMITS, token_rows=True)
    batch.num_computed[:] = start
    base = prepare_step(batch, plain, sched, LIMITS)
    t = int(sched.counts.sum())
    assert (got.num_reqs, got.num_tokens, got.max_query_len, got.is_decode) == (t, t, 1, True)
    assert got.sample_rows.tolist() == base.sample_rows.tolist() == list(want["sample_rows"])
    assert got.max_seq_len == base.max_seq_len
    for name in ("input_ids", "use_last", "src_rows", "positions", "slot_mapping"):
        np.testing.assert_array_equal(getattr(flat, name).np[:t], np.array(want[name]), err_msg=name)
    np.testing.assert_array_equal(flat.logits_indices.np[:base.num_sample], plain.logits_indices.np[:base.num_sample])
    np.testing.assert_array_equal(flat.query_start_loc.np[:t + 1], np.arange(t + 1))
    np.testing.assert_array_equal(flat.seq_lens.np[:t], np.array(want["positions"]) + 1)
    np.testing.assert_array_equal(flat.block_tables.np[:t], batch.block_table[np.repeat(rows, drafts + 1)])


def test_sampler_group_members_are_views_of_one_buffer():
    inputs = SampleInputs(SEQS, CPU)
    assert inputs.top_p.np[:SEQS].tolist() == [1.0] * SEQS and not inputs.seeds.np.any()
    inputs.seeds.np[3] = 7
    assert inputs.group.twins == [inputs.rows, inputs.positions, inputs.temperature, inputs.top_k, inputs.top_p,
                                  inputs.seeds, inputs.min_p, inputs.presence, inputs.frequency, inputs.repetition,
                                  inputs.min_pos]
    base = inputs.group.cpu.data_ptr()
    for twin in inputs.group.twins:
        assert base <= twin.cpu.data_ptr() < base + inputs.group.cpu.numel() and twin.gpu is twin.cpu
        assert (twin.cpu.data_ptr() - base) % TwinGroup.ALIGN == 0
    assert inputs.seeds.cpu[3].item() == 7


@pytest.mark.parametrize("num_reqs,num_tokens", [(1, 1), (3, 40), (SEQS, SEQS), (7, TOKENS)])
def test_packed_copy_lays_out_each_shape_once_at_stable_addresses(num_reqs, num_tokens):
    """The step buffers' one copy (PackedTwins, here packing on CPU as on CUDA): every member's
    device view holds exactly its first T or B (+1) host rows, 64-byte aligned inside one
    buffer, and a shape's views keep their addresses from copy to copy (a graph reads them)."""
    buf = StepBuffers(SEQS, TOKENS, MAX_BLOCKS, CPU, pack=True)
    gen = np.random.default_rng(num_reqs * 1000 + num_tokens)
    for member in buf.packed.members:
        member.np[...] = gen.integers(0, 100, member.np.shape).astype(member.np.dtype)
    rows = {"input_ids": num_tokens, "use_last": num_tokens, "src_rows": num_tokens, "positions": num_tokens,
            "slot_mapping": num_tokens, "seq_lens": num_reqs, "query_start_loc": num_reqs + 1,
            "logits_indices": num_tokens, "block_tables": num_reqs}
    buf.use_host(1)
    buf.copy_to_device(num_reqs, num_tokens)
    base, ptrs = buf.packed.dev.data_ptr(), {}
    for name, n in rows.items():
        member = getattr(buf, name)
        np.testing.assert_array_equal(member.gpu.numpy(), member.np[:n], err_msg=name)
        assert member.gpu.shape[0] == n and member.gpu.dtype == torch.from_numpy(member.np).dtype, name
        assert (member.gpu.data_ptr() - base) % PackedTwins.ALIGN == 0, name
        ptrs[name] = member.gpu.data_ptr()
    ends = sorted((p - base, p - base + getattr(buf, n).gpu.nbytes) for n, p in ptrs.items())
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:])), "members overlap"
    buf.copy_to_device(2, 2)  # another shape in between
    buf.input_ids.np[0] += 1
    buf.use_host(0)
    buf.copy_to_device(num_reqs, num_tokens)
    assert {name: getattr(buf, name).gpu.data_ptr() for name in rows} == ptrs
    assert buf.input_ids.gpu[0].item() == buf.input_ids.np[0]
