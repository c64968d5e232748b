"""TLC's classes are shared between runs (class-data sharing), safely.

The first run writes the archive into the user's cache directory, later runs
map it; the verdict and the counterexample are the same with and without
it; a damaged archive (a JVM that maps it crashes) is deleted and the run is
repeated without it; ``TOOLLEDGER_CDS=0`` turns it off.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from checker_support import ROOT
from toolledger.check import tlc
from toolledger.check.manifest import load_manifest
from toolledger.check.tlc import Outcome, TLCResult, run_tlc

pytestmark = pytest.mark.slow

PASSING = "DeepIdempotentLegacyNoApproval"  # a 3-state probe (TLC violates its Witness)
VIOLATED = "LegacyResume"  # a 27-state twin with a counterexample


def _run(name: str, **kw: object) -> TLCResult:
    entry = load_manifest(ROOT).get(name)
    return run_tlc(entry.module, entry.cfg_path, search_dirs=[ROOT / "spec", ROOT / "model"],
                   check_deadlock=entry.check_deadlock, **kw)  # type: ignore[arg-type]


def _flags(r: TLCResult, prefix: str) -> list[str]:
    return [a for a in r.command if a.startswith(prefix)]


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(tlc.CDS_ENV, raising=False)
    return tmp_path / "toolledger" / "cds"


def test_the_first_run_writes_the_archive_and_the_next_maps_it(cache: Path) -> None:
    first = _run(VIOLATED)
    assert _flags(first, "-XX:ArchiveClassesAtExit=")
    [archive] = cache.glob("tlc-*.jsa")
    assert archive.stat().st_size > 0
    second = _run(VIOLATED)
    assert _flags(second, "-XX:SharedArchiveFile=") == [f"-XX:SharedArchiveFile={archive}"]
    plain = _run(VIOLATED, class_data_sharing=False)
    assert not _flags(plain, "-XX:SharedArchiveFile") and not _flags(plain, "-XX:Archive")
    for r in (first, second, plain):
        assert r.outcome is Outcome.INVARIANT_VIOLATED
    # the same verdict, state count and counterexample with and without the archive
    assert first.violated == second.violated == plain.violated
    assert first.distinct_states == second.distinct_states == plain.distinct_states
    assert first.trace == second.trace == plain.trace


def test_a_damaged_archive_is_deleted_and_the_run_repeated_without(cache: Path) -> None:
    _run(PASSING)
    [archive] = cache.glob("tlc-*.jsa")
    good = archive.read_bytes()
    archive.write_bytes(good[: len(good) // 10])  # a half-written archive crashes the JVM
    r = _run(PASSING)
    assert not archive.exists() or archive.read_bytes() != good[: len(good) // 10]
    assert not _flags(r, "-XX:SharedArchiveFile")  # the repeated run, without the archive
    expected = load_manifest(ROOT).get(PASSING)
    assert r.distinct_states == expected.distinct_states
    assert r.outcome is Outcome.INVARIANT_VIOLATED


def test_a_new_jar_or_java_gets_a_new_archive(cache: Path, tmp_path: Path) -> None:
    java, jar = tlc.check_java(), tlc.find_jar()
    a = tlc._cds_archive(java, jar, ("-XX:TieredStopAtLevel=1",))
    assert a is not None and a.parent == cache
    assert tlc._cds_archive(java, jar, ()) != a  # other JVM flags
    other = tmp_path / "tla2tools.jar"
    other.write_bytes(jar.read_bytes())
    assert tlc._cds_archive(java, other, ("-XX:TieredStopAtLevel=1",)) != a  # another jar


def test_off_by_environment(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tlc.CDS_ENV, "0")
    r = _run(PASSING)
    assert not _flags(r, "-XX:SharedArchiveFile") and not _flags(r, "-XX:Archive")
    assert not cache.exists()
