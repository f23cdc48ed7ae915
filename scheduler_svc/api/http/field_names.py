"""A chat completion's field names, as the API that translated its request into that chat
completion spells them (the Responses and Messages APIs: their `client_param`): the parts both
share."""

from __future__ import annotations


def message_param(param: str, num_messages: int) -> tuple[int, str] | None:
    """"messages.<i>.<rest>" -> (i, rest); None when <i> names none of the request's messages."""
    head, _, rest = param.removeprefix("messages.").partition(".")
    if not head.isdigit() or int(head) >= num_messages:
        return None
    return int(head), rest


def renamed(param: str, prefixes: tuple[tuple[str, str], ...], fields: dict[str, str]) -> str:
    """The first of `prefixes` (ours, theirs) that `param` starts with, replaced; else `fields`'
    name for it; else the param as it is."""
    for ours, theirs in prefixes:
        if param == ours or param.startswith(ours + "."):
            return theirs + param[len(ours):]
    return fields.get(param, param)
