"""What an engine hands a :class:`~toolledger._core.session.Session`, validated.

Private module of :mod:`toolledger`.  Tool declarations, message sequence
numbers and call dicts (``{"id", "name", "arguments"}``, or openai's
``{"id", "function": {...}}``) are checked here before anything is written;
bad input raises :class:`~toolledger._core.protocol.InvalidInput` naming what
was wrong and what to give instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .calls import Tool
from .protocol import InvalidInput, args_digest
from .tools import check_arguments

__all__ = ["check_seq", "declared_tools", "parse_call"]


def declared_tools(tools: Mapping[str, Tool | str] | None) -> dict[str, Tool]:
    if tools is None:
        return {}
    if not isinstance(tools, Mapping):
        raise InvalidInput(f"tools must map tool names to Tool or a policy string, got "
                           f"{type(tools).__name__}")
    out = {}
    for name, spec in tools.items():
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"tool names must be non-empty strings, got {name!r}")
        out[name] = spec if isinstance(spec, Tool) else Tool(policy=spec)
    return out


def check_seq(seq: object) -> None:
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise InvalidInput(
            f"seq must be the assistant message's persisted sequence number (an int >= 0), "
            f"got {seq!r}"
        )


def parse_call(i: int, call: object) -> tuple[str, str, dict[str, Any]]:
    """(tool_call_id, name, arguments) of one call dict; raises InvalidInput."""
    if not isinstance(call, Mapping):
        raise InvalidInput(f"call {i} must be a dict {{id, name, arguments}}, got {call!r}")
    fn = call.get("function")
    body: Mapping[str, Any] = fn if isinstance(fn, Mapping) else call
    call_id = call.get("id")
    call_id = "" if call_id is None else call_id
    if not isinstance(call_id, str):
        raise InvalidInput(f"call {i} has a non-string id {call_id!r} (use '' or None for none)")
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"call {i} has no tool name (got {name!r}): give 'name'")
    raw = body.get("arguments")
    raw = {} if raw is None or raw == "" else raw
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"call {i} ({name!r}) has arguments that are not JSON ({exc}); "
                               "nothing was recorded") from None
    check_arguments(name, raw)  # a JSON object, no reserved name at any depth
    args = dict(raw)
    args_digest(name, args)  # JSON-serializable, or a clear error
    return call_id, name, args
