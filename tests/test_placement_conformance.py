"""The Python placement rule is the spec's, on every input of a small domain.

Under test: ``toolledger._core.placement`` (``placement``, ``same_call_slots``),
the pure part of ``Session.record(calls, seen=...)``
(docs/protocol.md#placing-a-response).  Oracle: spec/ResponsePlacement.tla's
``Placement`` and ``SameCallSlots``, tabulated by TLC in model
PlacementTable (model/MCPlacementTable.tla: no latest response or one of 1..2
calls over two provider ids and two arguments, seen or not, every presented
response of 1..2 calls; every pool and re-emission of 1..2 calls) and read
back from the state graph.  One TLC run (about 2 s) for the whole module.

Each comparison is shown to bite: a content-only placement (no ``seen``: the
PlaceByContent twin), a re-emission refused, and a binding that takes the last
equal lost call or binds one twice disagree with the table; and the Session
really decides through ``placement``: swapping in the content-only variant
makes a deliberate repeat of ``call_0`` alias the earlier call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from checker_support import ROOT
from toolledger import Session, Tool
from toolledger._core import placement as pl
from toolledger._core import session as session_module
from toolledger._core.stores import MemoryStore
from toolledger.check.manifest import load_manifest
from toolledger.check.stategraph import load_dot
from toolledger.check.tlc import Outcome, run_tlc

TOOL = "send"  # the spec has one tool; the Python compares (id, name, digest)
Place = Callable[[Sequence[pl.CallKey] | None, bool, Sequence[pl.CallKey]], pl.Placement]
Same = Callable[[Sequence[str], Sequence[str]], list[int | None]]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Any:
    manifest = load_manifest(ROOT)
    entry = manifest.get("PlacementTable")
    dot = Path(tmp_path_factory.mktemp("placement")) / "table.dot"
    result = run_tlc(entry.module, entry.cfg_path, search_dirs=manifest.search_dirs,
                     check_deadlock=entry.check_deadlock, dump_dot=dot)
    assert result.outcome is Outcome.PASS, result.output[-2000:]
    graph = load_dot(dot)
    (state,) = graph.states.values()
    return state["table"]


def keys_of(response: Any) -> list[pl.CallKey]:
    """A spec response (a sequence of [pid, args]) as the Python compares calls."""
    return [(c["pid"], TOOL, c["args"]) for c in response]


def place_rows(table: Any) -> list[tuple[Any, bool, Any, set[str]]]:
    return [(latest, seen, presented, set(answers))
            for (latest, seen, presented), answers in table["place"].items()]


def place_mismatches(table: Any, place: Place) -> list[tuple[Any, bool, Any, set[str], str]]:
    out = []
    for latest, seen, presented, answers in place_rows(table):
        got = place(keys_of(latest) if latest else None, seen, keys_of(presented)).value
        if answers != {got}:
            out.append((latest, seen, presented, answers, got))
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
    assert len(rows) == 21 * 2 * 20  # (none + 20 responses) x seen x 20 responses
    assert {a for *_, answers in rows for a in answers} == {"new", "rerecord", "reemission"}
    assert len(table["same"]) == 7 * 6
    assert any(i != 0 for slots in table["same"].values() for i in slots)


def test_python_placement_is_the_specs_on_every_input(table: Any) -> None:
    assert place_mismatches(table, pl.placement) == []


def test_python_same_call_binding_is_the_specs_on_every_input(table: Any) -> None:
    assert same_mismatches(table, pl.same_call_slots) == []


def content_only(latest: Sequence[pl.CallKey] | None, seen_latest: bool,
                 presented: Sequence[pl.CallKey]) -> pl.Placement:
    """The PlaceByContent twin: ``seen`` ignored."""
    return pl.placement(latest, False, presented)


def refuse_reemission(latest: Sequence[pl.CallKey] | None, seen_latest: bool,
                      presented: Sequence[pl.CallKey]) -> pl.Placement:
    """A re-emission taken for a new response (the lost one never superseded)."""
    got = pl.placement(latest, seen_latest, presented)
    return pl.Placement.NEW if got is pl.Placement.REEMISSION else got


def last_equal(pool: Sequence[str], wanted: Sequence[str]) -> list[int | None]:
    return [max((i for i, p in enumerate(pool) if p == w), default=None) for w in wanted]


def test_broken_python_variants_are_caught(table: Any) -> None:
    repeat = place_mismatches(table, content_only)
    # the deliberate repeat: seen holds the latest's result, the same calls again
    assert any(seen and latest == presented and (answers, got) == ({"new"}, "rerecord")
               for latest, seen, presented, answers, got in repeat)
    assert place_mismatches(table, refuse_reemission)
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
