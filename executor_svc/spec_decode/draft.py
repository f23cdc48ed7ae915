"""Speculative decoding's draft model on the executor (--speculative-config method draft_model):
keeps the draft's KV in step with the target's and proposes the drafts of each verify row.

The draft has its own KV cache with the target's block ids and block size, so it reuses the
rows' block tables (InputBatch) and computes slots the same way. Per row `num_computed` says
which positions have draft KV. In each step, before the target's forward (ModelRunner.launch):

1. catch-up: one eager forward of the draft over every scheduled row's positions it lacks, up
   to and including the row's first token of this step — a prefill chunk: the chunk; a decode
   or verify row: its last token (position s), plus the last draft of its previous verify step
   (s - 1) when every draft was accepted (that draft's KV was never written by the draft);
2. for verify rows (d drafts): the argmax of the catch-up's last position is draft 1, then d - 1
   one-token decode forwards over all verify rows (rows with fewer drafts write no KV there),
   greedy each time. The drafts stay on the device: they are scattered into the target's input
   ids (after the host copy, same stream) and returned, the verify rows' draft ids (verify.py).

After a verify step the rows' num_computed is clamped to the target's (rejected positions are
rolled back there first). Greedy drafts are point masses, so the rejection rule stays exact
whatever the draft; a hole in the draft's KV (a prefix-cache hit on a block whose last
position the draft had not written yet) lowers acceptance only, never correctness.
A catch-up of one token per row in a step without verify rows (every step while the gate keeps
speculation off: scheduler_svc/core/spec/gate.py) replays a captured decode graph of the draft
(capture_graphs; CUDA), so a draft that is not speculating costs one graph replay a step; every
other forward here runs eagerly. Tokens are gathered on the device, and the host->device copies
go through pinned twins (non-blocking): no host sync is added.
"""

from __future__ import annotations

import numpy as np
import torch

from executor_svc.models.attention import AttentionMetadata
from executor_svc.models.kv_cache import KVCache
from executor_svc.models.llama import LlamaForCausalLM
from executor_svc.spec_decode.verify import VerifyRows
from executor_svc.worker.cuda_graphs import GraphRunner
from executor_svc.worker.input_batch import InputBatch, RequestState
from executor_svc.worker.host_device import Twin
from executor_svc.worker.step_buffers import StepBuffers
from executor_svc.worker.step_inputs import Scheduled, StepLimits, write_chunks


