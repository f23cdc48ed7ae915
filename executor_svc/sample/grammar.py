"""Structured outputs on the executor: per row, the request's grammar matcher (llguidance, via
llmserve/structured), and the token masks of the rows a step samples.

When: the scheduler plans step N+1 before it has seen step N's token, so a row's mask for N+1 is
computed here, on the executor. Step N+1's launch enqueues its forward (it needs no mask: its
input token is read on the device) and returns; its masked sampling is enqueued later
(worker/deferred_sampling.py): at the start of step N+2's launch, or by N+1's finish when no
launch follows. By then step N's tokens were sampled before N+1's forward started, so advancing
the matchers (`catch_up`) does not wait while the device has work queued; the masks of N+1's
constrained rows are filled on llguidance's threads while N+1's forward runs, copied
non-blocking, and tested inside the sampling kernel (kernels.gumbel_sample's `allowed`). Steps
without a constrained row do none of this and sample in their launch.

Compilation: a request's grammar is compiled when its row is added (the compiler's thread,
cached per grammar text), and waited for at its first mask. The llguidance tokenizer is built
from the model folder's tokenizer.json on the first grammar (~0.5 s for 49k ids).

A matcher that refuses a token or meets one of llguidance's limits fails its request alone (the
step's failed_req_ids; the scheduler aborts it); until the row is forgotten its mask allows only
EOS. One thread at a time advances the matchers (the runner's lock: the launch thread, or a
finish enqueueing its step's sampling).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import torch

from executor_svc.worker.host_device import Twin

log = logging.getLogger(__name__)


class GrammarRows:
    """The grammar state of every persistent row. tokenizer_json: the model folder's
    tokenizer.json (None: the folder has none, and a request with a grammar fails alone)."""

    def __init__(self, max_num_seqs: int, vocab_size: int, eos_token_ids: tuple[int, ...],
                 tokenizer_json: Path | None, device: torch.device):
        self.vocab_size, self.eos_token_ids, self._tokenizer_json = vocab_size, eos_token_ids, tokenizer_json
        self.epoch = np.zeros(max_num_seqs, dtype=np.int64)  # bumped when the row changes hands
        self._pending: list[Future | None] = [None] * max_num_seqs  # compiling
        self._replay: list[list[int]] = [[] for _ in range(max_num_seqs)]  # tokens generated before a preemption
        self._matchers: list = [None] * max_num_seqs
        self._failed: dict[int, str] = {}  # row -> why, reported once (take_failures)
        self._compiler = self._batch = None
        words = (vocab_size + 31) // 32
        self.masks = Twin((max_num_seqs, words), torch.int32, device, fill=-1)  # [S, words] by sample index

    def add(self, row: int, grammar: str, generated: list[int]) -> None:
        """Starts compiling a new request's grammar ("" = none); `generated`: its tokens sampled
        before a preemption, consumed before its first mask."""
        self.epoch[row] += 1
        self._matchers[row], self._pending[row] = None, None
        self._failed.pop(row, None)
        if grammar:
            self._pending[row] = self._compiler_().submit(grammar)
            self._replay[row] = list(generated)

    def remove(self, row: int) -> None:
        self.epoch[row] += 1
        self._matchers[row] = self._pending[row] = None
        self._failed.pop(row, None)

    def catch_up(self, rows: np.ndarray, tokens: list[int]) -> None:
        """Advances the matchers of constrained `rows` over the tokens they sampled in a
        finished step (rows whose request changed since are passed over by the caller)."""
        for row, token in zip(rows.tolist(), tokens):
            matcher = self._matcher(row)
            if matcher is not None and row not in self._failed and not matcher.consume([token]):
                self._fail(row, f"the grammar refused token {token}: {matcher.error or 'not allowed here'}")

    def fill(self, rows: np.ndarray, constrained: np.ndarray) -> torch.Tensor:
        """The masks of the sampled rows `rows` (persistent rows, by sample index; constrained:
        [N] bool, which of them have a grammar — SamplingRows.uses_grammar; the others allow
        everything) -> [N, words] int32 on the device (copied non-blocking)."""
        from llmserve.structured.matcher import BatchMasks

        n = len(rows)
        host = self.masks.np[:n]
        host.fill(-1)
        jobs = []
        for i in np.flatnonzero(constrained).tolist():
            row = int(rows[i])
            matcher = self._matcher(row)
            if matcher is not None and row not in self._failed:
                jobs.append((matcher, i))
            else:  # failed, or no matcher: EOS only
                host[i] = 0
                for eos in self.eos_token_ids:
                    host[i, eos >> 5] |= np.int32(np.uint32(1 << (eos & 31)).view(np.int32))
        if jobs:
            if self._batch is None:
                self._batch = BatchMasks()
            self._batch.fill(jobs, self.masks.np)
            for matcher, i in jobs:
                if matcher.error:
                    self._fail(int(rows[i]), f"the grammar failed: {matcher.error}")
        return self.masks.copy_to_device(n)

    def take_failures(self, row_to_req: Callable[[int], int | None]) -> list[tuple[int, str]]:
        """(req_id, why) of the rows that failed since the last call, each reported once."""
        if not self._failed:
            return []
        failed = []
        for row, why in list(self._failed.items()):
            if why:
                req_id = row_to_req(row)
                if req_id is not None:
                    failed.append((req_id, why))
                self._failed[row] = ""  # reported; the row stays EOS-only until it is forgotten
        return failed

    def _fail(self, row: int, why: str) -> None:
        log.warning("row %d: %s", row, why)
        self._failed[row] = why

    def _matcher(self, row: int):
        """The row's matcher, once its grammar compiled (waits for the compile)."""
        if self._matchers[row] is None and self._pending[row] is not None:
            future, self._pending[row] = self._pending[row], None
            try:
                matcher = future.result().matcher()
                if self._replay[row] and not matcher.consume(self._replay[row]):
                    raise ValueError(f"the tokens generated before a preemption do not follow it: {matcher.error}")
                self._matchers[row] = matcher
            except Exception as e:  # noqa: BLE001 - this request's grammar: it fails alone
                self._fail(row, f"its grammar could not be used: {type(e).__name__}: {e}")
            self._replay[row] = []
        return self._matchers[row]

    def _compiler_(self):
        if self._compiler is None:
            from llmserve.structured.compiler import GrammarCompiler, ll_tokenizer

            path, vocab, eos = self._tokenizer_json, self.vocab_size, self.eos_token_ids

            def build():
                if path is None or not path.is_file():
                    raise ValueError("the model folder has no tokenizer.json: grammars cannot be applied")
                return ll_tokenizer(path.read_text(), vocab, eos)

            self._compiler = GrammarCompiler(build)
        return self._compiler

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()
