"""What POST /v1/messages does not implement, refused before any work with 400 naming the field
as the client sent it ("thinking", "messages.2.content.0.type", "tools.1.type", ...): extended
thinking, server tools and MCP servers, code-execution containers, images, documents and other
non-text blocks, a reply prefilled by a last assistant message, and Anthropic's own ranges
(temperature in [0, 1], max_tokens >= 1)."""

from __future__ import annotations

from scheduler_svc.api.http.messages.schemas import MessagesRequest, Other, ToolResultBlock, ToolUseBlock, _Prompt
from scheduler_svc.api.validation import invalid

_BLOCKS = {
    "image": "images (the model reads text only)", "document": "documents (the model reads text only)",
    "search_result": "search results (send their text as text blocks)",
    "thinking": "thinking blocks (the model does not think; leave them out)",
    "redacted_thinking": "thinking blocks (the model does not think; leave them out)",
    "server_tool_use": "server tool calls (this server runs no server tools)",
    "web_search_tool_result": "server tool results (this server runs no server tools)",
    "container_upload": "container uploads (this server runs no code)",
}


def check_refused(body: _Prompt, limit: int) -> None:
    """RequestError (INVALID_ARGUMENT) for the first field this server does not implement;
    `limit` (--max-chat-messages) bounds the messages before any is read."""
    if len(body.messages) > limit:
        raise invalid(f"messages has {len(body.messages)} messages; the limit is {limit} "
                      "(--max-chat-messages)", "messages")
    if body.thinking is not None and body.thinking != {"type": "disabled"}:
        raise invalid('extended thinking is not supported: the model does not think (leave thinking '
                      'out, or send {"type": "disabled"})', "thinking")
    if body.mcp_servers:
        raise invalid("MCP servers are not supported: this server calls no tools itself; send the "
                      "tools as custom tools and run them in the client", "mcp_servers")
    if body.output_config is not None and body.output_config.effort is not None:
        raise invalid("output_config.effort is not supported: the model does not reason", "output_config.effort")
    if isinstance(body, MessagesRequest):
        _check_sampling(body)
    _check_messages(body)
    _check_tools(body)


def _check_sampling(body: MessagesRequest) -> None:
    if body.container is not None:
        raise invalid("container is not supported: this server runs no code", "container")
    if body.max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {body.max_tokens}", "max_tokens")
    if body.top_k is not None and body.top_k < 0:
        raise invalid(f"top_k must be >= 0 (0 = off), got {body.top_k}", "top_k")
    t = body.temperature
    if t is not None and not 0.0 <= t <= 1.0:  # (NaN fails too)
        raise invalid(f"temperature must be in [0, 1] (Anthropic's range; 0 = greedy), got {t!r}", "temperature")


def _check_messages(body: _Prompt) -> None:
    uses: set[str] = set()
    for i, m in enumerate(body.messages):
        for j, block in enumerate(m.content if isinstance(m.content, list) else ()):
            where = f"messages.{i}.content.{j}"
            if isinstance(block, Other):
                what = _BLOCKS.get(block.type, f"content blocks of type {block.type[:80]!r} (this server "
                                   "takes text, tool_use and tool_result)")
                raise invalid(f"{what} are not supported", f"{where}.type")
            if isinstance(block, ToolUseBlock):
                if m.role != "assistant":
                    raise invalid("tool_use blocks belong to assistant messages", f"{where}.type")
                uses.add(block.id)
            elif isinstance(block, ToolResultBlock):
                _check_result(block, m.role, uses, where)
    if body.messages and body.messages[-1].role == "assistant":
        raise invalid("the last message is the assistant's: continuing (prefilling) the assistant's "
                      "reply is not supported; end with a user message", f"messages.{len(body.messages) - 1}.role")


def _check_result(block: ToolResultBlock, role: str, uses: set[str], where: str) -> None:
    if role != "user":
        raise invalid("tool_result blocks belong to user messages", f"{where}.type")
    if block.tool_use_id not in uses:
        raise invalid(f"no tool_use block with id {block.tool_use_id[:80]!r} comes before this "
                      "tool_result", f"{where}.tool_use_id")
    for k, part in enumerate(block.content if isinstance(block.content, list) else ()):
        if isinstance(part, Other):
            what = _BLOCKS.get(part.type, f"tool_result content of type {part.type[:80]!r} (this "
                               "server takes text)")
            raise invalid(f"{what} are not supported", f"{where}.content.{k}.type")


def _check_tools(body: _Prompt) -> None:
    for i, tool in enumerate(body.tools or ()):
        if isinstance(tool, Other):
            raise invalid(f"tools of type {tool.type[:80]!r} are not supported: this server runs no "
                          "server tools (web search, web fetch, code execution, bash, text editor, "
                          "computer use, memory, tool search, ...); send custom tools", f"tools.{i}.type")
    choice = body.tool_choice
    if choice is None:
        return
    if choice.type == "tool" and choice.name is None:
        raise invalid('tool_choice of type "tool" needs the name of the tool to call', "tool_choice.name")
    if choice.type != "tool" and choice.name is not None:
        raise invalid(f'tool_choice of type "{choice.type}" takes no name (send type "tool")', "tool_choice.name")
    if choice.type == "none" and choice.disable_parallel_tool_use is not None:
        raise invalid('tool_choice of type "none" takes no disable_parallel_tool_use',
                      "tool_choice.disable_parallel_tool_use")
