"""One request's position in its grammar, and token masks: torch-free (numpy int32 bitmasks in
llguidance's layout), for whichever host thread advances the request (the executor's).

Layout: a mask row has ceil(vocab_size / 32) int32 words; token t is allowed when bit t % 32
of word t // 32 is set (`allowed`). A batch is a C-contiguous [rows, words] array; rows
without a grammar stay all ones (-1).
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import numpy as np


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def new_bitmask(num_rows: int, vocab_size: int) -> np.ndarray:
    """A [num_rows, words] int32 mask allowing every token."""
    return np.full((num_rows, bitmask_words(vocab_size)), -1, dtype=np.int32)


def allowed(mask_row: np.ndarray, token_id: int) -> bool:
    """The reference: is token_id allowed by this mask row?"""
    return bool((int(mask_row[token_id >> 5]) >> (token_id & 31)) & 1)


def allowed_ids(mask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """Every allowed token id of a mask row, ascending."""
    bits = np.unpackbits(np.ascontiguousarray(mask_row).view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab_size])


def apply_bitmask(logits: np.ndarray, mask: np.ndarray) -> None:
    """The reference for the device's masking: logits [rows, >= vocab] of disallowed tokens
    become -inf, in place (ids past the mask's words too)."""
    rows, width = logits.shape
    bits = np.unpackbits(np.ascontiguousarray(mask[:rows]).view(np.uint8), axis=1, bitorder="little")
    keep = np.zeros((rows, width), dtype=bool)
    n = min(width, bits.shape[1])
    keep[:, :n] = bits[:, :n].astype(bool)
    logits[~keep] = -np.inf


class Matcher:
    """llguidance's LLMatcher for one request (made by CompiledGrammar.matcher()). Not thread
    safe: one thread advances it. A token the grammar refuses, or a limit met while computing
    a mask, puts it in an error state for good (`error`), where its mask allows only EOS."""

    __slots__ = ("_m", "vocab_size")

    def __init__(self, ll: llguidance.LLMatcher, vocab_size: int):
        self._m, self.vocab_size = ll, vocab_size

    def consume(self, token_ids: Sequence[int]) -> bool:
        """Advances over sampled tokens (EOS included); False when one is not allowed."""
        if len(token_ids) == 1:
            return self._m.consume_token(int(token_ids[0]))
        return self._m.consume_tokens([int(t) for t in token_ids])

    def fill_bitmask(self, out: np.ndarray, row: int = 0) -> None:
        """Writes the next token's mask into out[row] (out: [rows, words] int32, C order).
        Drops the GIL while it computes (tens of µs, a few ms at the first tokens of a large
        grammar: docs/scheduler.md, "Structured outputs")."""
        line = out[row]
        if out.dtype != np.int32 or not line.flags.c_contiguous or line.size != bitmask_words(self.vocab_size):
            raise ValueError(f"the mask must be int32 rows of {bitmask_words(self.vocab_size)} words")
        self._m.unsafe_compute_mask_ptr(line.ctypes.data, line.nbytes)

    def validate(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of `token_ids` (a row's drafts) the grammar accepts from here;
        nothing is consumed."""
        return self._m.validate_tokens([int(t) for t in token_ids])

    def rollback(self, num_tokens: int) -> None:
        """Undoes the last num_tokens consumed (rejected drafts)."""
        if num_tokens and not self._m.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self._m.get_error()}")

    def reset(self) -> None:
        """Back to the grammar's start (a row reused, or a request recomputed from its prompt)."""
        self._m.reset()

    def is_accepting(self) -> bool:
        """The output so far is complete: EOS may end it here."""
        return self._m.is_accepting()

    def is_stopped(self) -> bool:
        """Nothing but EOS can follow (the grammar is done, or the matcher is in error)."""
        return self._m.is_stopped()

    @property
    def error(self) -> str:
        """Why the matcher is in its error state; "" when it is not."""
        return self._m.get_error() if self._m.is_error() else ""

    def allowed(self, token_id: int) -> bool:
        """The reference check of one token (computes a whole mask: for tests)."""
        mask = new_bitmask(1, self.vocab_size)
        self.fill_bitmask(mask)
        return allowed(mask[0], token_id)


class BatchMasks:
    """Fills many rows' masks at once on llguidance's own thread pool (LLExecutor: the GIL is
    dropped for the whole batch)."""

    def __init__(self, num_threads: int | None = None):
        self._executor = llguidance.LLExecutor(num_threads)

    def fill(self, rows: Sequence[tuple[Matcher, int]], out: np.ndarray) -> None:
        """out[row] = matcher's mask, for each (matcher, row)."""
        if not rows:
            return
        words = bitmask_words(rows[0][0].vocab_size)
        if out.dtype != np.int32 or not out.flags.c_contiguous or out.ndim != 2 or out.shape[1] != words:
            raise ValueError(f"the mask must be a C-contiguous int32 [rows, {words}] array")
        if any(not 0 <= row < out.shape[0] or m.vocab_size != rows[0][0].vocab_size for m, row in rows):
            raise ValueError(f"rows must be in [0, {out.shape[0]}) and share one vocabulary")
        self._executor.unsafe_compute_mask_ptr([(m._m, row) for m, row in rows], out.ctypes.data,
                                               out.shape[1] * 4, out.shape[0])
