"""The responses this server keeps (`store`, `previous_response_id`, GET/DELETE
/v1/responses/{id}): one ResponseStore in the API process, in memory, bounded by a count and by
bytes (--responses-store-max-entries, --responses-store-max-bytes), least recently used dropped
first; nothing survives a restart.

An entry is a snapshot: the response object as it was answered and the whole conversation the
next turn continues (the conversation of its own previous response, its input items, its output
items), so a response stays continuable while it is kept even when the responses before it are
dropped or deleted. Entries share their items (the conversation of a turn is the same item
objects as the turn before plus its own), but each is counted in full: the bytes counted bound
the memory held from above.

Concurrency: the store is read and written only on the API process's event loop (the routes and
the responses' jobs), never from a thread, so it needs no lock; no method awaits."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pydantic import BaseModel

VALUE_BYTES = 16  # counted per value (a str, number, list, dict or model) on top of its text


def size_of(value) -> int:
    """The bytes a value is counted for: the UTF-8 bytes of its strings (keys too) plus
    VALUE_BYTES per value. Iterative (a deep schema does not recurse); pydantic models count by
    their fields."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        total += VALUE_BYTES
        if isinstance(v, str):
            total += len(v) if v.isascii() else len(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, BaseModel):
            stack.append(v.__dict__)
    return total


@dataclass(frozen=True)
class StoredResponse:
    """One kept response."""

    response: dict  # the response object as answered (GET /v1/responses/{id})
    conversation: tuple  # input items (schemas.Item) the next turn continues: the chain, its input, its output
    input_start: int  # conversation[input_start:input_end] is this response's own input
    input_end: int
    conversation_bytes: int  # size_of the conversation (the next turn's starts from it)
    num_bytes: int  # and of the response: what the entry is counted for

    @property
    def input_items(self) -> tuple:
        return self.conversation[self.input_start:self.input_end]


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
