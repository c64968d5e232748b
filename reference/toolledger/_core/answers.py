"""Which calls of one response a history answers: by the ledger's key, never by a reused id.

Private module of :mod:`toolledger` (:func:`answered_calls`).  Engines pair a
tool result with its call by the provider's id, and providers reuse ids
(``call_0`` every turn, ``""`` in an OpenAI stream), so an inline answer to
one call (an interactive tool, a malformed call) can look like the answer to
another: a resume then skips that call, which never runs and never gets its
tool message.  The ledger's key (:attr:`CallRef.key`) names exactly one call;
an engine that stamps it on the tool results it writes for ledger calls gets
an exact pairing here (docs/protocol.md#placing-a-response).
:class:`Trailing` is what :meth:`Session.record_trailing` returns for an
engine whose conversation is a list of chat messages; :data:`SEEN` is the
field those messages carry the keys in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .calls import CallStatus
from .protocol import InvalidInput

__all__ = ["SEEN", "Trailing", "answered_calls"]

SEEN: Final = "ledger_seen"
"""The field of a chat message that holds ledger keys (a list): on a tool message
the key of the call it answers, on a summary the keys of the messages it
replaced.  :meth:`Session.record_trailing` reads it; the engine writes it."""


@dataclass(frozen=True, slots=True)
class Trailing:
    """The trailing response of a chat history, as :meth:`Session.record_trailing` left it.

    ``index``: its index in the messages (-1: no message with tool calls).
    ``calls``: its raw call dicts, in slot order.  ``statuses``: per call, the
    ledger's status (``None``: a call the ledger does not hold, or ``stale``).
    ``answered``: per call, whether a tool message after it answers it
    (:func:`answered_calls`).
    ``stale``: a user message follows it: the turn moved on, nothing was
    recorded and nothing of it is to be resumed."""

    index: int
    calls: tuple[Mapping[str, Any], ...]
    statuses: tuple[CallStatus | None, ...]
    answered: tuple[bool, ...]
    stale: bool

    def unanswered(self) -> list[int]:
        """The slots a resume re-drives: unanswered calls of a response that is not stale."""
        return [] if self.stale else [j for j, done in enumerate(self.answered) if not done]


def answered_calls(
    calls: Sequence[tuple[str, CallStatus | str | None]],
    results: Iterable[tuple[str | None, str | None]],
) -> list[bool]:
    """For each call of one response, whether ``results`` hold its answer.

    ``calls``: ``(provider id, ledger key or None)`` per call, in slot order;
    the key may be given as the call's :class:`CallStatus` from
    :meth:`Session.record` (``None``: a call the ledger does not hold, e.g. an
    interactive tool, a malformed call).
    ``results``: ``(tool_call_id, ledger key or None)`` of every tool result
    after the response, in history order.  A result with a key answers the
    call with that key and no other.  A result without one answers a call
    with its id that no key answered, in slot order: the calls the ledger
    does not hold first (the engine's inline answers), then ledger calls (a
    history written before the ledger, whose results carry no key).  So a
    reused or empty id never hands one call another call's answer, as long
    as the engine keeps the key on the results of ledger calls.
    """
    keys = [key.key if isinstance(key, CallStatus) else key for _, key in calls]
    held = [k for k in keys if k is not None]
    if len(set(held)) != len(held):
        raise InvalidInput(f"answered_calls: a ledger key is given for two calls ({keys}); "
                           "each call of a response has its own key")
    done = [False] * len(calls)
    unkeyed: list[str | None] = []
    for cid, key in results:
        if key is None:
            unkeyed.append(cid)
        elif key in keys:
            done[keys.index(key)] = True
    order = [j for j, k in enumerate(keys) if k is None] + [j for j, k in enumerate(keys)
                                                            if k is not None]
    for j in order:
        if not done[j] and calls[j][0] in unkeyed:
            unkeyed.remove(calls[j][0])
            done[j] = True
    return done
