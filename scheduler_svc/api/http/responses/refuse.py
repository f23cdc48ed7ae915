"""What POST /v1/responses does not implement, refused before any work with 400 naming the
field as the client sent it ("conversation", "input.2.type", "tools.0.type", ...): server-side
state other than kept responses (conversations, stored prompts, item references), background
responses, reasoning, automatic truncation, built-in tools, images and files, and `include`
entries this server does not produce."""

from __future__ import annotations

from scheduler_svc.api.http.responses.schemas import FunctionCallOutputItem, MessageItem, ResponsesRequest, Other
from scheduler_svc.api.validation import invalid

MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's (characters)
LOGPROBS = "message.output_text.logprobs"  # the one `include` entry this server produces
NO_STATE = "this server keeps no conversations, prompts or items (only whole responses, for previous_response_id)"
_ITEMS = {
    "reasoning": "reasoning items (the model does not reason; leave them out of the input)",
    "item_reference": f"item references ({NO_STATE}: send the item itself)",
}
_PARTS = {
    "input_image": "images (the model reads text only)", "input_file": "files (the model reads text only)",
    "input_audio": "audio (the model reads text only)", "refusal": "refusal parts (send the text as output_text)",
}


def check_refused(body: ResponsesRequest) -> None:
    """RequestError (INVALID_ARGUMENT) for the first field this server does not implement."""
    if body.conversation is not None:
        raise invalid(f"conversation is not supported: {NO_STATE}; send the whole conversation "
                      "as input items", "conversation")
    if body.prompt is not None:
        raise invalid(f"prompt (a stored prompt template) is not supported: {NO_STATE}; send "
                      "instructions and input", "prompt")
    if body.background:
        raise invalid("background responses are not supported: leave background unset or false",
                      "background")
    if body.truncation == "auto":
        raise invalid('truncation "auto" is not supported: the input is never cut; a conversation '
                      'that does not fit is refused (truncation "disabled")', "truncation")
    if body.max_tool_calls is not None:
        raise invalid("max_tool_calls is not supported (parallel_tool_calls false allows at most one "
                      "call)", "max_tool_calls")
    _check_metadata(body.metadata)
    _check_reasoning(body)
    _check_text(body)
    _check_include(body)
    _check_input(body)
    _check_tools(body)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's bounds (the metadata is echoed, and kept with the response)."""
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid(f"metadata has {len(metadata)} pairs; the limit is {MAX_METADATA_PAIRS}", "metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise invalid(f"metadata: a key has {len(key)} characters; the limit is {MAX_METADATA_KEY}",
                          "metadata")
        if len(value) > MAX_METADATA_VALUE:
            raise invalid(f"metadata.{key} has {len(value)} characters; the limit is {MAX_METADATA_VALUE}",
                          f"metadata.{key}")


def _check_reasoning(body: ResponsesRequest) -> None:
    r = body.reasoning
    if r is None:
        return
    if r.effort not in (None, "none"):
        raise invalid(f"reasoning.effort {r.effort!r} is not supported: the model does not reason "
                      '(leave reasoning out, or send effort "none")', "reasoning.effort")
    for name in ("summary", "generate_summary"):
        if getattr(r, name) is not None:
            raise invalid(f"reasoning.{name} is not supported: the model does not reason, so there "
                          "is nothing to summarise", f"reasoning.{name}")


def _check_text(body: ResponsesRequest) -> None:
    text = body.text
    if text is None:
        return
    if text.verbosity not in (None, "medium"):
        raise invalid(f"text.verbosity {text.verbosity!r} is not supported (only the default, "
                      '"medium": the model has no verbosity control)', "text.verbosity")
    f = text.format
    if f is not None and f.type != "json_schema" and (f.schema_ is not None or f.name is not None):
        raise invalid(f"text.format of type {f.type} takes no name or schema (send type json_schema)",
                      "text.format.type")
    if f is not None and f.type == "json_schema" and f.schema_ is None:
        raise invalid("text.format of type json_schema needs a schema", "text.format.schema")


def _check_include(body: ResponsesRequest) -> None:
    for i, entry in enumerate(body.include or []):
        if entry != LOGPROBS:
            raise invalid(f"include entry {entry[:80]!r} is not supported: this server produces "
                          f"only {LOGPROBS!r}", f"include.{i}")
    if body.top_logprobs and LOGPROBS not in (body.include or []):
        raise invalid(f"top_logprobs={body.top_logprobs} needs include [{LOGPROBS!r}]: the "
                      "logprobs are sent only when asked for", "top_logprobs")


def _check_input(body: ResponsesRequest) -> None:
    if isinstance(body.input, str):
        return
    for i, item in enumerate(body.input):
        if isinstance(item, Other):
            what = _ITEMS.get(item.type, f"input items of type {item.type[:80]!r} (this server "
                              "takes message, function_call and function_call_output items)")
            raise invalid(f"{what} are not supported", f"input.{i}.type")
        parts = item.content if isinstance(item, MessageItem) else \
            item.output if isinstance(item, FunctionCallOutputItem) else None
        field = "content" if isinstance(item, MessageItem) else "output"
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if isinstance(part, Other):
                what = _PARTS.get(part.type, f"content parts of type {part.type[:80]!r} (this server "
                                  "takes input_text and output_text)")
                raise invalid(f"{what} are not supported", f"input.{i}.{field}.{j}.type")


def _check_tools(body: ResponsesRequest) -> None:
    for i, tool in enumerate(body.tools or []):
        if isinstance(tool, Other):
            raise invalid(f"tools of type {tool.type[:80]!r} are not supported: this server runs no "
                          "built-in tools (web search, file search, computer use, code interpreter, "
                          "MCP, ...); send function tools", f"tools.{i}.type")
    choice = body.tool_choice
    if isinstance(choice, Other):
        raise invalid(f"tool_choice of type {choice.type[:80]!r} is not supported: send \"none\", "
                      '"auto", "required" or {"type": "function", "name": ...}', "tool_choice")
