"""The adopter's API, the promises issue 12's real adoption asked for: tested one by one.

- ``Session.cancel``: a user's Stop after approval, before dispatch: a
  ``cancelled`` result in one transaction, never dispatched afterwards, its
  approval consumed; refused (nothing written) once dispatched, while running,
  before approval, after a restart before ``recover()``;
- outcome classification: an ordinary tool error (a bad path in
  ``write_file``) is a failed result the model sees, not a halt for a human,
  under the default ``manual`` policy, through each seam (``NotApplied``, the
  send marker, a per-tool classifier); without a seam it halts;
- the host's inbox: keys are execution ids, per call, bound to the execution
  (a reused provider id in a later message gets another key); halted calls
  are listed with what to show and resumed after the human answers, across a
  restart;
- worker threads: one Session used from many real threads at once records,
  approves and runs every call exactly once.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from toolledger import (
    Attempt,
    CallBusy,
    InvalidInput,
    MemoryStore,
    Next,
    NotApplied,
    Outcome,
    RecoveryPolicy,
    ResultKind,
    Session,
    SqliteStore,
    Tool,
)
from toolledger._core.protocol import ApprovalState, LedgerStatus

SID = "s1"
MAIL = {"id": "call_0", "name": "send_email", "arguments": {"to": "ada"}}


class Crash(BaseException):
    """The process dies here."""


def dies(a: Attempt) -> str:
    raise Crash(f"the process dies with attempt {a.attempt} of {a.execution_id} dispatched")


def approved(s: Session, seq: int = 1, call: dict[str, Any] = MAIL) -> str:
    [status] = s.record(seq, [call])
    if status.next is Next.AWAIT_APPROVAL:
        status = s.approve(status.key)
    assert status.next is Next.EXECUTE, status
    return status.key


# --------------------------------------------------------------------------
# cancel
# --------------------------------------------------------------------------


def test_cancel_gives_a_cancelled_result_in_one_transaction_and_never_runs(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.sqlite3"
    store = SqliteStore(db)
    s = Session.open(store, SID, {"send_email": "manual"})
    key = approved(s)
    commits = store.commits
    status = s.cancel(key, note="the user pressed Stop")
    assert store.commits == commits + 1
    assert status.next is Next.RESULT and status.result is not None
    assert status.result.kind is ResultKind.CANCELLED
    assert status.tool_message()["status"] == "cancelled"
    ran: list[str] = []
    with pytest.raises(InvalidInput, match="already has its result"):
        s.execute(key, lambda a: ran.append(a.execution_id))
    with pytest.raises(InvalidInput, match="no pending approval"):
        s.approve(key)  # the approval was consumed: nothing to answer again
    assert ran == [] and s.ledger.state.record(key).status is LedgerStatus.NONE
    assert [row.kind for row in s.audit()][-1] == "human_cancel"
    store.close()
    again = Session.open(SqliteStore(db), SID, {"send_email": "manual"})  # a restart
    [after] = again.recover()
    assert after.next is Next.RESULT and after.result == status.result
    with pytest.raises(InvalidInput, match="already has its result"):
        again.execute(key, lambda a: ran.append(a.execution_id))
    assert ran == []
    # the session goes on: the next message can be recorded
    assert again.record(2, [{**MAIL, "id": "call_1"}])[0].next is Next.AWAIT_APPROVAL


def test_a_call_that_needs_no_approval_can_be_cancelled() -> None:
    s = Session.open(MemoryStore(), SID, {"send_email": "manual", "read": "readonly"})
    [auto, ro] = s.record(1, [MAIL, {"id": "c1", "name": "read", "arguments": {}}],
                          requires_approval=[False, None])
    assert [s.cancel(k).result.kind for k in (auto.key, ro.key)  # type: ignore[union-attr]
            ] == [ResultKind.CANCELLED, ResultKind.CANCELLED]


def _refused(s: Session, key: str, match: str) -> None:
    store = s.ledger.store
    before = (store.commits, s.ledger.state)
    with pytest.raises(InvalidInput, match=match):
        s.cancel(key)
    assert (store.commits, s.ledger.state) == before  # nothing was written


def test_cancel_is_refused_before_approval_with_nothing_written() -> None:
    s = Session.open(MemoryStore(), SID, {"send_email": "manual"})
    [status] = s.record(1, [MAIL])
    _refused(s, status.key, "not approved .*reject")
    assert s.ledger.state.approval(status.key) is ApprovalState.PENDING


def test_cancel_is_refused_after_dispatch_and_after_a_result(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    key = approved(s)

    with pytest.raises(Crash):
        s.execute(key, dies)
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    _refused(s, key, "dispatched .*attempt 1")  # the record says dispatched: never hidden
    [halted] = s.recover()
    assert halted.next is Next.HALTED
    _refused(s, key, "dispatched")
    done = s.resolve(key, "abandon")
    _refused(s, key, "already has its result")
    assert done.result is not None and done.result.kind is ResultKind.ABANDONED


def test_cancel_is_refused_after_a_restart_until_recover(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    key = approved(s)
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})  # crashed before dispatch
    _refused(s, key, "recover")
    [todo] = s.recover()
    assert todo.next is Next.EXECUTE  # approved, never dispatched: the user may still stop it
    assert s.cancel(key).result.kind is ResultKind.CANCELLED  # type: ignore[union-attr]


def test_cancel_is_refused_while_the_call_runs_in_another_thread() -> None:
    s = Session.open(MemoryStore(), SID, {"send_email": "manual"})
    key = approved(s)
    running, release = threading.Event(), threading.Event()

    def body(a: Attempt) -> str:
        running.set()
        assert release.wait(10)
        return "sent"

    worker = threading.Thread(target=s.execute, args=(key, body))
    worker.start()
    try:
        assert running.wait(10)
        _refused(s, key, "dispatched")
    finally:
        release.set()
        worker.join(10)
    assert s.call(key) and s.recover()[0].result.kind is ResultKind.OK  # type: ignore[union-attr]


def test_cancel_refuses_a_bad_note_and_an_unknown_key() -> None:
    s = Session.open(MemoryStore(), SID, {"send_email": "manual"})
    key = approved(s)
    with pytest.raises(InvalidInput, match="note must be a string"):
        s.cancel(key, note=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="no open or recent call"):
        s.cancel("nope")


# --------------------------------------------------------------------------
# Outcome classification: an ordinary tool error is not a halt
# --------------------------------------------------------------------------


def write_file(a: Attempt) -> str:
    """openworker's write_file shape: checks the path, then writes (the effect)."""
    path = Path(a.arguments["path"])
    if not path.parent.is_dir():
        raise FileNotFoundError(f"no such directory: {path.parent}")
    a.sending()  # from here on the file may be (partly) written
    path.write_text(a.arguments["content"])
    return f"wrote {path}"


