"""The on-call commands ``toolledger halted``, ``status`` and ``resolve`` (toolledger.opscmd).

Real stores, real engine processes SIGKILLed inside a tool, real ``toolledger``
subprocesses.  Oracles: exit codes, the listed keys, the audit rows (who
resolved), the effects the external system saw (a file of lines, one per
email sent), and that the read-only commands leave every stored session
exactly as it was (the store's whole state before and after).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pg_cluster import PgCluster
from toolledger import Attempt, MemoryStore, Next, Session, SqliteStore
from toolledger._core.commit_plan import AuditRow, attributed_note
from toolledger._core.protocol import Authorization, InvalidInput
from toolledger._core.stores import Store

CLI = [sys.executable, "-m", "toolledger.cli"]

# An engine process: a manual email tool, approved, killed after the email went
# out and before its outcome was saved.  argv: STORE, SESSION, OUTBOX, [schema].
ENGINE = """
import os, signal, sys
from toolledger import Session
def open_store():
    if sys.argv[1].startswith("postgresql://"):
        from toolledger import PostgresStore
        return PostgresStore(sys.argv[1], schema=sys.argv[4])
    from toolledger import SqliteStore
    return SqliteStore(sys.argv[1])
store = open_store()
s = Session.open(store, sys.argv[2], {"send_email": "manual"})
[st] = s.record(0, [{"id": "call_0", "name": "send_email", "arguments": {"to": "bob"}}])
s.approve(st.call.key)
def send(a):
    with open(sys.argv[3], "a") as f:
        f.write(f"email to bob, key {a.execution_id}\\n")
    os.kill(os.getpid(), signal.SIGKILL)  # after the effect, before its outcome is saved
s.execute(st.call.key, send)
"""


def crashed_engine(store: str, sid: str, outbox: Path, schema: str = "") -> None:
    done = subprocess.run([sys.executable, "-c", ENGINE, store, sid, str(outbox), schema],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr


def toolledger(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def snapshot(store: Store) -> dict[str, object]:
    out: dict[str, object] = {}
    for sid in store.sessions():
        out[sid] = (store.load(sid), store.audit(sid))
    return out


def awaiting_approval(store: Store, sid: str) -> str:
    s = Session.open(store, sid, {"send_email": "manual"})
    [st] = s.record(0, [{"id": "call_9", "name": "send_email", "arguments": {"to": "eve"}}])
    assert st.next is Next.AWAIT_APPROVAL
    return st.call.key


def test_a_crash_is_listed_resolved_by_name_and_the_retry_runs_once(tmp_path: Path) -> None:
    db, outbox = tmp_path / "ledger.db", tmp_path / "outbox"
    crashed_engine(str(db), "s1", outbox)
    assert outbox.read_text().count("email to bob") == 1
    with SqliteStore(db) as store:
        before = snapshot(store)

    listed = toolledger("halted", str(db))
    assert listed.returncode == 3, listed.stderr
    [line, summary] = listed.stdout.splitlines()
    assert summary == "1 halted, 0 waiting for approval"
    sid, key, tool, args, *_rest = line.split("  ")
    assert (sid, tool, json.loads(args)) == ("s1", "send_email", {"to": "bob"})
    assert "attempt 1  halted" in line and "policy manual" in line
    status = toolledger("status", str(db), "s1")
    assert status.returncode == 0 and f"{key}  send_email" in status.stdout
    assert "halted" in status.stdout
    assert toolledger("status", str(db)).stdout == "s1: 1 halted\n"
    with SqliteStore(db) as store:  # halted and status wrote nothing, not even recover()
        assert snapshot(store) == before

    # The on-call engineer checked with bob: the email went out.
    done = toolledger("resolve", str(db), key, "applied", "--by", "alice", "--note", "bob has it")
    assert done.returncode == 0, done.stderr
    assert "resolved applied by alice: next result" in done.stdout
    assert toolledger("halted", str(db)).returncode == 0
    with SqliteStore(db) as store:
        [human] = [r for r in store.audit("s1") if r.kind == "human_applied"]
        assert (human.by, human.human_note, human.execution_id) == ("alice", "bob has it", key)
        s = Session.open(store, "s1", {"send_email": "manual"})  # the engine restarts
        [st] = s.recover()
        assert (st.call.key, st.next, st.attempt) == (key, Next.RESULT, 1)
        assert st.result is not None and "applied" in st.result.content
        with pytest.raises(InvalidInput):  # it has its result: it never runs again
            s.execute(key, lambda a: "sent again")
    assert outbox.read_text().count("email to bob") == 1  # the email went out once
    assert toolledger("status", str(db)).stdout == "s1: 1 result\n"


# A new engine process that resumes the session: recover(), then run every call
# whose next is retry with a tool that sends the email and returns.  argv: STORE,
# SESSION, OUTBOX, and "old" for the control: an engine that does not read a
# human's retry grant (the rule before the grant was durable).
RESUMER = """
import json, sys
from toolledger import Next, Session, SqliteStore
if sys.argv[4:] == ["old"]:
    from toolledger._core.state import SessionState
    SessionState.retry_granted = lambda self, c: False
