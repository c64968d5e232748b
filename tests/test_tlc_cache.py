"""The cache of TLC runs (toolledger.check.tlccache) answers only identical inputs.

Oracles: TLC's own result of the same run (a cached answer must equal it
field by field, the counterexample included), and a JVM that must start
again whenever any input changes (a byte of a module, the cfg, an option).
A cached answer is marked ``cached``; nothing but complete verdicts is kept,
and a state-graph dump only when it is the whole graph (the run passed).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from checker_support import ROOT
from toolledger.check import tlccache
from toolledger.check.stategraph import load_dot
from toolledger.check.tlc import Outcome, TLCResult, run_tlc
from toolledger.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "tla"


def _copy(tmp: Path) -> Path:
    d = tmp / "tla"
    shutil.copytree(FIXTURES, d)
    return d


def _run(d: Path, cfg: str, cache: Path | None, **kw: object) -> TLCResult:
    return run_tlc("Ledger", d / f"{cfg}.cfg", search_dirs=[d], check_deadlock=True,
                   cache=cache, **kw)  # type: ignore[arg-type]


def _same(a: TLCResult, b: TLCResult) -> None:
    assert replace(a, cached=False) == replace(b, cached=False)


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.json"))


def test_a_second_identical_run_is_answered_from_the_cache(tmp_path: Path) -> None:
    d, cache = _copy(tmp_path), tmp_path / "cache"
    first = _run(d, "LedgerRetry", cache)
    assert first.outcome is Outcome.INVARIANT_VIOLATED and not first.cached and first.trace
    assert len(_entries(cache)) == 1
    again = _run(d, "LedgerRetry", cache)
    assert again.cached
    _same(first, again)  # the same verdict, counts and counterexample
    # an option TLC reads is an input: another key, a real run
    other = _run(d, "LedgerRetry", cache, fp=1)
    assert not other.cached and other.violated == first.violated
    assert len(_entries(cache)) == 2


def test_any_changed_input_is_a_new_run(tmp_path: Path) -> None:
    d, cache = _copy(tmp_path), tmp_path / "cache"
    passed = _run(d, "LedgerPass", cache)
    assert passed.outcome is Outcome.PASS and not passed.cached
    cfg = d / "LedgerPass.cfg"
    cfg.write_text(cfg.read_text() + "\n")
    assert not _run(d, "LedgerPass", cache).cached
    assert _run(d, "LedgerPass", cache).cached


def test_the_key_covers_the_modules_a_run_reads_transitively_and_no_other(
        tmp_path: Path) -> None:
    """Ledger EXTENDS Extra, which INSTANCEs Deeper: a byte of either is a new
    run (the broken variant, a key of the model's own module only, would answer
    the old verdict); a module beside them that none names is not an input."""
    d, cache = _copy(tmp_path), tmp_path / "cache"
    (d / "Deeper.tla").write_text("---- MODULE Deeper ----\nLimit == 3\n====\n")
    (d / "Extra.tla").write_text("---- MODULE Extra ----\nD == INSTANCE Deeper\n====\n")
    ledger = d / "Ledger.tla"
    text = ledger.read_text().replace("EXTENDS Naturals,", "EXTENDS Extra, Naturals,", 1)
    ledger.write_text(text)
    files = {p.name: p for p in d.glob("*.tla")}
    assert tlccache.read_set("Ledger", (d / "LedgerPass.cfg").read_bytes(), files) == [
        "Deeper.tla", "Extra.tla", "Ledger.tla"]
    first = _run(d, "LedgerPass", cache)
    assert first.outcome is Outcome.PASS and not first.cached
    # a module TLC does not read is copied next to the cfg, but is no input
    (d / "Stuck.tla").write_text((d / "Stuck.tla").read_text() + "\n\\* a comment\n")
    assert _run(d, "LedgerPass", cache).cached
    for name in ("Deeper.tla", "Extra.tla"):
        (d / name).write_text((d / name).read_text() + "\\* changed\n")
        assert not _run(d, "LedgerPass", cache).cached, name
        assert _run(d, "LedgerPass", cache).cached, name


def test_a_module_named_only_in_a_comment_or_a_string_is_no_input(tmp_path: Path) -> None:
    """A spec that mentions a twin module in a comment (the main spec names
    ConcurrentResumers, a twin module its MC module) must not make every
    edit of that module a miss for every model: only the words of the code
    count.  Nested comments and escaped quotes are comments and strings."""
    d, cache = _copy(tmp_path), tmp_path / "cache"
    (d / "Extra.tla").write_text("---- MODULE Extra ----\nX == 1\n====\n")
    (d / "Deeper.tla").write_text("---- MODULE Deeper ----\nY == 2\n====\n")
    ledger = d / "Ledger.tla"
    ledger.write_text(ledger.read_text().replace(
        "====", '\\* see Extra\n(* Deeper (* and Extra, nested *) Deeper *)\n'
        'Label == "Extra \\" Deeper"\n====', 1))
    files = {p.name: p for p in d.glob("*.tla")}
    assert tlccache.read_set("Ledger", (d / "LedgerPass.cfg").read_bytes(), files) == [
        "Ledger.tla"]
    assert not _run(d, "LedgerPass", cache).cached
    (d / "Extra.tla").write_text("---- MODULE Extra ----\nX == 3\n====\n")
    assert _run(d, "LedgerPass", cache).cached
    # the same name in the code is a module TLC reads: an input
    ledger.write_text(ledger.read_text().replace('Label ==', 'E == INSTANCE Extra\nLabel ==', 1))
    assert tlccache.read_set("Ledger", (d / "LedgerPass.cfg").read_bytes(), files) == [
        "Extra.tla", "Ledger.tla"]


def test_a_run_that_read_a_module_outside_its_key_is_not_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read set may only be too large: were it ever too small (a module
    SANY parsed that the key did not cover), the run's output shows it
    ("Parsing file ...") and the entry is not written, so a later edit of
    that module can never be answered with this verdict."""
    d, cache = _copy(tmp_path), tmp_path / "cache"
    (d / "Extra.tla").write_text("---- MODULE Extra ----\nX == 1\n====\n")
    ledger = d / "Ledger.tla"
    ledger.write_text(ledger.read_text().replace("EXTENDS Naturals,", "EXTENDS Extra, Naturals,",
                                                 1))
    real = tlccache.read_set
    monkeypatch.setattr(tlccache, "read_set",
                        lambda m, c, f: [n for n in real(m, c, f) if n != "Extra.tla"])
    assert _run(d, "LedgerPass", cache).outcome is Outcome.PASS
    assert _entries(cache) == []
    monkeypatch.setattr(tlccache, "read_set", real)
    assert not _run(d, "LedgerPass", cache).cached
    assert len(_entries(cache)) == 1 and _run(d, "LedgerPass", cache).cached


