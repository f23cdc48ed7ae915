"""Prompt lookup (method ngram): the drafts that followed the latest earlier occurrence of a
request's last tokens, found through an index kept up to date as the request grows (no torch)."""

from __future__ import annotations

from collections.abc import Callable


class NgramIndex:
    """Prompt lookup, incrementally: for each n in min_n..max_n, a dict from every n-gram of a
    token sequence to the end index of its latest occurrence, updated as the sequence grows
    (it may only be appended to), so a proposal costs O(max_n - min_n + 1) dict lookups plus
    indexing the tokens appended since the last one (C-speed, dict.update over zips), not a
    scan of the whole context. propose() answers exactly what the plain scan would: the up to
    k tokens that followed the latest earlier occurrence of the longest suffix of min_n..max_n
    tokens ([] when none occurs before). Memory: about max_n - min_n + 1 dict entries a token."""

    __slots__ = ("latest", "max_n", "min_n", "num_indexed")

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.latest: list[dict[tuple[int, ...], int]] = [{} for _ in range(min_n, max_n + 1)]
        self.num_indexed = 0  # the n-grams ending before this index are in `latest`

    def _extend(self, between: Callable[[int, int], list[int]], upto: int) -> None:
        """Indexes the n-grams ending at num_indexed..upto-1 (later ones overwrite: latest)."""
        start = self.num_indexed
        seg_start = max(0, start - self.max_n + 1)
        seg = between(seg_start, upto)
        for n, latest in zip(range(self.min_n, self.max_n + 1), self.latest):
            first = max(start, n - 1)  # the first end index of an n-gram to add
            if first < upto:
                part = seg[first - n + 1 - seg_start:]
                latest.update(zip(zip(*[part[i:] for i in range(n)]), range(first, upto)))
        self.num_indexed = upto

    def propose(self, between: Callable[[int, int], list[int]], length: int, k: int) -> list[int]:
        """Drafts for a sequence of `length` tokens, `between(a, b)` being its tokens a..b-1."""
        self._sync(between, length)
        return self._lookup(between, length, k)

    def propose_after(self, between: Callable[[int, int], list[int]], length: int, tail: list[int],
                      k: int) -> list[int]:
        """Drafts for the sequence followed by `tail`, tokens assumed but not known (a chained
        verify row's: the drafts in flight). The tail is not indexed (the index holds known
        tokens only); its suffix is matched against the known tokens, and the continuation may
        run on into the tail."""
        if not tail:
            return self.propose(between, length, k)
        self._sync(between, length)

        def extended(a: int, b: int) -> list[int]:
            head = between(a, min(b, length)) if a < length else []
            return head + tail[max(a - length, 0):max(b - length, 0)]
        return self._lookup(extended, length + len(tail), k)

    def _sync(self, between: Callable[[int, int], list[int]], length: int) -> None:
        upto = length - 1  # an earlier match ends before the suffix's last token
        if upto < self.num_indexed:  # not an extension of the indexed sequence: start over
            self.latest = [{} for _ in self.latest]
            self.num_indexed = 0
        if upto > self.num_indexed:
            self._extend(between, upto)

    def _lookup(self, between: Callable[[int, int], list[int]], length: int, k: int) -> list[int]:
        hi = min(self.max_n, length - 1)
        if hi < self.min_n:
            return []
        suffix = between(length - hi, length)
        for n in range(hi, self.min_n - 1, -1):
            end = self.latest[n - self.min_n].get(tuple(suffix[hi - n:]))
            if end is not None:
                return between(end + 1, min(end + 1 + k, length))
        return []


def propose_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Prompt lookup on a whole sequence at once (a fresh NgramIndex): the up to k tokens that
    followed the latest earlier occurrence of the longest suffix of `tokens` of min_n..max_n
    tokens; [] when no such suffix occurs before."""
    return NgramIndex(min_n, max_n).propose(lambda a, b: tokens[a:b], len(tokens), k)