def bad_path_call(tmp_path: Path) -> dict[str, Any]:
    bad = str(tmp_path / "missing" / "notes.txt")
    return {"id": "call_0", "name": "write_file", "arguments": {"path": bad, "content": "x"}}


def not_applied_if_missing(exc: Exception, sent: bool) -> Outcome | None:
    return Outcome.NOT_APPLIED if isinstance(exc, FileNotFoundError) and not sent else None


def raise_not_applied(a: Attempt) -> str:
    try:
        return write_file(a)
    except FileNotFoundError as exc:  # the tool says so itself
        raise NotApplied(str(exc)) from exc


@pytest.mark.parametrize(("tool", "body"), [
    (Tool(), raise_not_applied),                              # NotApplied raised by the tool
    (Tool(marks_send=True), write_file),                       # failed before the send marker
    (Tool(classify=not_applied_if_missing), write_file),       # a per-tool classifier
], ids=["NotApplied", "marks_send", "classify"])
def test_a_bad_path_in_write_file_is_an_error_result_not_a_halt(
    tmp_path: Path, tool: Tool, body: Any
) -> None:
    assert tool.policy is RecoveryPolicy.MANUAL  # the default policy
    s = Session.open(MemoryStore(), SID, {"write_file": tool})
    key = approved(s, call=bad_path_call(tmp_path))
    status = s.execute(key, body)
    assert (status.next, status.outcome) == (Next.RESULT, Outcome.NOT_APPLIED)
    assert status.result is not None and status.result.kind is ResultKind.ERROR
    assert "no such directory" in json.loads(status.result.content)["error"]
    assert s.halted() == []
    good = {"path": str(tmp_path / "notes.txt"), "content": "x"}
    key = approved(s, seq=2, call={"id": "call_1", "name": "write_file", "arguments": good})
    assert s.execute(key, body).result.kind is ResultKind.OK  # type: ignore[union-attr]


def test_without_a_seam_the_bad_path_halts_for_a_human(tmp_path: Path) -> None:
    # the control: the same tool error with no classification seam is unknown
    s = Session.open(MemoryStore(), SID, {"write_file": Tool()})
    key = approved(s, call=bad_path_call(tmp_path))
    status = s.execute(key, write_file)
    assert (status.next, status.outcome) == (Next.HALTED, Outcome.UNKNOWN)
    assert [h.key for h in s.halted()] == [key]