def test_only_complete_verdicts_and_whole_dumps_are_kept(tmp_path: Path) -> None:
    d, cache = _copy(tmp_path), tmp_path / "cache"
    timed_out = run_tlc("Ledger", d / "LedgerBig.cfg", search_dirs=[d], check_deadlock=False,
                        timeout=2, cache=cache)
    assert timed_out.outcome is Outcome.TIMEOUT
    broken = run_tlc("Broken", d / "Broken.cfg", search_dirs=[d], check_deadlock=True,
                     cache=cache)
    assert broken.outcome is Outcome.PARSE_ERROR
    # a run stopped at a violation dumped a prefix of the graph: never kept
    partial = _run(d, "LedgerRetry", cache, dump_dot=tmp_path / "partial.dot")
    assert partial.outcome is Outcome.INVARIANT_VIOLATED
    assert (tmp_path / "partial.dot").stat().st_size > 0
    assert _entries(cache) == []
    assert not _run(d, "LedgerRetry", cache, dump_dot=tmp_path / "partial.dot").cached


def test_a_whole_dump_is_kept_and_copied_to_the_next_identical_run(tmp_path: Path) -> None:
    d, cache = _copy(tmp_path), tmp_path / "cache"
    first = _run(d, "LedgerPass", cache, dump_dot=tmp_path / "a.dot")
    assert first.outcome is Outcome.PASS and not first.cached
    [entry] = [e for e in _entries(cache) if e.with_suffix(".dot").exists()]
    assert entry.with_suffix(".dot").read_bytes() == (tmp_path / "a.dot").read_bytes()
    again = _run(d, "LedgerPass", cache, dump_dot=tmp_path / "sub" / "b.dot")
    assert again.cached
    _same(first, again)
    # the very graph TLC dumped, read back the same
    assert (tmp_path / "sub" / "b.dot").read_bytes() == (tmp_path / "a.dot").read_bytes()
    assert load_dot(tmp_path / "sub" / "b.dot") == load_dot(tmp_path / "a.dot")
    # the dumped run also answers the same run without a dump (its verdict)...
    plain = _run(d, "LedgerPass", cache)
    assert plain.cached and len(_entries(cache)) == 2
    assert (plain.outcome, plain.distinct_states) == (first.outcome, first.distinct_states)
    # ...but a verdict without a dump never answers a run that wants the graph
    other = _run(d, "LedgerPass", cache, fp=1)
    assert not other.cached
    assert not _run(d, "LedgerPass", cache, fp=1, dump_dot=tmp_path / "c.dot").cached
    assert load_dot(tmp_path / "c.dot").states.keys() != load_dot(tmp_path / "a.dot").states.keys()


