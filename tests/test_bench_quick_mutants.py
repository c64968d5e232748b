"""benchmarks/bench_quick.py's mutants still apply to the code they mutate.

Each mutant is a text edit that must occur exactly once in its file; when the
code moves, the benchmark would stop at that mutant after running the others
(about half an hour).  This keeps the set in step with the tree.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import bench_quick
from checker_support import ROOT


def test_every_mutant_applies_once_and_changes_its_file() -> None:
    assert bench_quick.stale(ROOT, bench_quick.MUTANTS) == []
    for m in bench_quick.MUTANTS:
        assert m.old != m.new, m.name
    assert {m.kind for m in bench_quick.MUTANTS} == {"spec", "reference"}


def test_a_mutant_whose_text_moved_is_named(tmp_path: Path) -> None:
    m = bench_quick.MUTANTS[0]
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text("the code moved\n", encoding="utf-8")
    assert bench_quick.stale(tmp_path, [m]) == [
        f"mutant {m.name}: its text occurs 0 times in {m.path} (must be once)"]
