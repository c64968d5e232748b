"""The placement rule: what a presented response is, decided on values alone.

:meth:`toolledger.Session.record` (``record(calls, seen=keys)``) places a
response by this rule (docs/protocol.md#placing-a-response); this module is
its pure part, so that it can be checked against the spec's ``Placement`` and
``SameCallSlots`` (spec/ResponsePlacement.tla) on every input of a small
domain (tests/test_placement_conformance.py).  No I/O: the Session reads the
latest response and the seen keys, then asks here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from enum import Enum
from typing import TypeVar

__all__ = ["Placement", "placement", "same_call_slots"]

#: One call as the rule compares it: (provider id, tool name, argument digest).
CallKey = tuple[str, str, str]
T = TypeVar("T", bound=Hashable)


class Placement(Enum):
    """What a presented response is (the spec's ``Placement`` answers)."""

    NEW = "new"  # recorded at the ledger's next sequence number
    RERECORD = "rerecord"  # the latest response again: nothing is written
    REEMISSION = "reemission"  # replaces the latest response, which is superseded


def placement(
    latest: Sequence[CallKey] | None, seen_latest: bool, presented: Sequence[CallKey]
) -> Placement:
    """The rule for a response ``presented`` when the latest recorded response is
    ``latest`` (``None``: no session call yet, or a legacy one) and the engine's
    history before the response holds a result of ``latest`` (``seen_latest``).

    NEW if there is no latest response or its results precede this one (a
    deliberate repeat runs again); else RERECORD if the calls are the latest's,
    slot by slot (a resume); else REEMISSION (the history lost the latest
    response before it was saved)."""
    if latest is None or seen_latest:
        return Placement.NEW
    if list(presented) == list(latest):
        return Placement.RERECORD
    return Placement.REEMISSION


def same_call_slots(pool: Sequence[T], wanted: Sequence[T]) -> list[int | None]:
    """For each call of a re-emission (``wanted``, slot order), the index in
    ``pool`` (the lost response's dispatched calls, slot order, as
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
