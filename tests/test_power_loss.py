"""The power-loss harness (``benchmarks/power_loss.py``) on SqliteStore, in ``make test``.

Under test: every file state a power cut may leave while
:class:`~toolledger._core.sqlite_store.SqliteStore` creates a store,
commits a session's calls (one by one and together), checkpoints, and
while a second creator (the loser of a creation race) runs over a store
with data.  The states come from the workload's real system calls
(``strace``), under the ALICE model: unsynced writes lost as any suffix,
torn at 512-byte sectors, unsynced directory entries missing.  The oracle
is what the workload acknowledged (the logical state after each step that
returned, each effect its tool applied): every state opened must be the
last acknowledged one or the one in flight, with every effect's
``dispatched`` durable and no effect applied again by a resume; damage
must fail closed.  Here every state of the two workloads is judged on the
real store (zero incorrect), and the harness is shown to find the planted
directory-fsync and creation bugs and to judge a damaged file as failed
closed; ``make bench`` runs every planted bug.
"""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from benchmarks import power_loss as pl


@cache
def explored(workload: str, variant: str) -> dict[str, Any]:
    return pl.explore(workload, variant)


@pytest.mark.parametrize("workload", pl.WORKLOADS)
def test_every_power_loss_state_of_the_real_store_recovers_correctly(workload: str) -> None:
    row = explored(workload, "real")
    assert row["incorrect"] == 0, row["examples"]
    assert row["outcomes"].get("failed_closed", 0) == 0, row  # a power cut is not damage
    assert row["outcomes"]["recovered"] > 200
    # the model produced every kind of state it claims to
    assert {"prefix", "torn", "none"} <= set(row["kinds"]), row["kinds"]


@pytest.mark.parametrize(("variant", "workload"), [
    ("no-dir-fsync", "session"),  # the new store's directory entry lost after its ACK
    ("replace", "second-creator"),  # a racing creator replaces a store with data
])
def test_the_harness_finds_the_planted_bug(variant: str, workload: str) -> None:
    row = explored(workload, variant)
    assert row["incorrect"] > 0 and "lost" in row["examples"], row


def test_a_damaged_state_is_judged_failed_closed_not_recovered() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        work.mkdir()
        ops = pl.trace("session", "real", work)
        hist = pl.history(ops)
        final = [s for s in pl.crash_states(ops) if s.point == len(ops)][-1]
        assert pl.judge(final, hist, Path(tmp)) == ("recovered", "")
        files = dict(final.files)
        data = bytearray(files[pl.STORE])
        data[:16] = b"not a database!!"
        files[pl.STORE] = bytes(data)
        outcome, why = pl.judge(pl.CrashState(final.point, "damaged", files), hist, Path(tmp))
        assert outcome == "failed_closed" and "is not a SQLite database" in why, why
        # and a state that lost an acknowledged commit is judged lost, not recovered
        early = next(s for s in pl.crash_states(ops) if s.point == hist.ack_at[2] + 1)
        late = pl.CrashState(len(ops), "rolled back", early.files)
        assert pl.judge(late, hist, Path(tmp))[0] == "lost"


def test_the_strace_parser_refuses_what_it_cannot_model() -> None:
    with pytest.raises(ValueError, match="truncated"):
        pl.parse('openat(AT_FDCWD, "\\x2f\\x78", O_RDWR|O_CREAT) = 3\n'
                 'pwrite64(3, "\\x00\\x01"..., 4096, 0) = 4096\n', Path("/"))
