"""The on-call commands: ``toolledger halted``, ``status`` and ``resolve``.

Whoever is on call after a crash sees what waits for a human and answers it
from the command line alone (docs/operating.md, "On call").  ``STORE`` is a
SqliteStore path or a PostgreSQL URL (``postgresql://...``).

``halted`` and ``status`` write nothing: a call interrupted by a restart is
shown as what :meth:`Session.recover <toolledger.Session.recover>` would
make of it (its recovery events applied to the state in memory only, by the
pure core), with the same :class:`~toolledger.Next` words.  ``resolve`` is
:meth:`Session.resolve <toolledger.Session.resolve>`; it applies the
session's pending recovery decisions first (what the engine's ``recover()``
does on restart) only once the call is known to be halted.

Exit status: 0 ok (``halted``: nothing waits); 3 (``halted``) something waits
for a human, for alerting; 1 the store is damaged or not a toolledger store;
2 the command could not run as asked (no such file, a bad URL, a server that
cannot be reached, an unknown key, a call that is not halted): then nothing
was written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ._core.calls import Next
from ._core.commit_plan import AuditRow
from ._core.ledger import APPROVAL_EXPIRED, APPROVED, REJECTED, RESOLUTIONS, Ledger
from ._core.next_step import approval_withdrawn, next_of, recovery_decision, recovery_events
from ._core.protocol import InvalidInput, apply
from ._core.session import Session
from ._core.state import CallState, MessageState, SessionState, Stage
from ._core.stores import Store, StoreCorrupt, StoreError, UnsupportedSchema

_URL_SCHEMES = ("postgresql://", "postgres://")
_ARGS_SHOWN = 80  # characters of a call's arguments in a listing


class _Refused(Exception):
    """The command cannot run as asked: exit 2, this message, nothing written."""


def _store_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE",
                   help="a SqliteStore file, or a PostgreSQL URL (postgresql://user@host/db)")
    p.add_argument("--schema", default="toolledger",
                   help="PostgreSQL only: the store's schema (default: toolledger)")


@contextmanager
def _opened(args: argparse.Namespace) -> Iterator[Store]:
    """The store ``args.store`` names; never creates one (a typo must not make a store)."""
    text: str = args.store
    store: Store
    if text.startswith(_URL_SCHEMES):
        from ._core.postgres_store import PostgresStore

        store = PostgresStore(text, schema=args.schema)
    elif "://" in text:
        raise _Refused(f"{text}: not a store: give a SqliteStore file or a postgresql:// URL")
    else:
        from ._core.sqlite_store import SqliteStore

        path = Path(text)
        if not path.is_file():
            raise _Refused(f"{path} is not a file: give the path of a store "
                           "(or a postgresql:// URL)")
        store = SqliteStore(path)
    try:
        yield store
    finally:
        store.close()


@dataclass(frozen=True)
class _Row:
    session: str
    key: str
    tool: str
    arguments: str
    attempt: int
    next: Next
    why: str
    answered: str = ""  # the latest human answer of the call in the audit, who gave it


def _as_recovered(st: SessionState) -> SessionState:
    """The state :meth:`Session.recover` would commit, computed in memory only."""
    for c in st.calls:
        if c.message is MessageState.DURABLE and c.stage is Stage.RESUME:
            events, _ = recovery_events(st, c)
            for ev in events:
                st = apply(st, ev)
    return st


def _why(st: SessionState, c: CallState, nxt: Next) -> str:
    if nxt is Next.AWAIT_APPROVAL:
        if approval_withdrawn(st, c):
            return "its approval expired before it was dispatched: waits for a new approval"
        return "waits for approval"
    if nxt is not Next.HALTED:
        return ""
    i = recovery_decision(st, c).inputs
    reason = (f"attempt {i.attempt} {i.status.value}, policy {i.policy.value}: the outcome is "
              "unknown and the policy does not let the ledger retry")
    if not i.key_retained:
        reason = (f"attempt {i.attempt}: the idempotency key's retention window has passed, "
                  "a retry could repeat the effect")
    elif i.legacy:
        reason = "a call from before the ledger, approved, with no result"
    elif not i.digest_matches:
        reason = "the recorded arguments differ from the call's"
    return reason + "; answer with toolledger resolve"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _answer_text(row: AuditRow) -> str:
    """A human answer's audit row as the listing shows it: what, by whom."""
    who = f" by {row.by}" if row.by is not None else ""
    if row.kind == APPROVED:
        until = f", until {_when(row.expires_at)}" if row.expires_at is not None else ""
        return f"approved{who}{until}"
    if row.kind == REJECTED:
        return f"rejected{who}"
    if row.kind == APPROVAL_EXPIRED:
        return "approval expired"
    if row.kind == "human_cancel":
        return f"cancelled{who}"
    return f"resolved {row.kind.removeprefix('human_')}{who}"