def test_a_changed_module_misses_the_dump_cache(tmp_path: Path) -> None:
    """The broken variant: a module that allows one more step has another
    graph; a cache that answered it with the old dump would hide the change."""
    d, cache = _copy(tmp_path), tmp_path / "cache"
    before = _run(d, "LedgerPass", cache, dump_dot=tmp_path / "before.dot")
    ledger = d / "Ledger.tla"
    text = ledger.read_text()
    # Ack no longer needs the engine up: more edges, the same states
    assert "Ack(c) == /\\ up\n" in text
    ledger.write_text(text.replace("Ack(c) == /\\ up\n", "Ack(c) == /\\ TRUE\n", 1))
    after = _run(d, "LedgerPass", cache, dump_dot=tmp_path / "after.dot")
    assert not after.cached and after.outcome is Outcome.PASS
    old, new = load_dot(tmp_path / "before.dot"), load_dot(tmp_path / "after.dot")
    assert len(new.edges) > len(old.edges)
    assert before.outcome is Outcome.PASS and len(_entries(cache)) == 4  # with their verdicts
    # and the new entry answers the new module with the new graph
    assert _run(d, "LedgerPass", cache, dump_dot=tmp_path / "again.dot").cached
    assert load_dot(tmp_path / "again.dot") == new


def test_an_entry_whose_dump_is_gone_or_cut_is_a_miss(tmp_path: Path) -> None:
    d, cache = _copy(tmp_path), tmp_path / "cache"
    _run(d, "LedgerPass", cache, dump_dot=tmp_path / "a.dot")
    [dump] = sorted(cache.rglob("*.dot"))
    whole = dump.read_bytes()
    dump.write_bytes(whole[: len(whole) // 2])  # a dump cut short
    assert not _run(d, "LedgerPass", cache, dump_dot=tmp_path / "b.dot").cached
    assert (tmp_path / "b.dot").read_bytes() == whole  # the real run's, and kept again
    assert dump.read_bytes() == whole
    dump.unlink()
    assert not _run(d, "LedgerPass", cache, dump_dot=tmp_path / "c.dot").cached
    assert _run(d, "LedgerPass", cache, dump_dot=tmp_path / "d.dot").cached


def test_a_damaged_entry_is_a_miss_and_is_replaced(tmp_path: Path) -> None:
    d, cache = _copy(tmp_path), tmp_path / "cache"
    first = _run(d, "LedgerPass", cache)
    [entry] = _entries(cache)
    entry.write_text("{not json")
    again = _run(d, "LedgerPass", cache)
    assert not again.cached  # a real run: same verdict, its own time and output
    assert (again.outcome, again.distinct_states) == (first.outcome, first.distinct_states)
    data = json.loads(entry.read_text())
    assert data["key"] == entry.stem and data["v"] == tlccache._VERSION
    # an entry under another key's name is not trusted either
    data["key"] = "0" * 64
    entry.write_text(json.dumps(data))
    assert not _run(d, "LedgerPass", cache).cached


def test_no_cache_without_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(tlccache.CACHE_ENV, raising=False)
    assert tlccache.cache_from_env() is None
    monkeypatch.setenv(tlccache.CACHE_ENV, str(tmp_path))
    assert tlccache.cache_from_env() == tmp_path


def test_check_with_tlc_cache_marks_the_rows_it_did_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    args = ["check", "--root", str(ROOT), "--model", "CancelIgnored", "--tlc-cache", str(cache)]

    def row() -> dict[str, Any]:
        assert main([*args, "--json"]) == 0
        rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
        [r] = [r for r in rows if (r["model"], r["check"]) == ("CancelIgnored", "tlc")]
        return r

    cold, warm = row(), row()
    assert (cold["cached"], warm["cached"]) == (False, True)
    assert warm["status"] == "ok" and warm["distinct_states"] == cold["distinct_states"] == 5
    assert main(args) == 0
    assert " cached  ok" in capsys.readouterr().out  # the table says so too


def test_the_notebooks_manifest_runs_use_the_cache_of_make_test(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from toolledger.check.manifest import load_manifest
    from toolledger.notebook.support import run_manifest_model

    monkeypatch.setenv(tlccache.CACHE_ENV, str(tmp_path / "cache"))
    manifest = load_manifest(ROOT)
    first = run_manifest_model(manifest, "CancelIgnored").result
    again = run_manifest_model(manifest, "CancelIgnored").result
    assert (first.cached, again.cached) == (False, True)
    assert again.violated == first.violated == "CancelledNeverInvoked"
