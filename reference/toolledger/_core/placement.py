"""The placement rule: what a presented response is, decided on values alone.

:meth:`toolledger.Session.record` (``record(calls, seen=keys)``) places a
response by this rule (docs/protocol.md#placing-a-response); this module is
its pure part, so that it can be checked against the spec's ``Placement`` and
``SameCallSlots`` (spec/ResponsePlacement.tla) on every input of a small
domain (tests/test_placement_conformance.py).  No I/O: the Session reads the
live responses back to the latest one the engine has seen, then asks here.
Private module of :mod:`toolledger`: an engine imports ``Session`` from ``toolledger``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from enum import Enum
from typing import TypeVar

__all__ = ["LiveResponse", "Placement", "placement", "same_call_slots"]

#: One call as the rule compares it: (provider id, tool name, argument digest).
CallKey = tuple[str, str, str]
T = TypeVar("T", bound=Hashable)


class Placement(Enum):
    """What a presented response is (the spec's ``Placement`` answers)."""

    NEW = "new"  # recorded at the ledger's next sequence number
    RERECORD = "rerecord"  # the candidate again: nothing is written
    REEMISSION = "reemission"  # replaces the candidate; it and every later one superseded


#: One live recorded response as the rule reads it: its calls, and whether the
#: engine's history before the presented response holds a result of it.
LiveResponse = tuple[Sequence[CallKey], bool]


def placement(
    live: Sequence[LiveResponse], presented: Sequence[CallKey]
) -> tuple[Placement, int | None]:
    """The rule for a response ``presented`` when the ledger's live responses
    (recorded, from the marker on, not superseded; oldest first) are ``live``.

    Its place is right after the latest response whose results the history
    holds (none: the session start); the response after it, if any, is the
    candidate, whose index is returned.  NEW (index ``None``) if there is no
    candidate (a deliberate repeat of a seen response runs again); else
    RERECORD if the calls are the candidate's, slot by slot (a resume); else
    REEMISSION: the history lost the candidate, and every live response after
    it with it (docs/protocol.md#placing-a-response)."""
    anchor = max((i for i, (_, seen) in enumerate(live) if seen), default=-1)
    at = anchor + 1
    if at == len(live):
        return Placement.NEW, None
    if list(presented) == list(live[at][0]):
        return Placement.RERECORD, at
    return Placement.REEMISSION, at


def same_call_slots(pool: Sequence[T], wanted: Sequence[T]) -> list[int | None]:
    """For each call of a re-emission (``wanted``, slot order), the index in
    ``pool`` (the dispatched calls of every response it supersedes, oldest
    response first, slot order, as
    (tool name, argument digest)) of the lost call it IS: the first one not
    bound yet that is equal; ``None`` if none.  Each lost call is bound at most
    once (the spec's ``SameCallSlots``, 0-based here)."""
    used: set[int] = set()
    out: list[int | None] = []
    for w in wanted:
        hit = next((i for i, p in enumerate(pool) if i not in used and p == w), None)
        if hit is not None:
            used.add(hit)
        out.append(hit)
    return out