def _answers(store: Store, session_id: str) -> dict[str, str]:
    """Execution id -> its latest human answer in the audit (approval, rejection, expiry,
    resolution, cancel): who approved or resolved, read from the rows' notes."""
    out: dict[str, str] = {}
    for row in store.audit(session_id):
        if row.kind in (APPROVED, REJECTED, APPROVAL_EXPIRED, "human_cancel") or (
            row.kind.startswith("human_") and row.kind.removeprefix("human_") in RESOLUTIONS
        ):
            out[row.execution_id] = _answer_text(row)
    return out


def _rows(store: Store, session_id: str, *, who: bool = False) -> list[_Row]:
    ledger = Ledger(store, session_id)
    st = _as_recovered(ledger.state)
    answers = _answers(store, session_id) if who else {}
    out = []
    for c in st.calls:
        if c.message is not MessageState.DURABLE:
            continue
        nxt = next_of(st, c, running=False)
        args = ledger.call_arguments(c.position)
        text = "(arguments not stored)" if args is None else json.dumps(args, sort_keys=True)
        if len(text) > _ARGS_SHOWN:
            text = text[: _ARGS_SHOWN - 3] + "..."
        out.append(_Row(session_id, c.execution_id, c.tool.name, text,
                        st.record(c.execution_id).attempt, nxt, _why(st, c, nxt),
                        answers.get(c.execution_id, "")))
    return out


def _sessions(store: Store, only: str | None) -> list[str]:
    sessions = store.sessions()
    if only is None:
        return sessions
    if only not in sessions:
        raise _Refused(f"no session {only!r} in the store ({len(sessions)} sessions)")
    return [only]


def _one_line(e: Exception) -> str:
    """An error as one line (a driver's message may span several): for logs and alerts."""
    return " ".join(str(e).split())


def _run(name: str, args: argparse.Namespace, body: object) -> int:
    assert callable(body)
    try:
        with _opened(args) as store:
            code: int = body(store)
            return code
    except _Refused as e:
        print(f"toolledger {name}: {_one_line(e)}; nothing was written", file=sys.stderr)
        return 2
    except InvalidInput as e:
        print(f"toolledger {name}: {_one_line(e)}", file=sys.stderr)
        return 2
    except (StoreCorrupt, UnsupportedSchema) as e:
        print(f"toolledger {name}: {_one_line(e)}", file=sys.stderr)
        return 1
    except StoreError as e:  # StoreUnavailable, a bad URL, a lost connection
        print(f"toolledger {name}: {_one_line(e)}", file=sys.stderr)
        return 2


def _table(rows: list[_Row], *, why: bool) -> None:
    for r in rows:
        line = (f"{r.session}  {r.key}  {r.tool}  {r.arguments}  attempt {r.attempt}  "
                f"{r.next.value}")
        print(line + (f"  ({r.why})" if why and r.why else "")
              + (f"  [{r.answered}]" if r.answered else ""))


# -- halted -------------------------------------------------------------------


