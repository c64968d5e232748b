"""load_dot rebuilds exactly the state graph TLC explored.

Under test: ``toolledger.check.stategraph`` on real ``-dump dot,actionlabels``
files written by TLC 2.15 through ``run_tlc``. Oracles: TLC's own counts (one
node per distinct state; one edge per generated successor, i.e. generated
minus initial states), the spec's Init and actions, and BFS distances that
are known by construction.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolledger.check.stategraph import StateGraph, StateGraphError, load_dot
from toolledger.check.tlavalues import FnValue
from toolledger.check.tlc import Outcome, TLCResult, TraceStep, run_tlc

FIXTURES = Path(__file__).parent / "fixtures" / "tla"


def dump(
    tmp_path: Path, cfg: str, module: str, *, check_deadlock: bool
) -> tuple[TLCResult, StateGraph]:
    out = tmp_path / f"{cfg}.dot"
    r = run_tlc(
        module,
        FIXTURES / f"{cfg}.cfg",
        search_dirs=[FIXTURES],
        check_deadlock=check_deadlock,
        dump_dot=out,
    )
    assert r.outcome is Outcome.PASS, r.error_text
    return r, load_dot(out)


@pytest.mark.slow
def test_ledger_dump_matches_tlc_counts_and_spec(tmp_path: Path) -> None:
    r, g = dump(tmp_path, "LedgerPass", "Ledger", check_deadlock=True)
    assert len(g.states) == r.distinct_states == 108
    assert r.generated_states is not None and r.initial_states == 1
    assert len(g.edges) == r.generated_states - r.initial_states == 188
    for src, dst, _ in g.edges:
        assert src in g.states and dst in g.states

    # Initial states are the ones TLC marks "style = filled": here exactly Init.
    assert len(g.initial) == 1
    (init,) = g.initial
    s0 = g.states[init]
    assert s0["status"] == {"c1": "idle", "c2": "idle"}
    assert s0["ledger"] == {
        "c1": {"attempts": 0, "result": frozenset()},
        "c2": {"attempts": 0, "result": frozenset()},
    }
    assert s0["log"] == () and s0["up"] is True

    # Edge labels are the action operator names, without parameters.
    assert g.actions() == {"Dispatch", "Complete", "Ack", "Crash", "Recover", "Done"}
    # An action that leaves the state unchanged is written as a self-loop; only Done does.
    loops = {label for src, dst, label in g.edges if src == dst}
    assert loops == {"Done"}
    assert [label for _, label in g.successors(init)].count("Dispatch") == 2
    assert {label for _, label in g.predecessors(init)} == {"Recover"}


@pytest.mark.slow
def test_shortest_paths_and_reproductions(tmp_path: Path) -> None:
    r, g = dump(tmp_path, "LedgerPass", "Ledger", check_deadlock=True)

    def status_is(c1: str, c2: str) -> list[int]:
        return list(g.find(lambda s: s["status"] == {"c1": c1, "c2": c2} and s["up"] is True))

    first_dispatch = FnValue(
        {
            "c1": FnValue({"attempts": 1, "result": frozenset()}),
            "c2": FnValue({"attempts": 0, "result": frozenset()}),
        }
    )
    (one,) = [n for n in status_is("dispatched", "idle") if g.states[n]["ledger"] == first_dispatch]
    assert [a for _, a in g.shortest_path(one)] == ["Init", "Dispatch"]

    done = status_is("acked", "acked")
    assert done
    longest = max(len(g.shortest_path(n)) for n in g.states)
    assert longest == r.depth  # TLC's depth is the BFS depth, counting the initial state
    path = g.shortest_path(done[0])
    assert len(path) == 7  # Init + 2 x (Dispatch, Complete, Ack)
    assert sorted(a for _, a in path[1:]) == [
        "Ack",
        "Ack",
        "Complete",
        "Complete",
        "Dispatch",
        "Dispatch",
    ]

    steps = g.trace_to(done[0])
    assert all(isinstance(s, TraceStep) for s in steps)
    assert [s.index for s in steps] == list(range(1, 8))
    assert steps[0].action == "Init" and steps[-1].state == g.states[done[0]]
    ledger = steps[-1].state["ledger"]
    assert isinstance(ledger, FnValue)

    with pytest.raises(KeyError, match="not in the graph"):
        g.shortest_path(12345)


@pytest.mark.slow
def test_one_variable_spec_and_terminal_states(tmp_path: Path) -> None:
    _, g = dump(tmp_path, "Stuck", "Stuck", check_deadlock=False)
    x = {n: s["x"] for n, s in g.states.items()}
    assert sorted(x.values(), key=str) == [0, 1, 2]
    assert [g.states[n] for n in g.initial] == [{"x": 0}]
    assert sorted(((x[a], x[b], lab) for a, b, lab in g.edges), key=str) == [
        (0, 1, "Inc"),
        (1, 2, "Inc"),
    ]
    assert [g.states[n] for n in g.terminal()] == [{"x": 2}]


@pytest.mark.slow
def test_dump_ids_are_identical_run_to_run(tmp_path: Path) -> None:
    _, g1 = dump(tmp_path / "a", "Stuck", "Stuck", check_deadlock=False)
    _, g2 = dump(tmp_path / "b", "Stuck", "Stuck", check_deadlock=False)
    assert g1.states == g2.states  # same fingerprints: run_tlc passes -fp 0
    assert g1.edges == g2.edges


def test_malformed_dump_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.dot"
    bad.write_text(
        "strict digraph DiskGraph {\n"
        "nodesep=0.35;\n"
        '1 [label="x = 0",style = filled]\n'
        '2 [label="x = <<1",style = filled]\n'
    )
    with pytest.raises(StateGraphError, match=r"bad\.dot:4: state 2: in the value of variable 'x'"):
        load_dot(bad)
    bad.write_text("strict digraph DiskGraph {\n3 [shape=box]\n")
    with pytest.raises(StateGraphError, match=r"bad\.dot:2: malformed node line"):
        load_dot(bad)
    bad.write_text("strict digraph DiskGraph {\n3 -> 4 [color=red];\n")
    with pytest.raises(StateGraphError, match=r"bad\.dot:2: malformed edge line"):
        load_dot(bad)
    bad.write_text("hello\n")
    with pytest.raises(StateGraphError, match="not a TLC dot dump"):
        load_dot(bad)


def test_handwritten_dump_in_tlc_format(tmp_path: Path) -> None:
    # The exact line shapes TLC 2.15 writes (copied from a real dump).
    f = tmp_path / "g.dot"
    f.write_text(
        "strict digraph DiskGraph {\n"
        "nodesep=0.35;\n"
        "subgraph cluster_graph {\n"
        'color="white";\n'
        '-1 [label="/\\\\ s = \\"a\\\\\\"b\\"\\n/\\\\ x = -1",style = filled]\n'
        '-1 -> 7 [label="Step",color="black",fontcolor="black"];\n'
        '7 [label="/\\\\ s = \\"a\\\\\\"b\\"\\n/\\\\ x = 0"];\n'
        '7 -> 7 [label="Bump",color="black",fontcolor="black"];\n'
        '-1 -> 7 [label="Step",color="black",fontcolor="black"];\n'
        "{rank = same; -1;}\n"
        "}\n"
        "}\n"
    )
    g = load_dot(f)
    assert g.states == {-1: {"s": 'a"b', "x": -1}, 7: {"s": 'a"b', "x": 0}}
    assert g.initial == {-1}
    assert g.edges == [(-1, 7, "Step"), (7, 7, "Bump"), (-1, 7, "Step")]  # duplicates kept
    assert g.states[-1]["s"] is g.states[7]["s"]  # shared through the parser cache
    assert g.shortest_path(7) == [(-1, "Init"), (7, "Step")]
    assert g.terminal() == []
