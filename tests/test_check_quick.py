"""``toolledger check --quick`` runs the rows that exercise what a change touches.

Under test: :mod:`toolledger.check.quick` (diff -> touched definitions ->
models, within a budget) on hand-made diffs, coverage output and tables;
the generated table ``model/exercises.json`` against the manifest and its
readable form ``docs/exercises.md``; and, end to end, the issue-24 mutant
(a guard dropped from EngineReconcileNotApplied) in a git copy of this
repository: ``--quick`` must catch it with a few models.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checker_support import ROOT
from toolledger.check import quick
from toolledger.check.manifest import load_manifest

SPEC = """---- MODULE S ----
VARIABLE x
Init == x = 0

Guard(c) ==
    /\\ x < 3
Up(c) ==
    /\\ Guard(c)
    /\\ x' = x + 1
Next == \\E c \\in {1} : Up(c)
Inv == x <= 3
====
"""


def test_definitions_run_to_the_next_one() -> None:
    assert quick.definitions(SPEC) == [
        ("Init", 3, 4), ("Guard", 5, 6), ("Up", 7, 9), ("Next", 10, 10), ("Inv", 11, 13)]


def test_changed_lines_of_a_zero_context_diff() -> None:
    diff = """diff --git a/spec/S.tla b/spec/S.tla
index 1..2 100644
--- a/spec/S.tla
+++ b/spec/S.tla
@@ -6 +6 @@ Guard(c) ==
-    /\\ x < 3
+    /\\ x < 4
@@ -9,0 +10,2 @@ Up(c) ==
+    /\\ TRUE
+    /\\ TRUE
@@ -11 +12,0 @@
-Inv == x <= 3
diff --git a/reference/toolledger/_core/protocol.py b/reference/toolledger/_core/protocol.py
@@ -10,2 +10,3 @@
"""
    lines = quick.changed_lines(diff)
    assert lines["spec/S.tla"] == ([(6, 6), (9, 9), (11, 11)], [(6, 6), (10, 11), (12, 12)])
    assert lines["reference/toolledger/_core/protocol.py"] == ([(10, 11)], [(10, 12)])


def test_touched_maps_lines_to_definitions_old_and_new(tmp_path: Path) -> None:
    (tmp_path / "spec").mkdir()
    new = SPEC.replace("Inv == x <= 3\n", "")
    (tmp_path / "spec" / "S.tla").write_text(new)
    diff = """diff --git a/spec/S.tla b/spec/S.tla
@@ -6 +6 @@
-    /\\ x < 3
+    /\\ x < 4
@@ -11 +10,0 @@
-Inv == x <= 3
diff --git a/model/MCS.tla b/model/MCS.tla
@@ -1 +1 @@
diff --git a/reference/toolledger/_core/protocol.py b/reference/toolledger/_core/protocol.py
@@ -1 +1 @@
"""
    t = quick.touched(tmp_path, diff, old_text=lambda path: SPEC)
    # Inv was deleted: a line of the old text; its neighbour Next in the new one
    assert t.definitions == {"S": {"Guard", "Inv", "Next"}}  # MCS: line 1 is in no definition
    assert t.model_files == {"MCS.tla"}
    assert t.reference == ["reference/toolledger/_core/protocol.py"]
    assert not t.empty
    assert quick.touched(tmp_path, "").empty


COVERAGE = """\
<Up line 7, col 1 to line 7, col 5 of module S>: 3:3
  line 8, col 8 to line 8, col 15 of module S: 4
  |line 6, col 8 to line 6, col 12 of module S: 4
<Down line 12, col 1 to line 12, col 7 of module S (12 8 13 15)>: 0:0
<Side line 5, col 1 to line 5, col 7 of module S (6 8 6 12)>: 1:2
  line 12, col 8 to line 12, col 15 of module S: 4
  line 13, col 8 to line 13, col 15 of module S: 0
<Inv line 11, col 1 to line 11, col 3 of module S>
  line 11, col 8 to line 11, col 13 of module S: 4
