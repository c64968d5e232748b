"""The Python placement rule is the spec's, on every input of a small domain.

Under test: ``toolledger._core.placement`` (``placement``, ``same_call_slots``),
the pure part of ``Session.record(calls, seen=...)``
(docs/protocol.md#placing-a-response).  Oracle: spec/ResponsePlacement.tla's
``Placement`` and ``SameCallSlots``, tabulated by TLC in model
PlacementTable (model/MCPlacementTable.tla: the live responses: none, one of
1..2 calls, or two or three of one call, over two provider ids and two
arguments, each seen or not; every presented response of 1..2 calls; every
pool and re-emission of 1..2 calls) and read back from the state graph.  One
TLC run for the whole module.

Each comparison is shown to bite: a content-only placement (no ``seen``: the
PlaceByContent twin), a re-emission refused, the rule that looks at the
latest response only (the PlaceAgainstLatestOnly twin), and a binding that takes the last
equal lost call or binds one twice disagree with the table; and the Session
really decides through ``placement``: swapping in the content-only variant
makes a deliberate repeat of ``call_0`` alias the earlier call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from checker_support import dump_graph
from toolledger import Session, Tool
from toolledger._core import placement as pl
from toolledger._core import session as session_module
from toolledger._core.stores import MemoryStore
from toolledger.check.tlc import Outcome

TOOL = "send"  # the spec has one tool; the Python compares (id, name, digest)
Place = Callable[[Sequence[pl.LiveResponse], Sequence[pl.CallKey]],
                 tuple[pl.Placement, int | None]]
Same = Callable[[Sequence[str], Sequence[str]], list[int | None]]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Any:
    result, graph = dump_graph("PlacementTable", Path(tmp_path_factory.mktemp("placement")))
    assert result.outcome is Outcome.PASS, result.output[-2000:]
    (state,) = graph.states.values()
    return state["table"]


def keys_of(response: Any) -> list[pl.CallKey]:
    """A spec response (a sequence of [pid, args]) as the Python compares calls."""
    return [(c["pid"], TOOL, c["args"]) for c in response]


def place_rows(table: Any) -> list[tuple[Any, Any, set[tuple[str, int]]]]:
    """(live responses, presented, the spec's answers as (kind, 1-based index))."""
    return [(live, presented, {(a["kind"], a["at"]) for a in answers})
            for (live, presented), answers in table["place"].items()]


def python_answer(place: Place, live: Any, presented: Any) -> tuple[str, int]:
    kind, at = place([(keys_of(r["calls"]), r["seen"]) for r in live], keys_of(presented))
    return kind.value, 0 if at is None else at + 1  # the spec is 1-based, 0 = none


def place_mismatches(table: Any, place: Place) -> list[tuple[Any, Any, set[tuple[str, int]],
                                                             tuple[str, int]]]:
    out = []
    for live, presented, answers in place_rows(table):
        got = python_answer(place, live, presented)
        if answers != {got}:
            out.append((live, presented, answers, got))
    return out


def same_mismatches(table: Any, same: Same) -> list[tuple[Any, Any, Any, list[int | None]]]:
    out = []
    for (pool, wanted), slots in table["same"].items():
        got = same(list(pool), list(wanted))
        spec = [None if i == 0 else i - 1 for i in slots]  # the spec is 1-based, 0 = none
        if got != spec:
            out.append((pool, wanted, slots, got))
    return out


def test_the_table_covers_the_domain(table: Any) -> None:
    rows = place_rows(table)
    # live: none, one of 20 responses, two or three of 4 one-call ones; each seen or not
    assert len(rows) == (1 + 40 + 8 ** 2 + 8 ** 3) * 20
    assert {a for *_, answers in rows for a, _ in answers} == {"new", "rerecord", "reemission"}
    # more than one live response after the seen one: the older one's place
    assert any(len(live) == 3 and not live[0]["seen"] and answers == {("rerecord", 1)}
               for live, _, answers in rows)
    assert any(len(live) == 3 and answers == {("reemission", 2)} for live, _, answers in rows)
    assert len(table["same"]) == 7 * 6
    assert any(i != 0 for slots in table["same"].values() for i in slots)


def test_python_placement_is_the_specs_on_every_input(table: Any) -> None:
    assert place_mismatches(table, pl.placement) == []


def test_python_same_call_binding_is_the_specs_on_every_input(table: Any) -> None:
    assert same_mismatches(table, pl.same_call_slots) == []


def content_only(live: Sequence[pl.LiveResponse],
                 presented: Sequence[pl.CallKey]) -> tuple[pl.Placement, int | None]:
    """The PlaceByContent twin: ``seen`` ignored."""
    return pl.placement([(calls, False) for calls, _ in live], presented)


def refuse_reemission(live: Sequence[pl.LiveResponse],
                      presented: Sequence[pl.CallKey]) -> tuple[pl.Placement, int | None]:
    """A re-emission taken for a new response (the lost one never superseded)."""
    kind, at = pl.placement(live, presented)
    return (pl.Placement.NEW, None) if kind is pl.Placement.REEMISSION else (kind, at)


def latest_only(live: Sequence[pl.LiveResponse],
                presented: Sequence[pl.CallKey]) -> tuple[pl.Placement, int | None]:
    """The PlaceAgainstLatestOnly twin, the rule before LostTwoResponses was fixed:
    only the latest live response is looked at."""
    kind, at = pl.placement(live[-1:], presented)
    return kind, None if at is None else at + len(live) - 1


def last_equal(pool: Sequence[str], wanted: Sequence[str]) -> list[int | None]:
    return [max((i for i, p in enumerate(pool) if p == w), default=None) for w in wanted]


def test_broken_python_variants_are_caught(table: Any) -> None:
    repeat = place_mismatches(table, content_only)
    # the deliberate repeat: seen holds the latest's result, the same calls again
    assert any(len(live) == 1 and live[0]["seen"] and live[0]["calls"] == presented
               and (answers, got) == ({("new", 0)}, ("rerecord", 1))
               for live, presented, answers, got in repeat)
    assert place_mismatches(table, refuse_reemission)
    # LostTwoResponses: nothing seen, two live responses, the older one presented again
    older = place_mismatches(table, latest_only)
    assert any(len(live) == 2 and not live[0]["seen"] and not live[1]["seen"]
               and answers == {("rerecord", 1)} and got[1] == 2
               for live, presented, answers, got in older)
    bound = same_mismatches(table, last_equal)  # binds the last equal one, twice
    assert any(tuple(pool) == ("x", "x") for pool, *_ in bound)


def test_the_session_decides_through_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: with the content-only rule in place of ``placement``, the
    Session re-records a deliberate repeat and hands it the earlier call's
    identity; with the real one it is a new call."""
    call = {"id": "call_0", "name": "send_email", "arguments": {"to": "ada"}}

    def repeat_key() -> tuple[str, str]:
        tools = {"send_email": Tool(policy="idempotent", requires_approval=False)}
        s = Session.open(MemoryStore(), "conv", tools=tools)
        (first,) = s.record([call], seen=[])
        s.execute(first.key, lambda a: "sent")
        (again,) = s.record([call], seen=[first.key])
        return first.key, again.key

    first, again = repeat_key()
    assert first != again
    monkeypatch.setattr(session_module, "placement", content_only)
    first, again = repeat_key()
    assert first == again