class DraftProposer:
    """The draft model, its KV caches and its per-row state; `propose` runs once per step."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache], batch: InputBatch,
                 last_tokens: torch.Tensor, limits: StepLimits):
        """last_tokens: the rows' last sampled tokens (the Sampler's; read only)."""
        self.model, self.kv_caches, self.batch, self.limits = model, kv_caches, batch, limits
        self.last_tokens = last_tokens
        s, device = batch.max_num_seqs, last_tokens.device
        self.device = device
        self.num_computed = np.zeros(s, dtype=np.int64)  # positions < this have draft KV
        self.carry_pos = np.full(s, -1, dtype=np.int64)  # position of the row's unfed last draft
        self.owner: list[RequestState | None] = [None] * s  # whose row num_computed describes
        # the catch-up step: at most every step token plus one carried draft per row
        self.buffers = StepBuffers(s, limits.max_num_tokens + s, batch.max_blocks_per_seq, device)
        # [2 (S + 1)]: the rows' last sampled tokens (copied each step), then their carried drafts
        self.token_src = torch.zeros(2 * (s + 1), dtype=torch.int64, device=device)
        # the verify rows' facts (6 S) and flat draft index (D), one non-blocking copy a step
        self.aux = Twin(6 * s + limits.max_num_tokens + s, torch.int64, device)
        self.arange = torch.arange(s + 1, dtype=torch.int32, device=device)
        self.graphs: GraphRunner | None = None  # decode graphs of the catch-up (capture_graphs)

    def capture_graphs(self, sizes, max_model_len: int) -> None:
        """Captures the draft's decode graphs of these batch sizes (they read token_src)."""
        self.graphs = GraphRunner(self.model, self.buffers, self.kv_caches, self.token_src, sizes, max_model_len)

    @torch.inference_mode()
    def propose(self, sched: Scheduled, spec: VerifyRows | None, parity: int,
                target_ids: torch.Tensor) -> torch.Tensor | None:
        """Runs the draft for one prepared step (after prepare_step / Verifier.prepare and the
        copy of the target's inputs, before its forward): its KV catches up, and with verify
        rows (spec) their drafts go into `target_ids` (the target's device input ids) and are
        returned ([D] int64 device, the verify rows' draft ids); None without verify rows.
        parity: the step's host buffer set."""
        batch, buf, s1 = self.batch, self.buffers, self.batch.max_num_seqs + 1
        buf.use_host(parity)
        self.aux.use_host(parity)
        rows, counts = sched.rows, sched.counts
        d = sched.drafts if sched.drafts is not None else np.zeros(len(rows), dtype=np.int64)
        start_t = batch.num_computed[rows] - counts  # the target's first position (prepare_step advanced it)
        end = start_t + counts - d  # the draft computes up to the row's first input token
        self._adopt(rows, start_t)
        start, t, cu = self._write_catch_up(rows, start_t, end)
        self.token_src[:s1].copy_(self.last_tokens)
        b, graphs = len(rows), self.graphs
        shape = graphs.decode_shape(b) if spec is None and graphs is not None and t == b else None
        if shape is not None:  # one token a row
            buf.pad(b, t, b, shape.num_reqs, shape.num_tokens)
            buf.copy_to_device(shape.num_reqs, shape.num_tokens)
            graphs.replay(shape)  # (its logits are not needed: only the KV)
        else:
            buf.copy_to_device(b, t)
            attn = AttentionMetadata.from_buffers(buf, b, t, int((end - start).max()), int(end.max()))
            hidden = self.model(buf.input_tokens(self.token_src, t), buf.positions.gpu[:t], attn, self.kv_caches)
        self.num_computed[rows] = end
        self.carry_pos[rows] = -1
        if spec is None:
            return None
        vi = np.flatnonzero(d)
        vrows, vs, vd = rows[vi], start_t[vi], d[vi]
        drafts = self._decode(hidden, cu[vi] - 1, vi, vs, vd, spec)
        self.num_computed[vrows] = vs + vd  # KV through s + d - 1: the last draft is not fed yet
        self.carry_pos[vrows] = vs + vd
        target_ids.index_copy_(0, spec.token_index + 1, drafts)
        return drafts

    def _adopt(self, rows: np.ndarray, start_t: np.ndarray) -> None:
        """Rows now holding another request start from where the target starts (0, or its
        prefix-cache hit); every row's draft positions are clamped to the target's (after the
        rollback of rejected drafts)."""
        states = self.batch.states
        for i, row in enumerate(rows.tolist()):
            if self.owner[row] is not states[row]:
                self.owner[row] = states[row]
                self.num_computed[row], self.carry_pos[row] = start_t[i], -1
        self.num_computed[rows] = np.minimum(self.num_computed[rows], start_t)

    def _write_catch_up(self, rows: np.ndarray, start_t: np.ndarray,
                        end: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
        """Writes the catch-up step into the host buffers; returns (first position per row,
        tokens, cumulative token counts). A position the draft lacks is a known token, the row's
        last sampled token (position start_t) or its carried last draft (start_t - 1); when it
        lacks more than that (it cannot happen in step with the target) it starts at start_t."""
        batch, buf, s1 = self.batch, self.buffers, self.batch.max_num_seqs + 1
        have, known = self.num_computed[rows], batch.num_known[rows]
        lo = np.maximum(have, known)
        ok = (lo >= start_t) | ((self.carry_pos[rows] == start_t - 1) & (lo == start_t - 1))
        start = np.where(ok, have, start_t)
        t, cu, pos = write_chunks(batch, buf, rows, start, end, self.limits.block_size)
        # the last sampled token where it is the step's first, else the carried draft
        src = buf.src_rows.np[:t]
        src[:] = np.where(pos == np.repeat(start_t, end - start), src, src + s1)
        return start, t, cu

    def _decode(self, hidden: torch.Tensor, last_index: np.ndarray, vi: np.ndarray, vs: np.ndarray,
                vd: np.ndarray, spec: VerifyRows) -> torch.Tensor:
        """The d drafts of each verify row: the argmax at its last catch-up token (hidden's
        last_index), then d_max - 1 one-token forwards over all S verify rows (row i writes KV
        at s_i + k only while k < d_i), greedy. Returns the [D] drafts in plan order."""
        n, dmax, s1 = len(vi), int(vd.max()), self.batch.max_num_seqs + 1
        ends = np.cumsum(vd)
        rep = np.repeat(np.arange(n), vd)
        within = np.arange(int(ends[-1])) - np.repeat(ends - vd, vd)
        packed = np.concatenate([last_index, vi, vs, vd, vs + vd - 1, ends - 1, rep * dmax + within])
        self.aux.np[:len(packed)] = packed
        dev = self.aux.copy_to_device(len(packed))
        last_index_t, vi_t, vs_t, vd_t, last_t, carry_t = (dev[i * n:(i + 1) * n] for i in range(6))
        flat_t = dev[6 * n:]
        tokens = [self.model.compute_logits(hidden[last_index_t]).argmax(dim=-1)]
        if dmax > 1:
            bs = self.limits.block_size
            tables = self.buffers.block_tables.gpu[vi_t]  # [S, max_blocks] int32
            qsl = self.arange[:n + 1]
            max_seq_len = int((vs + vd).max())
            for k in range(1, dmax):
                pos = torch.minimum(vs_t + k, last_t)  # rows past their drafts: a valid position
                block = tables.gather(1, (pos // bs)[:, None])[:, 0].long()
                slot = torch.where(vd_t > k, block * bs + pos % bs, torch.full_like(pos, -1))
                attn = AttentionMetadata(slot, tables, (pos + 1).int(), qsl, 1, max_seq_len, True)
                hidden = self.model(tokens[-1], pos, attn, self.kv_caches)
                tokens.append(self.model.compute_logits(hidden).argmax(dim=-1))
        drafts = torch.stack(tokens, dim=1).reshape(-1)[flat_t]  # [D]
        self.token_src.index_copy_(0, spec.rows + s1, drafts[carry_t])  # each row's last draft
        return drafts