"""


def test_coverage_gives_actions_taken_and_definitions_evaluated() -> None:
    actions, lines = quick.coverage_of(COVERAGE)
    assert actions == {"Up", "Side"}  # Down never taken (0:0), though its guard was evaluated
    assert lines == {"S": {5, 6, 7, 8, 11, 12}}  # 5, 7: the headers of Side and Up
    assert quick.exercised_definitions(lines, {"S": SPEC, "T": "---- MODULE T ----\n===="}) == {
        "S": ["Guard", "Inv", "Up"]}


def _cost(name: str, conf: bool) -> float:
    return {"A": 1.0, "B": 5.0, "C": 2.0, "D": 50.0}[name] * (3 if conf else 1)


def _table() -> dict[str, object]:
    return {"models": {
        "A": {"actions": ["Up"], "definitions": {"S": ["Up", "Guard", "Inv"]}},
        "B": {"actions": ["Up", "Down"], "definitions": {"S": ["Up", "Down", "Guard", "Inv"]}},
        # C evaluates Up's guard but never takes Up: it does not exercise Up
        "C": {"actions": ["Down"], "definitions": {"S": ["Up", "Down", "Guard", "Inv"]}},
        "D": {"actions": ["Up", "Down"], "definitions": {"S": ["Up", "Down", "Guard", "Inv"]}},
    }}


def _select(change: quick.Touched, budget: float = 10.0) -> quick.Selection:
    return quick.select(_table(), change, cost=_cost, ci=["A", "B", "C", "D"],
                        conformance_models=["B", "D"],
                        module_of={m: f"MC{m}" for m in "ABCD"},
                        cfg_of={m: f"{m}.cfg" for m in "ABCD"}, budget=budget)


def test_select_takes_the_models_that_take_a_touched_action_cheapest_first() -> None:
    sel = _select(quick.Touched(definitions={"S": {"Up"}}))
    assert sel.models[0] == "A"  # the cheapest taker first
    assert "C" not in sel.models  # evaluated Up's guard only
    assert set(sel.models) == {"A", "B"} and sel.left_out == 1  # D did not fit
    assert sel.conformance == []  # B's conformance (15) does not fit the budget
    wide = _select(quick.Touched(definitions={"S": {"Up"}}), budget=100.0)
    assert wide.conformance == ["B"] and set(wide.models) == {"A", "B", "D"}
    # an operator (not an action) is exercised by every model that evaluated it
    guard = _select(quick.Touched(definitions={"S": {"Guard"}}), budget=100.0)
    assert set(guard.models) == {"A", "B", "C", "D"}


def test_select_tries_the_must_pass_models_first() -> None:
    """A model expected to pass explores its whole state space; a twin or probe
    (A here) stops at its first violation: B, though dearer, comes first."""
    sel = quick.select(_table(), quick.Touched(definitions={"S": {"Up"}}), cost=_cost,
                       ci=["A", "B", "C", "D"], conformance_models=[],
                       module_of={m: f"MC{m}" for m in "ABCD"},
                       cfg_of={m: f"{m}.cfg" for m in "ABCD"}, budget=6.0, must_pass=["B", "D"])
    assert sel.models == ["B", "A"] and sel.left_out == 1
    assert "cheapest B" in sel.reasons[0]


def test_select_covers_the_reference_and_model_files_and_says_what_is_unknown() -> None:
    ref = _select(quick.Touched(reference=["reference/toolledger/_core/protocol.py"]),
                  budget=100.0)
    assert ref.conformance == ["B"]  # B alone takes every action the conformance models take
    files = _select(quick.Touched(model_files={"MCD.tla"}), budget=1.0)
    assert files.models == ["D"]  # its own model, whatever the budget
    new = _select(quick.Touched(definitions={"S": {"Brand_new"}}))
    assert new.models == [] and new.uncovered == ["S!Brand_new"]


# ---------------------------------------------------------------------------
# The generated table of this repository


# Models whose spec is an initial predicate only ([][FALSE]_vars).
INIT_ONLY = {"MappedInitPartition"}


def test_the_table_covers_every_ci_model_and_the_doc_is_its_rendering() -> None:
    table = quick.load_table(ROOT)
    assert table is not None, "model/exercises.json is missing: run `toolledger exercises`"
    models = table["models"]
    assert isinstance(models, dict)
    manifest = load_manifest(ROOT)
    assert list(models) == [e.name for e in manifest.ci_models()], (
        "model/exercises.json is out of date with the manifest: run `toolledger exercises` "
        "(a few minutes) and commit model/exercises.json and docs/exercises.md")
    for e in manifest.ci_models():
        info = models[e.name]
        # every model takes some action, but the one that checks initial states only
        assert bool(info["actions"]) is (e.name not in INIT_ONLY), e.name
    # docs/exercises.md is exactly what the command writes from the table
    assert (ROOT / quick.DOC).read_text(encoding="utf-8") == quick.markdown(table)
    taking = [n for n, i in models.items() if "EngineReconcileNotApplied" in i["actions"]]
    assert "ReconcileReadonlyOneCrash" in taking and "Renumbered" not in taking


REPO = ROOT
TOOLLEDGER = Path(sys.executable).parent / "toolledger"
GUARD = '    /\\ stage[c] = "reconciling" /\\ applied[e] = 0\n'


def _git_copy(dst: Path) -> Path:
    for d in ("spec", "model", "reference"):
        shutil.copytree(REPO / d, dst / d,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (dst / "docs").mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(dst), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy")
    return dst


@pytest.mark.slow
def test_quick_catches_the_dropped_guard_with_a_few_models(tmp_path: Path) -> None:
    other = _git_copy(tmp_path / "other")
    clean = subprocess.run([str(TOOLLEDGER), "check", "--quick"], cwd=other,
                           capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0 and "nothing changed" in clean.stdout, clean.stdout + clean.stderr
    tla = other / "spec" / "DurableToolExecution.tla"
    text = tla.read_text()
    assert text.count(GUARD) == 1, "the guard this test drops is not in the spec any more"
    tla.write_text(text.replace(GUARD, '    /\\ stage[c] = "reconciling"\n'))
    done = subprocess.run([str(TOOLLEDGER), "check", "--quick", "--json"], cwd=other,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    failed = [r["model"] for r in rows if r["check"] == "tlc" and r["got"] == "AtMostOnceEffect"]
    assert failed, rows
    assert "DurableToolExecution!EngineReconcileNotApplied" in done.stderr
    ci = len(load_manifest(REPO).ci_models())
    tlc_rows = [r for r in rows if r["check"] == "tlc"]
    assert len(tlc_rows) < ci // 3, [r["model"] for r in tlc_rows]  # a few, not the whole check
    assert "the full answer is `toolledger check`" in done.stderr


# ---------------------------------------------------------------------------
# A reference change: which spec actions reach the changed function

CORE = '''from enum import Enum


class Action(Enum):
    Up = "Up"
    Down = "Down"


LIMIT = 3


def _handles(action):
    return lambda f: f


def _guard(x):
    return x < LIMIT


def _step(x):
    return x + 1


@_handles(Action.Up)
def _up(x):
    assert _guard(x)
    return _step(x)


@_handles(Action.Down)
def _down(x):
    return x - 1
'''


def test_python_units_name_functions_handlers_and_constants() -> None:
    units = {name: (first, last, action) for name, first, last, _, action
             in quick.python_units(CORE)}
    assert units["_up"] == (24, 27, "Up")  # from its decorator to its last line
    assert units["_guard"][2] is None and units["LIMIT"] == (9, 9, None)
    assert quick.python_units("def broken(:\n") == []


def test_reference_actions_follow_the_calls_to_the_handlers(tmp_path: Path) -> None:
    core = tmp_path / quick.CORE
    core.mkdir(parents=True)
    (core / "protocol.py").write_text(CORE)
    (core / "other.py").write_text("def unused():\n    return 1\n")
    got = quick.reference_actions(tmp_path, ["_guard", "LIMIT", "_down", "unused", "Action"])
    assert got["_guard"] == {"Up"}  # _up calls it
    assert got["LIMIT"] == {"Up"}  # through _guard
    assert got["_down"] == {"Down"}  # the handler itself
    assert got["unused"] == set()  # no handler reaches it
    assert got["Action"] == {"Up", "Down"}  # both decorators name it


def test_touched_names_the_changed_functions_of_the_reference(tmp_path: Path) -> None:
    path = "reference/toolledger/_core/protocol.py"
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(CORE.replace("x < LIMIT", "x <= LIMIT"))
    diff = f"diff --git a/{path} b/{path}\n@@ -17 +17 @@\n"
    t = quick.touched(tmp_path, diff, old_text=lambda p: CORE)
    assert t.reference == [path] and t.reference_units == {path: {"_guard"}}


def _select_ref(units: set[str | None], actions: dict[str, set[str]],
                path: str = "reference/toolledger/_core/protocol.py") -> quick.Selection:
    change = quick.Touched(reference=[path], reference_units={path: units})
    table = _table()
    return quick.select(table, change, cost=_cost, ci=["A", "B", "C", "D"],
                        conformance_models=["A", "C", "D"],
                        module_of={m: f"MC{m}" for m in "ABCD"},
                        cfg_of={m: f"{m}.cfg" for m in "ABCD"}, budget=10.0,
                        reference_actions=actions)


def test_a_reference_change_selects_the_conformance_rows_taking_its_actions() -> None:
    # _down reaches Down: C (cheapest taker of Down) first, then the cover (A
    # adds Up): an action is too coarse a unit to trust alone
    sel = _select_ref({"_down"}, {"_down": {"Down"}})
    assert sel.conformance == ["C", "A"] and "reached from Down" in sel.reasons[0]
    # Up: A is its cheapest conformance row, first; C then covers Down
    assert _select_ref({"_guard"}, {"_guard": {"Up"}}).conformance == ["A", "C"]
    # a line outside any function, or a function no handler reaches: the cover
    cover = _select_ref({None}, {})
    assert cover.conformance and "every action they take" in cover.reasons[-1]
    assert _select_ref({"unused"}, {"unused": set()}).reasons[-1] == cover.reasons[-1]
    # outside the core (the checker's own code): the cover too
    outside = _select_ref({"_down"}, {"_down": {"Down"}},
                          path="reference/toolledger/check/system.py")
    assert "every action they take" in outside.reasons[-1]


def test_a_touched_invariant_gets_its_twins_and_a_must_pass_checker() -> None:
    """A weakened invariant still holds in every must-pass model: only a twin
    that must violate it sees the change; a strengthened one fails a checker."""
    table = {"models": {
        "P": {"actions": ["Up"], "invariants": ["Inv"], "definitions": {"S": ["Up", "Inv"]}},
        "Q": {"actions": ["Up"], "invariants": ["Inv"], "definitions": {"S": ["Up", "Inv"]}},
        "T1": {"actions": ["Up"], "invariants": ["Inv"], "definitions": {"S": ["Up", "Inv"]}},
        "T2": {"actions": ["Up"], "invariants": ["Inv"], "definitions": {"S": ["Up", "Inv"]}},
        "U": {"actions": ["Up"], "invariants": ["Other"], "definitions": {"S": ["Up"]}},
    }}
    costs = {"P": 1.0, "Q": 2.0, "T1": 5.0, "T2": 3.0, "U": 0.5}
    sel = quick.select(table, quick.Touched(definitions={"S": {"Inv"}}),
                       cost=lambda m, conf: costs[m], ci=list(costs), conformance_models=[],
                       module_of={m: f"MC{m}" for m in costs},
                       cfg_of={m: f"{m}.cfg" for m in costs},
                       budget=9.0, must_pass=["P", "Q", "U"],
                       expects={"P": "pass", "Q": "pass", "T1": "Inv", "T2": "Inv", "U": "pass"})
    assert sel.models[:2] == ["T2", "P"]  # the cheapest twin, the cheapest checker
    assert "T1" in sel.models  # the other twin next, before the other checker Q
    assert "Q" not in sel.models and "U" not in sel.models and sel.left_out == 1
    assert "2 twins must violate it" in sel.reasons[0]
