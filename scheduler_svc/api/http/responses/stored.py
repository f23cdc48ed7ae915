"""Kept responses (store.py) as the Responses API uses them: the conversation a request's
`previous_response_id` continues (refused 400 `previous_response_not_found` naming the field, as
OpenAI answers, when the id is not kept), the entry a finished response becomes, and the routes
on a kept id: GET /v1/responses/{id} (the response object), DELETE (OpenAI's deletion object),
GET .../input_items (the response's own input items, a cursor page) and POST .../cancel (400: only
background responses can be cancelled, and this server runs none). An id that is not kept is 404
on each."""

from __future__ import annotations

import json
import uuid

from fastapi import FastAPI, Request, Response
from pydantic import TypeAdapter

from scheduler_svc.api.http import errors
from scheduler_svc.api.http.responses.schemas import (FunctionCallItem, FunctionCallOutputItem, Item, MessageItem,
                                                      ResponsesRequest, TextPart)
from scheduler_svc.api.http.responses.store import ResponseStore, StoredResponse, counted_bytes
from scheduler_svc.api.validation import invalid

_ID_PREFIX = {MessageItem: "msg", FunctionCallItem: "fc", FunctionCallOutputItem: "fco"}
MAX_PAGE = 100  # input_items' limit, as OpenAI's (1 to 100, default 20)
_ITEMS = TypeAdapter(list[Item])  # a turn's items <-> its JSON bytes in the store


def conversation(entry: StoredResponse) -> tuple:
    """The kept conversation the next turn continues, as items: every turn's input, then output."""
    return tuple(item for turn in entry.turns for part in turn for item in _ITEMS.validate_json(part))


def input_items(entry: StoredResponse) -> list:
    """The response's own input items."""
    return _ITEMS.validate_json(entry.turns[-1][0])


def _dump(items: tuple) -> bytes:
    return _ITEMS.dump_json(list(items), exclude_none=True)


def _why_absent(store: ResponseStore) -> str:
    if not store.enabled:
        return "this server keeps no responses (--responses-store-max-entries or --responses-store-max-bytes is 0)"
    return (f"responses are kept in this server's memory only (at most {store.max_entries} "
            f"(--responses-store-max-entries) and {store.max_bytes} bytes (--responses-store-max-bytes), "
            "the least recently used dropped first), and none created with store false")


def previous(store: ResponseStore, body: ResponsesRequest) -> StoredResponse | None:
    """The kept response `previous_response_id` names (None without one)."""
    response_id = body.previous_response_id
    if response_id is None:
        return None
    entry = store.get(response_id)
    if entry is None:
        raise errors.HttpError(400, f"Previous response with id {response_id[:80]!r} not found: "
                               f"{_why_absent(store)}", "previous_response_id", "previous_response_not_found")
    return entry


def _own_items(body: ResponsesRequest) -> tuple:
    """The request's input as items, each with an id (as OpenAI's input_items list them)."""
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    return tuple(item if item.id is not None else
                 item.model_copy(update={"id": f"{_ID_PREFIX[type(item)]}_{uuid.uuid4().hex}"})
                 for item in items)


def _output_items(output: list[dict]) -> tuple:
    """A response's output as the input items that send it back."""
    items = []
    for o in output:
        if o["type"] == "message":
            parts = [TextPart(type="output_text", text=p["text"]) for p in o["content"]]
            items.append(MessageItem(role="assistant", content=parts, id=o["id"], status=o["status"]))
        else:
            items.append(FunctionCallItem(type="function_call", call_id=o["call_id"], name=o["name"],
                                          arguments=o["arguments"], id=o["id"], status=o["status"]))
    return tuple(items)


def keeper(store: ResponseStore, body: ResponsesRequest, before: StoredResponse | None):
    """keep(response) for a response to be kept once finished, or None (store false, storing
    off): it becomes the entry that continues `before`'s conversation with its input and output."""
    if not store.enabled or body.store is False:
        return None

    def keep(response: dict) -> None:
        own, output = _own_items(body), _output_items(response["output"])
        turns = (before.turns if before is not None else ()) + ((_dump(own), _dump(output)),)
        response_json = json.dumps(response, ensure_ascii=False, separators=(",", ":")).encode()
        num_items = (before.num_items if before is not None else 0) + len(own) + len(output)
        store.put(response["id"], StoredResponse(response_json, turns, num_items,
                                                 counted_bytes(response_json, turns)))
    return keep


# ---------------------------------------------------------------- routes on a kept id


def _query(request: Request, allowed: tuple[str, ...]) -> dict[str, str]:
    for name in request.query_params:
        if name not in allowed:
            raise invalid(f"{request.method} {request.url.path} takes no query parameter {name[:80]!r}"
                          + (f" (it takes {', '.join(allowed)})" if allowed else ""), name[:80])
    return dict(request.query_params)


def _listed(item) -> dict:
    """An input item as input_items lists it: content as parts, a status."""
    d = item.model_dump(exclude_none=True)
    if isinstance(item, MessageItem) and isinstance(item.content, str):
        d["content"] = [{"type": "output_text" if item.role == "assistant" else "input_text", "text": item.content}]
    d.setdefault("status", "completed")
    return d


def _page(entry: StoredResponse, query: dict[str, str]) -> dict:
    limit_text = query.get("limit", "20")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_PAGE:
        raise invalid(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit_text[:20]!r}", "limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid(f'order must be "asc" or "desc", got {order[:20]!r}', "order")
    own = input_items(entry)
    items = own if order == "asc" else own[::-1]
    start = 0
    if "after" in query:
        ids = [item.id for item in items]
        if query["after"] not in ids:
            raise invalid(f"after: no input item {query['after'][:80]!r} in this response", "after")
        start = ids.index(query["after"]) + 1
    page = items[start:start + int(limit_text)]
    return {"object": "list", "data": [_listed(item) for item in page],
            "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None,
            "has_more": start + len(page) < len(items)}


def add_stored_routes(app: FastAPI, store: ResponseStore) -> None:
    def kept(response_id: str) -> StoredResponse:
        entry = store.get(response_id)
        if entry is None:
            raise errors.HttpError(404, f"no response {response_id[:80]!r} is kept: {_why_absent(store)}",
                                   "response_id", "not_found")
        return entry

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request):
        if _query(request, ("stream",)).get("stream", "false") != "false":
            raise invalid("stream: a kept response is answered as one object (stream false); its "
                          "events are not replayed", "stream")
        return Response(kept(response_id).response_json, media_type="application/json")

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request):
        _query(request, ())
        kept(response_id)
        store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request):
        query = _query(request, ("limit", "order", "after"))
        return _page(kept(response_id), query)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str, request: Request):
        _query(request, ())
        kept(response_id)
        raise invalid("only background responses can be cancelled, and this server runs none "
                      "(background is refused): this response is finished", "response_id")
