"""The responses this server keeps (`store`, `previous_response_id`, GET/DELETE
/v1/responses/{id}): one ResponseStore in the API process, in memory, bounded by a count and by
bytes (--responses-store-max-entries, --responses-store-max-bytes), least recently used dropped
first; nothing survives a restart.

An entry is a snapshot kept as compact JSON: the response object as it was answered and, turn by
turn, the input and output items of the whole conversation the next turn continues (its own
previous response's turns, then its own), so a response stays continuable while it is kept even
when the responses before it are dropped or deleted. Entries share the bytes of their earlier
turns (the same immutable objects), but each is counted in full, its bytes plus
OBJECT_OVERHEAD for each object it holds: the bytes counted bound the memory held from above
(tests/scheduler/api/test_responses_store.py measures it with tracemalloc). Kept as Python
objects instead (the items as models, the response as dicts), CPython's 50-100 bytes a value
made the memory held several times what a count of the text could bound.

Concurrency: the store is read and written only on the API process's event loop (the routes and
the responses' jobs), never from a thread, so it needs no lock; no method awaits."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

# What one kept object costs beyond its payload: a bytes object's header (sys.getsizeof(b"") =
# 33), rounded up for the allocator's alignment, and its place in a tuple (8).
OBJECT_OVERHEAD = 64
ENTRY_OVERHEAD = 512  # the entry, its tuples, its key in the store and the store's links


@dataclass(frozen=True)
class StoredResponse:
    """One kept response: JSON bytes, decoded where they are used (stored.py)."""

    response_json: bytes  # the response object as answered (GET /v1/responses/{id})
    turns: tuple[tuple[bytes, bytes], ...]  # each turn's (input items, output items) JSON arrays; the last is this response's
    num_items: int  # items in the conversation (all the turns' input and output)
    num_bytes: int  # what the entry is counted for (counted_bytes)


def counted_bytes(response_json: bytes, turns: tuple[tuple[bytes, bytes], ...]) -> int:
    """The memory an entry holds, from above: its bytes objects' payloads and headers."""
    payload = len(response_json) + sum(len(a) + len(b) for a, b in turns)
    return ENTRY_OVERHEAD + payload + OBJECT_OVERHEAD * (1 + 2 * len(turns))


class ResponseStore:
    """Kept responses by id, least recently used first. max_entries 0 = nothing is kept."""

    def __init__(self, max_entries: int, max_bytes: int):
        if max_entries < 0 or max_bytes < 0:
            raise ValueError(f"the response store's bounds must be >= 0, got {max_entries} entries, "
                             f"{max_bytes} bytes")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.num_bytes = 0  # of the entries kept

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._entries

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry (now the most recently used), or None."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, response_id: str, entry: StoredResponse) -> bool:
        """Keeps the entry, dropping the least recently used ones until both bounds hold; False
        (and nothing dropped) when it alone is over the byte bound or storing is off."""
        if not self.enabled or entry.num_bytes > self.max_bytes:
            return False
        self.delete(response_id)
        while self._entries and (len(self._entries) >= self.max_entries
                                 or self.num_bytes + entry.num_bytes > self.max_bytes):
            _, dropped = self._entries.popitem(last=False)
            self.num_bytes -= dropped.num_bytes
        self._entries[response_id] = entry
        self.num_bytes += entry.num_bytes
        return True

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.num_bytes -= entry.num_bytes
        return True
