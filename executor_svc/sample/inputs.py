"""The sampler's static inputs of one step: its columns for the N rows that sample, gathered
from the rows' sampling state (rows.py) on the host and copied to the device in one
non-blocking copy (a TwinGroup, worker/host_device.py). The captured sampler graphs
(graphs.py) read their device side; so do eager steps (views of the first N rows)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from executor_svc.sample.logits_processors import ProcessorParams
from executor_svc.sample.ops import SamplingTensors
from executor_svc.sample.rows import SamplingRows
from executor_svc.worker.host_device import TwinGroup, TwinSpec


@dataclass(frozen=True)
class SampleStep:
    """Host facts about the rows one step samples (what the sampler's paths depend on)."""

    num_sample: int
    all_greedy: bool
    need_top_k_top_p: bool  # some random row cuts with top-k or top-p (the sorting path)
    need_processors: bool = False  # some row uses a logits processor
    need_penalties: bool = False  # some row needs its generated-token counts kept
    num_logprobs: int = -1  # -1: no row wants logprobs; else the most top-k asked
    need_masks: bool = False  # some row samples under a grammar's mask (structured outputs)

    @property
    def plain(self) -> bool:
        """No processor, no top-k / top-p, no mask: what the captured sample graph does."""
        return not (self.need_processors or self.need_top_k_top_p or self.need_masks)


class SampleInputs:
    """[N] columns of the sampled rows, allocated once for max_num_seqs rows (+ the graphs'
    padding): the persistent row receiving each sample and its position, the sampling
    parameters, and the logits processors' parameters (written only by steps where some row
    uses a processor)."""

    def __init__(self, max_num_seqs: int, device: torch.device):
        s, i64, f32 = max_num_seqs, torch.int64, torch.float32
        self.max_num_seqs = max_num_seqs
        self.group = TwinGroup(device, [  # in the order of the assignment below
            TwinSpec(s, i64),  # rows [N]: persistent row receiving the sample
            TwinSpec(s, i64),  # positions [N]: position of the sampled token
            TwinSpec(s, f32),  # temperature [N]
            TwinSpec(s, i64),  # top_k [N]
            TwinSpec(s, f32, 1.0),  # top_p [N]
            TwinSpec(s, i64),  # seeds [N]
            TwinSpec(s, f32),  # min_p
            TwinSpec(s, f32),  # presence_penalty
            TwinSpec(s, f32),  # frequency_penalty
            TwinSpec(s, f32, 1.0),  # repetition_penalty
            TwinSpec(s, i64),  # min_pos: the min_tokens stop ids are masked before it
        ])
        (self.rows, self.positions, self.temperature, self.top_k, self.top_p, self.seeds, self.min_p,
         self.presence, self.frequency, self.repetition, self.min_pos) = self.group.twins
        self._set = 0  # the host set in use
        self._held: list[tuple[int, SampleStep] | None] = [None] * len(self.group.hosts)  # per set: (key, step)

    def write(self, state: SamplingRows, rows: np.ndarray, positions: np.ndarray, key: int | None = None) -> SampleStep:
        """Gathers the columns of the sampled `rows` (at `positions`) into the host set. key: the
        steady decode step's rows (worker/steady.py: the same requests in the same rows while it
        holds a key); when the host set was last written with that key, its columns are these
        rows' already (a running request's sampling state does not change) and only the
        positions move."""
        n = len(rows)
        held = self._held[self._set]
        if key is not None and held is not None and held[0] == key:
            self.positions.np[:n] = positions
            return held[1]
        self.rows.np[:n] = rows
        self.positions.np[:n] = positions
        temps = self.temperature.np[:n]
        temps[:] = state.temperature[rows]
        top_k, top_p = self.top_k.np[:n], self.top_p.np[:n]
        top_k[:] = state.top_k[rows]
        top_p[:] = state.top_p[rows]
        self.seeds.np[:n] = state.seed[rows]
        need_processors = bool(state.uses_processors[rows].any())
        if need_processors:  # else never read
            self.min_p.np[:n] = state.min_p[rows]
            self.presence.np[:n] = state.presence[rows]
            self.frequency.np[:n] = state.frequency[rows]
            self.repetition.np[:n] = state.repetition[rows]
            self.min_pos.np[:n] = state.min_pos[rows]
        cutting = (top_k > 0) | (top_p < 1.0)
        step = SampleStep(n, all_greedy=not temps.any(), need_top_k_top_p=bool((cutting & (temps > 0)).any()),
                          need_processors=need_processors, need_penalties=bool(state.uses_penalties[rows].any()),
                          num_logprobs=int(state.logprobs[rows].max(initial=-1)),
                          need_masks=bool(state.uses_grammar[rows].any()))
        self._held[self._set] = None if key is None else (key, step)
        return step

    def pad(self, num_sample: int, to: int) -> None:
        """Rows num_sample..to of a padded graph sample into the scratch row (max_num_seqs)."""
        self.rows.np[num_sample:to] = self.max_num_seqs

    def use_host(self, i: int) -> None:
        self.group.use_host(i)
        self._set = i % len(self.group.hosts)

    def copy_to_device(self) -> None:
        self.group.copy_to_device()

    def device_positions(self) -> torch.Tensor | None:
        """The positions' device column when it is not the host's (CUDA), else None."""
        return None if self.group.gpu is self.group.cpu else self.positions.gpu

    def tensors(self, n: int, all_greedy: bool = False, need_top_k_top_p: bool = False) -> SamplingTensors:
        """Device views of the first n rows' sampling parameters."""
        return SamplingTensors(
            temperature=self.temperature.gpu[:n], top_k=self.top_k.gpu[:n], top_p=self.top_p.gpu[:n],
            seeds=self.seeds.gpu[:n], positions=self.positions.gpu[:n],
            all_greedy=all_greedy, need_top_k_top_p=need_top_k_top_p)

    def processor_params(self, n: int) -> ProcessorParams:
        """Device views of the first n rows' processor parameters."""
        return ProcessorParams(
            rows=self.rows.gpu[:n], positions=self.positions.gpu[:n], temperature=self.temperature.gpu[:n],
            min_p=self.min_p.gpu[:n], presence=self.presence.gpu[:n], frequency=self.frequency.gpu[:n],
            repetition=self.repetition.gpu[:n], min_pos=self.min_pos.gpu[:n])
