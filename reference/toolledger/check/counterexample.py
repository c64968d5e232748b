"""Counterexamples as readable step tables: what ``toolledger check`` prints.

:func:`render_trace` turns a TLC counterexample (a list of
:class:`~toolledger.check.tlc.TraceStep`) into a step table (step, action,
only what changed: the first state in full, then per step the changed
entries, and of a set only the elements added or removed); :func:`changes`
is the diff of two states it is built on (the notebooks' sequence diagrams
use it too).  Placeholders are not shown: an audit row
``<<kind, n, NoInputs>>`` (a row that records no recovery decision, see
docs/protocol.md) prints as ``<<kind, n>>``.  :mod:`toolledger.cli`
re-exports both.
"""

from __future__ import annotations

from collections.abc import Sequence

from .mapping import NO_INPUTS
from .tlavalues import FnValue, Value, pretty, serialize
from .tlc import (
    TraceStep,
)

__all__ = ["Change", "changes", "render_trace", "trace_json"]

def _accessor(key: Value, record: bool) -> str:
    return f".{key}" if record else f"[{serialize(key)}]"


def _appended(a: Value, b: Value) -> tuple[Value, ...] | None:
    """The elements appended to sequence ``a`` to make ``b``, if that is what happened."""
    if isinstance(a, tuple) and isinstance(b, tuple) and 0 < len(a) < len(b) and b[: len(a)] == a:
        return b[len(a) :]
    return None


Change = tuple[str, str, Value]  # (path, "=" or "\\o", value)


def changes(old: dict[str, Value] | None, new: dict[str, Value], *,
            set_deltas: bool = False) -> list[Change]:
    """What changed from ``old`` to ``new``, as ``(path, op, value)`` triples.

    Functions and records with an unchanged domain are compared entry by
    entry, so a change shows as ``("ledger[c1].attempts", "=", 2)``; a
    sequence that grew at the end shows as ``("log", "\\o", <the new tail>)``;
    anything else is ``(var, "=", new value)``. With ``old=None`` every
    variable is listed. ``set_deltas``: a non-empty set that only grew shows
    as ``("audit[e]", "\\cup", <the added elements>)``, one that only shrank
    (and is not empty) as ``(path, "\\", <the removed elements>)``.
    """
    out: list[Change] = []

    def diff(path: str, a: Value, b: Value) -> None:
        if a == b:
            return
        if isinstance(a, FnValue) and isinstance(b, FnValue) and a.keys() == b.keys():
            record = b.is_record()
            for k in b:
                diff(path + _accessor(k, record), a[k], b[k])
            return
        tail = _appended(a, b)
        if tail is not None:
            out.append((path, "\\o", tail))
            return
        if set_deltas and isinstance(a, frozenset) and isinstance(b, frozenset) and a and b:
            if a < b:
                out.append((path, "\\cup", b - a))
                return
            if b < a:
                out.append((path, "\\", a - b))
                return
        out.append((path, "=", b))

    for var, value in new.items():
        if old is None or var not in old:
            out.append((var, "=", value))
        else:
            diff(var, old[var], value)
    return out


# Values a step table leaves out where they are the last element of a tuple.
PLACEHOLDERS: tuple[Value, ...] = (NO_INPUTS,)


def _shown(value: Value) -> Value:
    """``value`` without placeholders (see :data:`PLACEHOLDERS`)."""
    if isinstance(value, tuple):
        items = tuple(_shown(v) for v in value)
        if len(items) > 1 and items[-1] in PLACEHOLDERS:
            items = items[:-1]
        return items
    if isinstance(value, frozenset):
        return frozenset(_shown(v) for v in value)
    if isinstance(value, FnValue):
        return FnValue({_shown(k): _shown(v) for k, v in value.items()})
    return value


def _shown_state(state: dict[str, Value]) -> dict[str, Value]:
    return {k: _shown(v) for k, v in state.items()}


def _wrap(change: Change, width: int) -> list[str]:
    path, op, value = change
    head = f"{path} {op} "
    body = pretty(value, width=max(20, width - len(head)))
    lines = body.split("\n")
    return [head + lines[0]] + [" " * len(head) + ln for ln in lines[1:]]


def render_trace(trace: Sequence[TraceStep], *, width: int = 100,
                 violated: str | None = None) -> str:
    """A counterexample as a step table: step number, action, and only what changed.

    The first step lists every variable. A ``Stuttering`` step says that
    nothing changes any more; a lasso step names the state it returns to.
    ``violated``: the last line says what the trace violates (e.g.
    ``"invariant AtMostOnceEffect"``).
    """
    if not trace:
        return "(no counterexample)"
    num_w = max(len(str(s.index)) for s in trace)
    act_w = max(6, *(len(s.action) for s in trace))
    text_w = max(30, width - num_w - act_w - 4)
    out = [
        f"{'#':>{num_w}}  {'action':<{act_w}}  changes",
        f"{'-' * num_w}  {'-' * act_w}  {'-' * 7}",
    ]
    prev: dict[str, Value] | None = None
    for step in trace:
        state = _shown_state(step.state)
        if step.is_stuttering:
            lines = ["(stutters: nothing changes from here on)"]
        else:
            lines = []
            for change in changes(prev, state, set_deltas=True):
                lines += _wrap(change, text_w)
            if step.loop_to is not None:
                lines.append(f"(back to state {step.loop_to}: the behaviour loops from here)")
            if not lines:
                lines = ["(no variable changes)"]
        lead = f"{step.index:>{num_w}}  {step.action:<{act_w}}  "
        out.append(lead + lines[0])
        out += [" " * len(lead) + ln for ln in lines[1:]]
        prev = state
    if violated is not None:
        out.append(f"violated: {violated}")
    return "\n".join(out)


def trace_json(trace: Sequence[TraceStep]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    prev: dict[str, Value] | None = None
    for step in trace:
        state = _shown_state(step.state)
        found = changes(prev, state, set_deltas=True)
        rows.append(
            {
                "index": step.index,
                "action": step.action,
                "loop_to": step.loop_to,
                "changes": {p: f"{op} {serialize(v)}" for p, op, v in found},
            }
        )
        prev = state
    return rows