def configure_halted(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    p.add_argument("--session", metavar="SID", help="only this session")
    p.epilog = ("writes nothing. exit status: 0 nothing waits for a human; 3 something does "
                "(halted calls to resolve, pending approvals); 1 the store is damaged; "
                "2 it could not be read (no such file, bad URL, server unreachable)")


def cmd_halted(args: argparse.Namespace) -> int:
    def body(store: Store) -> int:
        waiting = []
        for sid in _sessions(store, args.session):
            rows = [r for r in _rows(store, sid) if r.next in (Next.HALTED, Next.AWAIT_APPROVAL)]
            if rows:  # who answered them so far: read only for a session with waiting calls
                answers = _answers(store, sid)
                rows = [replace(r, answered=answers.get(r.key, "")) for r in rows]
            waiting += rows
        _table(waiting, why=True)
        halted = sum(r.next is Next.HALTED for r in waiting)
        print(f"{halted} halted, {len(waiting) - halted} waiting for approval")
        return 3 if waiting else 0

    return _run("halted", args, body)


# -- status -------------------------------------------------------------------


def configure_status(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    p.add_argument("session", metavar="SESSION", nargs="?",
                   help="list this session's calls (default: one line per session)")
    p.epilog = ("writes nothing; a call interrupted by a restart shows what recover() will "
                "make of it. exit status: 0 shown; 1 the store is damaged; 2 it could not be "
                "read, or no such session")


def cmd_status(args: argparse.Namespace) -> int:
    def body(store: Store) -> int:
        if args.session is not None:
            _table(_rows(store, _sessions(store, args.session)[0], who=True), why=True)
            return 0
        for sid in _sessions(store, None):
            counts: dict[str, int] = {}
            for r in _rows(store, sid):
                counts[r.next.value] = counts.get(r.next.value, 0) + 1
            shown = ", ".join(f"{n} {word}" for word, n in sorted(counts.items()))
            print(f"{sid}: {shown or 'no open calls'}")
        return 0

    return _run("status", args, body)


# -- resolve ------------------------------------------------------------------


def configure_resolve(p: argparse.ArgumentParser) -> None:
    _store_argument(p)
    p.add_argument("key", metavar="KEY", help="the halted call's key (execution id), "
                   "as `toolledger halted` lists it")
    p.add_argument("answer", choices=sorted(RESOLUTIONS),
                   help="applied: it took effect (the tool result is --result); retry: grant "
                   "one more attempt, same key, which the next engine to recover the session "
                   "runs once (this command runs nothing); abandon: it gets an abandoned result")
    p.add_argument("--by", required=True, metavar="NAME",
                   help="who answers: recorded in the audit row")
    p.add_argument("--note", default="", metavar="TEXT", help="why: recorded in the audit row")
    p.add_argument("--result", metavar="TEXT",
                   help="applied only: what the external system answered, the call's tool "
                   "result (default: a JSON object saying a human confirmed it was applied)")
    p.epilog = ("exit status: 0 resolved; 1 the store is damaged; 2 refused, nothing written "
                "(unknown key, a call that is not halted, --result without applied, no store)")


def cmd_resolve(args: argparse.Namespace) -> int:
    def body(store: Store) -> int:
        if args.result is not None and args.answer != "applied":
            raise _Refused(f"--result is only for applied, not {args.answer}: drop it")
        if not args.by.strip() or not args.by.isprintable():
            raise _Refused(f"--by {args.by!r}: name who answers")
        found = [(sid, r) for sid in store.sessions() for r in _rows(store, sid)
                 if r.key == args.key]
        if not found:
            raise _Refused(f"no open or recent call with key {args.key!r} in any session: "
                           "`toolledger halted STORE` lists the keys")
        sid, row = found[0]
        if row.next is not Next.HALTED:
            raise _Refused(f"call {args.key} of session {sid} is not halted for a human "
                           f"(next: {row.next.value})")
        session = Session.open(store, sid)
        session.recover()  # the decisions a restart applies: the call is halted, durably
        status = session.resolve(args.key, args.answer, result=args.result,
                                 note=args.note, by=args.by)
        print(f"{sid}  {args.key}  resolved {args.answer} by {args.by}: next "
              f"{status.next.value}" + (
                  f" (attempt {status.attempt + 1} is granted: the next engine that recovers "
                  "the session runs it once, same key)" if status.next is Next.RETRY else ""))
        return 0

    return _run("resolve", args, body)


__all__ = [
    "cmd_halted", "cmd_resolve", "cmd_status",
    "configure_halted", "configure_resolve", "configure_status",
]