def test_an_error_after_the_send_marker_stays_unknown(tmp_path: Path) -> None:
    def disk_full(a: Attempt) -> str:
        a.sending()
        raise OSError(28, "No space left on device")  # the file may be half written

    s = Session.open(MemoryStore(), SID, {"write_file": Tool(marks_send=True,
                                                             classify=not_applied_if_missing)})
    key = approved(s, call=bad_path_call(tmp_path))
    assert s.execute(key, disk_full).next is Next.HALTED


# --------------------------------------------------------------------------
# The host's inbox: keys, halts, resuming after the human answers
# --------------------------------------------------------------------------


def test_inbox_keys_are_per_call_and_bound_to_the_execution() -> None:
    s = Session.open(MemoryStore(), SID, {"send_email": "manual"})
    first = s.record(1, [MAIL, {**MAIL, "id": "call_1"}])
    assert len({st.key for st in first}) == 2
    assert [p.key for p in s.pending_approvals()] == [st.key for st in first]
    s.reject(first[0].key)
    s.reject(first[1].key)
    # Gemini-style ids repeat every turn: the same provider id in a later message
    # is another execution with another key; the old answer never approves it.
    [later] = s.record(2, [MAIL])
    assert later.key not in {st.key for st in first}
    assert later.next is Next.AWAIT_APPROVAL
    with pytest.raises(InvalidInput, match="no open or recent call"):
        s.approve(first[0].key)  # an old message's key: settled, out of the working set
    assert s.ledger.state.approval(later.key) is ApprovalState.PENDING


def test_a_halted_call_is_shown_then_resumed_after_the_humans_answer(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    key = approved(s)

    with pytest.raises(Crash):
        s.execute(key, dies)
    # the host's startup scan: what to show for each halted call
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    [item] = s.halted()
    assert (item.key, item.call.name, dict(item.call.arguments), item.attempt) == (
        key, "send_email", {"to": "ada"}, 1)
    assert item.inputs is not None and item.inputs.status is LedgerStatus.DISPATCHED
    # the human answers "retry" in the inbox; the process that resolves it runs it
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    ready = s.resolve(key, "retry")  # the grant: attempt 1 stays the record's
    assert (ready.next, ready.attempt) == (Next.RETRY, 1)
    done = s.execute(key, lambda a: f"sent, attempt {a.attempt}")
    assert done.result is not None and done.result.content == "sent, attempt 2"
    assert s.halted() == []


def test_a_restart_after_a_humans_retry_runs_the_grant_once(tmp_path: Path) -> None:
    # the human's retry is a durable grant, nothing dispatched: a restart before
    # it ran runs it (attempt 2); a crash after attempt 2 is dispatched halts again
    db = tmp_path / "ledger.sqlite3"
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    key = approved(s)
    with pytest.raises(Crash):
        s.execute(key, dies)
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    s.halted()
    assert s.resolve(key, "retry").next is Next.RETRY
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    assert s.halted() == []  # the grant waits for the engine, not for a human
    with pytest.raises(Crash):
        s.execute(key, dies)  # attempt 2 dispatched, then the process dies
    s = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    [again] = s.halted()
    assert (again.key, again.attempt) == (key, 2)  # the grant is used: back to the human


# --------------------------------------------------------------------------
# Worker threads
# --------------------------------------------------------------------------


def test_one_session_from_many_threads_runs_every_call_exactly_once() -> None:
    s = Session.open(MemoryStore(), SID, {"send_email": "manual"})
    n = 12
    statuses = s.record(1, [{**MAIL, "id": f"call_{i}"} for i in range(n)])
    runs: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(n * 2)

    def body(a: Attempt) -> str:
        runs.append(a.execution_id)
        return "ok"

    def worker(key: str) -> None:
        try:
            barrier.wait(10)
            with contextlib.suppress(InvalidInput):  # the other thread approved it first
                s.approve(key)
            with contextlib.suppress(CallBusy, InvalidInput):  # the other runs (or ran) it
                s.execute(key, body)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(st.key,)) for st in statuses for _ in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert sorted(runs) == sorted(st.key for st in statuses)  # each exactly once
    assert all(st.next is Next.RESULT for st in s.recover())


def test_status_reads_where_a_call_stands_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    store = SqliteStore(db)
    s = Session.open(store, SID, {"send_email": "manual"})
    [recorded] = s.record(1, [MAIL])
    commits = store.commits
    assert s.status(recorded.key).next is Next.AWAIT_APPROVAL
    s.approve(recorded.key)
    assert s.status(recorded.key).next is Next.EXECUTE
    assert store.commits == commits + 1  # the approval only
    restarted = Session.open(SqliteStore(db), SID, {"send_email": "manual"})
    with pytest.raises(InvalidInput, match="interrupted by a restart"):
        restarted.status(recorded.key)  # only recover() may say what is next
    restarted.recover()
    assert restarted.status(recorded.key).next is Next.EXECUTE