store = SqliteStore(sys.argv[1])
s = Session.open(store, sys.argv[2], {"send_email": "manual"})
def send(a):
    with open(sys.argv[3], "a") as f:
        f.write(f"email to bob, key {a.execution_id}, attempt {a.attempt}\\n")
    return "sent"
out = []
for st in s.recover():
    if st.next is Next.RETRY:
        st = s.execute(st.call.key, send)
    out.append([st.call.key, st.next.value, st.attempt])
print(json.dumps(out))
"""


def resumed(db: Path, outbox: Path, *old: str) -> list[list[object]]:
    done = subprocess.run([sys.executable, "-c", RESUMER, str(db), "s1", str(outbox), *old],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out: list[list[object]] = json.loads(done.stdout)
    return out


def test_a_retry_from_the_command_line_is_run_once_by_the_next_engine(
    tmp_path: Path,
) -> None:
    """``retry`` records a durable grant (the ``human_retry`` row for attempt 2) and
    runs nothing; the next engine process's recover() honours it: attempt 2 is sent
    once, by that engine, authorized by the human.  Counted at the external side
    (the outbox): the crashed attempt's email and the retry's, nothing more."""
    db, outbox = tmp_path / "ledger.db", tmp_path / "outbox"
    crashed_engine(str(db), "s1", outbox)
    listed = toolledger("halted", str(db))
    assert listed.returncode == 3 and "attempt 1  halted" in listed.stdout, listed
    key = listed.stdout.split("  ")[1]
    done = toolledger("resolve", str(db), key, "retry", "--by", "alice", "--note", "bounced")
    assert done.returncode == 0, done.stderr
    assert "resolved retry by alice: next retry" in done.stdout
    assert "attempt 2 is granted" in done.stdout
    assert outbox.read_text().count("email to bob") == 1  # the command sent nothing
    # nothing waits for a human: the grant waits for an engine
    listed = toolledger("halted", str(db))
    assert listed.returncode == 0 and listed.stdout == "0 halted, 0 waiting for approval\n"
    status = toolledger("status", str(db), "s1")
    assert "attempt 1  retry" in status.stdout and "[resolved retry by alice]" in status.stdout

    assert resumed(db, outbox) == [[key, "result", 2]]
    assert outbox.read_text().splitlines()[1:] == [f"email to bob, key {key}, attempt 2"]
    assert resumed(db, outbox) == [[key, "result", 2]]  # again: nothing more is sent
    assert outbox.read_text().count("email to bob") == 2
    assert toolledger("halted", str(db)).returncode == 0
    assert toolledger("status", str(db)).stdout == "s1: 1 result\n"
    with SqliteStore(db) as store:
        rows = store.audit("s1")
        [grant] = [r for r in rows if r.kind == "human_retry"]
        assert (grant.attempt, grant.by, grant.human_note) == (2, "alice", "bounced")
        [second] = [r for r in rows if r.kind == "dispatch" and r.attempt == 2]
        assert second.authorization is Authorization.HUMAN
    # the grant was used: a second retry needs a new answer, of a new halt
    again = toolledger("resolve", str(db), key, "retry", "--by", "alice")
    assert again.returncode == 2 and "is not halted for a human" in again.stderr


def test_control_an_engine_that_ignores_the_grant_halts_the_call_again(
    tmp_path: Path,
) -> None:
    """The control: the same operator's answer, read by an engine that does not
    honour a human's retry grant (the old rule): the call is halted again at
    attempt 1, nothing is sent, and the operator is asked again."""
    db, outbox = tmp_path / "ledger.db", tmp_path / "outbox"
    crashed_engine(str(db), "s1", outbox)
    key = toolledger("halted", str(db)).stdout.split("  ")[1]
    assert toolledger("resolve", str(db), key, "retry", "--by", "alice").returncode == 0
    assert resumed(db, outbox, "old") == [[key, "halted", 1]]
    assert outbox.read_text().count("email to bob") == 1
    # the grant is still in the store: a current engine runs it
    assert resumed(db, outbox) == [[key, "result", 2]]
    assert outbox.read_text().count("email to bob") == 2


def test_applied_without_a_result_and_pending_approvals_are_listed(tmp_path: Path) -> None:
    db, outbox = tmp_path / "ledger.db", tmp_path / "outbox"
    crashed_engine(str(db), "s1", outbox)
    with SqliteStore(db) as store:
        waiting = awaiting_approval(store, "s2")
    listed = toolledger("halted", str(db))
    assert listed.returncode == 3
    assert listed.stdout.splitlines()[-1] == "1 halted, 1 waiting for approval"
    assert f"s2  {waiting}  send_email" in listed.stdout and "waits for approval" in listed.stdout
    only = toolledger("halted", str(db), "--session", "s1")
    assert only.stdout.splitlines()[-1] == "1 halted, 0 waiting for approval"
    key = only.stdout.split("  ")[1]

    done = toolledger("resolve", str(db), key, "applied", "--by", "alice")  # no --result
    assert done.returncode == 0, done.stderr
    with SqliteStore(db) as store:
        [human] = [r for r in store.audit("s1") if r.kind == "human_applied"]
        assert (human.by, human.human_note) == ("alice", "resolved by a human: applied")
        [st] = Session.open(store, "s1").recover()
        assert st.next is Next.RESULT and st.result is not None
        assert "applied" in st.result.content
    assert toolledger("halted", str(db), "--session", "s1").returncode == 0
    assert toolledger("halted", str(db)).returncode == 3  # s2 still waits for its approval


def test_refusals_write_nothing_and_say_what_was_wrong(tmp_path: Path) -> None:
    db, outbox = tmp_path / "ledger.db", tmp_path / "outbox"
    crashed_engine(str(db), "s1", outbox)
    with SqliteStore(db) as store:
        waiting = awaiting_approval(store, "s2")
        before = snapshot(store)
    key = toolledger("halted", str(db), "--session", "s1").stdout.split("  ")[1]
    cases = {
        ("resolve", str(db), "nope", "retry", "--by", "a"): "no open or recent call with key",
        ("resolve", str(db), waiting, "retry", "--by", "a"): "not halted for a human "
                                                              "(next: await_approval)",
        ("resolve", str(db), key, "retry", "--by", "a", "--result", "x"): "--result is only "
                                                                           "for applied",
        ("resolve", str(db), key, "retry", "--by", " "): "--by ' ': name who answers",
        ("status", str(db), "s9"): "no session 's9'",
        ("halted", str(tmp_path / "missing.db")): "missing.db is not a file",
        ("halted", "mysql://x/y"): "not a store",
        ("halted", "postgresql://nobody@127.0.0.1:1/x"): "127.0.0.1",
    }
    for argv, said in cases.items():
        got = toolledger(*argv)
        assert got.returncode == 2, (argv, got)
        assert said in got.stderr and len(got.stderr.strip().splitlines()) == 1, (argv, got)
    bad = toolledger("resolve", str(db), key, "maybe", "--by", "a")
    assert bad.returncode == 2 and "invalid choice: 'maybe'" in bad.stderr
    assert not (tmp_path / "missing.db").exists()  # a typo never creates a store
    with SqliteStore(db) as store:
        assert snapshot(store) == before


def test_a_damaged_store_exits_1(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    db.write_bytes(b"not a database at all" * 10)
    got = toolledger("halted", str(db))
    assert got.returncode == 1 and "is not a SQLite database" in got.stderr


def test_the_attribution_is_a_note_no_note_can_forge() -> None:
    row = AuditRow("s", "e", "", (0, 0), "human_retry", 1, Authorization.HUMAN, "recovery_required",
                   note=attributed_note("checked", "alice"))
    assert (row.by, row.human_note) == ("alice", "checked")
    forged = attributed_note('{"by": "mallory", "note": "x"}', None)
    assert AuditRow("s", "e", "", (0, 0), "human_retry", 1, Authorization.HUMAN,
                    "recovery_required", note=forged).by is None
    assert attributed_note("plain", None) == "plain"  # old notes, old rows: unchanged
    with pytest.raises(InvalidInput, match="by must name who answered"):
        attributed_note("x", "")


def test_postgresql_by_url(pg_cluster: PgCluster, tmp_path: Path) -> None:
    schema = f"t_{uuid.uuid4().hex[:16]}"
    url = f"postgresql://{pg_cluster.user}@127.0.0.1:{pg_cluster.port}/{pg_cluster.dbname}"
    outbox = tmp_path / "outbox"
    crashed_engine(url, "s1", outbox, schema)
    listed = toolledger("halted", url, "--schema", schema)
    assert listed.returncode == 3, listed.stderr
    key = listed.stdout.split("  ")[1]
    done = toolledger("resolve", url, key, "abandon", "--by", "bob", "--schema", schema)
    assert done.returncode == 0, done.stderr
    assert toolledger("halted", url, "--schema", schema).returncode == 0
    from toolledger import PostgresStore

    with PostgresStore(url, schema=schema) as store:
        [human] = [r for r in store.audit("s1") if r.kind == "human_abandon"]
        assert human.by == "bob"


def halted_then_resolved(by: str | None) -> tuple[object, list[AuditRow]]:
    """One manual call halted live (an exception after the request went out), resolved."""
    store = MemoryStore()
    s = Session.open(store, "s1", {"send_email": "manual"}, clock=lambda: 1000.0)
    [st] = s.record(0, [{"id": "call_0", "name": "send_email", "arguments": {"to": "bob"}}])
    s.approve(st.call.key)

    def lost(a: Attempt) -> object:
        a.sending()
        raise TimeoutError("no answer")

    assert s.execute(st.call.key, lost).next is Next.HALTED
    s.resolve(st.call.key, "applied", note="bob has it", by=by)
    return store.load("s1"), store.audit("s1")


def test_the_attribution_is_invisible_to_the_spec_mapping() -> None:
    """``by`` changes only the resolution row's note: the state the mapping reads
    (``to_spec`` of the stored state) and every row's key and inputs are the same."""
    named, named_rows = halted_then_resolved("alice")
    plain, plain_rows = halted_then_resolved(None)
    assert named == plain
    assert [(r.key, r.inputs) for r in named_rows] == [(r.key, r.inputs) for r in plain_rows]
    assert [r.by for r in named_rows if r.kind == "human_applied"] == ["alice"]
    assert [r.note for r in plain_rows if r.kind == "human_applied"] == ["bob has it"]
    differs = [r.kind for r, q in zip(named_rows, plain_rows, strict=True) if r != q]
    assert differs == ["human_applied"]  # the control: the rows do differ, in the note
