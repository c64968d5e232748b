"""Reference connectors for the connector contract kit (:mod:`toolledger.extra.pytest`).

Two external systems with their sandboxes and adapters, and the broken
variants the kit must catch (``tests/test_extra_pytest.py`` shows each one
failing exactly the obligations it breaks):

- :class:`EmailServer`: a deduplicating HTTP service on loopback (stdlib
  ``http.server`` in a thread, a free port): ``POST /emails`` with an
  ``Idempotency-Key`` header; :class:`EmailClient` is its ``idempotent``
  adapter (``http.client``, a short time-out).  Broken: ``send_key=False``
  (no dedup: the key is never sent), :class:`UnknownAsNotAppliedEmailClient`
  (a time-out or a reset answered as "not applied"), and for a real API's key
  answers :class:`ConflictAsAppliedEmailClient` (a 409 "in progress" taken for
  success), :class:`FreshKeyOnMismatchEmailClient` and
  :class:`FreshKeyOnReplayedFailureEmailClient` (a "parameters differ" or a
  replayed failure re-sent under a fresh key).
- :class:`PaymentsFake`: a SQLite-backed payments system with a real key
  retention window (on an injectable clock), per-attempt fences and an atomic
  status-and-fence query; :class:`PaymentsClient` is its adapter for an
  ``idempotent`` or a ``reconcile`` tool.  Broken: a fake whose real retention
  is shorter than the declared window (dedup without retention), and
  :class:`QueryThenFencePaymentsClient` (reads the status, then fences: a late
  original can land between the two), and :class:`EpochBlindPaymentsClient`
  (never sends the session owner's epoch: a stale worker's request lands).

Both sandboxes implement :class:`toolledger.extra.pytest.Sandbox`; the payments
fake also has the optional ``deliver_late_on_next_query`` and ``advance``.
"""

from __future__ import annotations

import http.client
import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from toolledger import (
    Attempt,
    CallRef,
    KeyInFlight,
    KeyParamsDiffer,
    NotApplied,
    NotAppliedFenced,
    ReplayedFailure,
    WasApplied,
)
from toolledger.extra.pytest import Fault, ManualClock

__all__ = [
    "ConflictAsAppliedEmailClient",
    "EmailClient",
    "EmailServer",
    "EpochBlindPaymentsClient",
    "FreshKeyOnMismatchEmailClient",
    "FreshKeyOnReplayedFailureEmailClient",
    "PaymentDeclined",
    "PaymentInProgress",
    "PaymentKeyMismatch",
    "PaymentServerError",
    "PaymentsClient",
    "PaymentsFake",
    "QueryThenFencePaymentsClient",
    "UnknownAsNotAppliedEmailClient",
]

# --------------------------------------------------------------------------
# An HTTP email service on loopback
# --------------------------------------------------------------------------

CLIENT_TIMEOUT: Final = 0.5
"""Seconds an :class:`EmailClient` waits for an answer (a held request costs this).
Short, but long enough that a loaded machine does not turn an answer into a
time-out (the contract tests would then see "unknown" where they expect "applied")."""


_IN_FLIGHT_BODY: Final = (b'{"error": {"type": "idempotency_error", "code": "in_progress", '
                          b'"message": "another request with this key is in progress"}}')
_PARAMS_DIFFER_BODY: Final = (b'{"error": {"type": "idempotency_error", "message": "keys for '
                              b'idempotent requests can only be used with the same '
                              b'parameters"}}')
_SERVER_ERROR_BODY: Final = b'{"error": {"type": "api_error", "message": "internal error"}}'


class _Server(ThreadingHTTPServer):
    # concurrent duplicates connect at once: the default backlog of 5 would drop
    # some SYNs and turn them into client time-outs
    request_queue_size = 64
    daemon_threads = True


class EmailServer:
    """A deduplicating email API on ``127.0.0.1`` (a free port), in a thread.

    ``POST /emails`` (JSON body, optional ``Idempotency-Key`` header) sends
    an email and answers ``201`` with ``{"email": n}``; a request with a key
    it has seen answers the original response without sending again, a
    stored ``500`` too, with ``Idempotent-Replayed: true`` (keys are kept
    forever: ``retention_window=None``).  ``422`` is a typed refusal; ``409``
    (another request with the key in progress) and ``400`` with the type
    ``idempotency_error`` (the key was used with other parameters) are the
    key answers a client must not take for a refusal.
    Use it as a context manager; it is also the kit's sandbox.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._sent: dict[str, int] = {}  # execution id -> emails sent
        self._keys: dict[str, tuple[int, bytes]] = {}  # key -> the original (status, body)
        self._count = 0
        self._held: list[tuple[threading.Event, threading.Event]] = []  # (land, landed)
        self._release = threading.Event()  # answers that come too late wait on it
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet in tests
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                server._handle(self, body)

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        # a short poll interval: close() (shutdown) waits for one poll
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,),
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._release.set()
        for land, _ in self._held:
            land.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> EmailServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the wire -------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
            land, landed = threading.Event(), threading.Event()
            if fault is Fault.HOLD:
                self._held.append((land, landed))
        if fault is Fault.REJECT:
            self._answer(h, 422, b'{"error": "recipient refused"}')
            return
        if fault is Fault.IN_FLIGHT:  # Stripe-like: a concurrent request with the key
            self._answer(h, 409, _IN_FLIGHT_BODY)
            return
        if fault is Fault.PARAMS_DIFFER:
            self._answer(h, 400, _PARAMS_DIFFER_BODY)
            return
        if fault is Fault.HOLD:
            land.wait()  # in flight until deliver_late(); the client gave up long ago
        try:
            status, response, replayed = self._apply(
                json.loads(body), h.headers.get("Idempotency-Key"),
                fail=fault is Fault.FAIL_AFTER_APPLY)
        finally:
            landed.set()
        if fault is Fault.RESET_AFTER_APPLY:
            h.close_connection = True  # closed without an answer: the client sees a reset
            return
        if fault is Fault.TIMEOUT_AFTER_APPLY or fault is Fault.HOLD:
            self._release.wait()  # answers after the client's time-out (or never)
        self._answer(h, status, response, replayed)

    def _apply(self, request: dict[str, Any], key: str | None,
               fail: bool = False) -> tuple[int, bytes, bool]:
        # The dedup check and the send are one step under the lock: two
        # concurrent requests with one key send one email.  A key keeps the
        # first answer, a failure too (``fail``: sent, then a 500), and
        # replays it (status, body, replayed).
        with self._lock:
            if key is not None and key in self._keys:
                status, stored = self._keys[key]
                return status, stored, True
            self._count += 1
            execution = str(request.get("execution_id", ""))
            self._sent[execution] = self._sent.get(execution, 0) + 1
            status, response = ((500, _SERVER_ERROR_BODY) if fail
                                else (201, json.dumps({"email": self._count}).encode()))
            if key is not None:
                self._keys[key] = (status, response)
            return status, response, False

    @staticmethod
    def _answer(h: BaseHTTPRequestHandler, status: int, body: bytes,
                replayed: bool = False) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            if replayed:
                h.send_header("Idempotent-Replayed", "true")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except OSError:
            pass  # the client is gone (it timed out): nobody hears this answer

    # -- the sandbox ------------------------------------------------------------

    def effects(self, execution_id: str) -> int:
        with self._lock:
            return self._sent.get(execution_id, 0)

    def inject(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(Fault(fault))

    def deliver_late(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for land, _ in held:
            land.set()
        for _, landed in held:  # applied in their handler threads: wait for each
            if not landed.wait(5):
                raise RuntimeError("a held request did not land within 5 s")


@dataclass
class EmailClient:
    """The ``idempotent`` adapter of :class:`EmailServer`: a Session tool body.

    Declare it ``Tool(policy="idempotent", marks_send=True)``: it calls
    ``a.sending()`` right before the request leaves.  A ``4xx`` answer is
    :class:`~toolledger.NotApplied`, but for the key answers: ``409`` (in
    progress) is :class:`~toolledger.KeyInFlight`, ``400 idempotency_error``
    :class:`~toolledger.KeyParamsDiffer`, a replayed ``5xx``
    :class:`~toolledger.ReplayedFailure` (all unknown); a time-out, a reset
    and a ``5xx`` are raised as they are (unknown).  ``send_key=False`` is the broken variant
    that never sends the ``Idempotency-Key`` (no dedup).
    """

    port: int
    send_key: bool = True
    timeout: float = CLIENT_TIMEOUT

    def send(self, a: Attempt) -> str:
        return self._post(a, a.idempotency_key if self.send_key else None)

    def _post(self, a: Attempt, key: str | None) -> str:
        body = json.dumps({**a.arguments, "execution_id": a.execution_id}).encode()
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            a.sending()
            conn.request("POST", "/emails", body, headers)
            resp = conn.getresponse()
            text = resp.read().decode()
            replayed = resp.getheader("Idempotent-Replayed") == "true"
        finally:
            conn.close()
        # The key answers first: by the API's documented status AND error type,
        # not by the status class (a 4xx is not always a refusal).
        if resp.status == 409:
            raise KeyInFlight(f"the email API: another request with this key is in "
                              f"progress ({resp.status}): {text}")
        if resp.status == 400 and '"idempotency_error"' in text:
            raise KeyParamsDiffer(f"the email API: the key was used with other parameters "
                                  f"({resp.status}): {text}")
        if resp.status >= 500 and replayed:
            raise ReplayedFailure(f"the email API replayed the key's stored failure "
                                  f"({resp.status}): {text}")
        if 400 <= resp.status < 500:
            raise NotApplied(f"the email API refused the request ({resp.status}): {text}")
        if resp.status >= 300:
            raise RuntimeError(f"the email API answered {resp.status}: {text}")
        return text


class UnknownAsNotAppliedEmailClient(EmailClient):
    """BROKEN: answers a time-out or a reset (unknown) as "not applied"."""

    def send(self, a: Attempt) -> str:
        try:
            return super().send(a)
        except (TimeoutError, ConnectionError) as exc:
            raise NotApplied(f"the email API did not answer: {exc}") from exc


class ConflictAsAppliedEmailClient(EmailClient):
    """BROKEN: takes a ``409`` (another request with the key in progress) for
    success: "already sent"."""

    def send(self, a: Attempt) -> str:
        try:
            return super().send(a)
        except KeyInFlight:
            return '{"email": "already sent"}'


class FreshKeyOnMismatchEmailClient(EmailClient):
    """BROKEN: on "parameters differ" re-sends under a fresh key (the advice some
    APIs give for a mismatch): the earlier request's effect is applied again."""

    def send(self, a: Attempt) -> str:
        try:
            return super().send(a)
        except KeyParamsDiffer:
            return self._post(a, f"{a.idempotency_key}-fresh")


class FreshKeyOnReplayedFailureEmailClient(EmailClient):
    """BROKEN: on a replayed stored failure re-sends under a fresh key ("the key is
    poisoned"): the failed request had been applied, so it is applied again."""

    def send(self, a: Attempt) -> str:
        try:
            return super().send(a)
        except ReplayedFailure:
            return self._post(a, f"{a.idempotency_key}-fresh")


# --------------------------------------------------------------------------
# A SQLite payments system with a real retention window
# --------------------------------------------------------------------------


class PaymentDeclined(Exception):
    """The payments system refused the charge before applying it (a typed error)."""


class PaymentInProgress(Exception):
    """The payments system's 409: another request with this key is in progress."""


class PaymentKeyMismatch(Exception):
    """The payments system's idempotency error: the key was used with other parameters."""


class PaymentServerError(Exception):
    """The payments system's 500; ``replayed``: the key's stored failure, replayed."""

    def __init__(self, message: str, replayed: bool = False) -> None:
        super().__init__(message)
        self.replayed = replayed


_STORED_FAILURE: Final = '{"error": "internal", "status": 500}'


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS payments (
    n INTEGER PRIMARY KEY, execution_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    amount INTEGER NOT NULL, result TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keys (
    key TEXT PRIMARY KEY, result TEXT NOT NULL, stored_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS fences (
    execution_id TEXT PRIMARY KEY, up_to INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS epochs (
    execution_id TEXT PRIMARY KEY, newest INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class _Charge:
    execution_id: str
    attempt: int
    key: str | None
    amount: int
    epoch: int | None = None


class PaymentsFake:
    """A payments system in one SQLite file: charges, idempotency keys, fences.

    - ``charge`` applies a payment unless its attempt is fenced or its key was
      stored less than ``retention_window`` seconds ago (then it answers the
      original result); check and write are one ``BEGIN IMMEDIATE``
      transaction, so concurrent duplicates apply once.  Keys older than the
      window are purged: a retry after it charges again.
    - ``reconcile`` is the atomic status-and-fence query (one transaction);
      ``status`` and ``fence`` are the two halves, for a connector that does not
      have the atomic one.
    - Epochs (the session owner's lease epoch, ``Attempt.epoch``): every
      request may carry one, and ``see_epoch`` announces one; the fake keeps
      the newest it has seen per execution and refuses (a typed refusal,
      nothing applied) a charge of an older epoch, a held one landing late
      included (the spec's ``ExternalDrop`` of a stale epoch).
    - The clock is injectable (:class:`~toolledger.extra.pytest.ManualClock`).
    """

    def __init__(self, path: str | Path, *, retention_window: float | None = None,
                 clock: ManualClock | None = None) -> None:
        self.path = Path(path)
        self.retention_window = retention_window
        self.clock = clock or ManualClock()
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._held: list[_Charge] = []
        self._land_on_query = False
        db = sqlite3.connect(self.path)
        try:
            db.executescript(_SCHEMA)
        finally:
            db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    # -- the wire -------------------------------------------------------------

    def charge(self, execution_id: str, attempt: int, key: str | None, amount: int,
               epoch: int | None = None) -> str:
        """One charge request; raises like a network client would."""
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
        req = _Charge(execution_id, attempt, key, amount, epoch)
        if fault is Fault.REJECT:
            raise PaymentDeclined("card declined")
        if fault is Fault.IN_FLIGHT:
            raise PaymentInProgress("409: another request with this key is in progress")
        if fault is Fault.PARAMS_DIFFER:
            raise PaymentKeyMismatch("idempotency_error: the key was used with other "
                                     "parameters")
        if fault is Fault.HOLD:
            with self._lock:
                self._held.append(req)
            raise TimeoutError("the payments API did not answer in time")
        result = self._apply(req, fail=fault is Fault.FAIL_AFTER_APPLY)
        if result is None:
            raise PaymentDeclined(f"attempt {attempt} of {execution_id} (epoch {epoch}) is "
                                  "fenced or of an older epoch than one seen")
        if result == _STORED_FAILURE:
            raise PaymentServerError("500: internal error",
                                     replayed=fault is not Fault.FAIL_AFTER_APPLY)
        if fault is Fault.RESET_AFTER_APPLY:
            raise ConnectionResetError("connection reset by peer")
        if fault is Fault.TIMEOUT_AFTER_APPLY:
            raise TimeoutError("the payments API did not answer in time")
        return result

    def _apply(self, r: _Charge, fail: bool = False) -> str | None:
        now = self.clock.now()
        with self._tx() as db:
            if self.retention_window is not None:
                db.execute("DELETE FROM keys WHERE stored_at <= ?",
                           (now - self.retention_window,))
            row = db.execute("SELECT up_to FROM fences WHERE execution_id = ?",
                             (r.execution_id,)).fetchone()
            if row is not None and r.attempt <= row[0]:
                return None  # ExternalDropFenced
            if r.epoch is not None and not self._see(db, r.execution_id, r.epoch):
                return None  # ExternalDrop: a stale worker's request
            if r.key is not None:
                row = db.execute("SELECT result FROM keys WHERE key = ?", (r.key,)).fetchone()
                if row is not None:
                    return str(row[0])  # deduplicated: the original answer
            n = db.execute("SELECT COALESCE(MAX(n), 0) + 1 FROM payments").fetchone()[0]
            result = json.dumps({"payment": n, "amount": r.amount})
            db.execute("INSERT INTO payments VALUES (?, ?, ?, ?, ?)",
                       (n, r.execution_id, r.attempt, r.amount, result))
            if fail:  # applied, then a 500: the key keeps (and replays) the failure
                result = _STORED_FAILURE
            if r.key is not None:
                db.execute("INSERT INTO keys VALUES (?, ?, ?)", (r.key, result, now))
            return result

    @staticmethod
    def _see(db: sqlite3.Connection, execution_id: str, epoch: int) -> bool:
        """Keep the newest epoch of ``execution_id``; False: ``epoch`` is older."""
        row = db.execute("SELECT newest FROM epochs WHERE execution_id = ?",
                         (execution_id,)).fetchone()
        if row is not None and epoch < row[0]:
            return False
        db.execute("INSERT INTO epochs VALUES (?, ?) ON CONFLICT(execution_id) DO "
                   "UPDATE SET newest = MAX(newest, excluded.newest)", (execution_id, epoch))
        return True

    def see_epoch(self, execution_id: str, epoch: int) -> None:
        """The session's new owner announces its epoch for ``execution_id``."""
        with self._tx() as db:
            self._see(db, execution_id, epoch)

    def reconcile(self, execution_id: str, attempt: int, epoch: int | None = None) -> str | None:
        """Atomically: the result of ``execution_id`` if applied, else fence attempts
        ``<= attempt`` and answer None (one transaction).  ``epoch``: the asker's,
        kept if newer (the query carries it as every request does)."""
        with self._tx() as db:
            if epoch is not None:
                self._see(db, execution_id, epoch)
            row = db.execute("SELECT result FROM payments WHERE execution_id = ? ORDER BY n",
                             (execution_id,)).fetchone()
            if row is None:
                db.execute("INSERT INTO fences VALUES (?, ?) ON CONFLICT(execution_id) DO "
                           "UPDATE SET up_to = MAX(up_to, excluded.up_to)",
                           (execution_id, attempt))
        self._after_query()
        return None if row is None else str(row[0])

    def status(self, execution_id: str) -> str | None:
        """The result of ``execution_id`` if applied (a read; fences nothing)."""
        with self._tx() as db:
            row = db.execute("SELECT result FROM payments WHERE execution_id = ? ORDER BY n",
                             (execution_id,)).fetchone()
        self._after_query()
        return None if row is None else str(row[0])

    def fence(self, execution_id: str, attempt: int) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO fences VALUES (?, ?) ON CONFLICT(execution_id) DO "
                       "UPDATE SET up_to = MAX(up_to, excluded.up_to)", (execution_id, attempt))

    def _after_query(self) -> None:
        with self._lock:
            land, self._land_on_query = self._land_on_query, False
        if land:
            self.deliver_late()

    # -- the sandbox ------------------------------------------------------------

    def effects(self, execution_id: str) -> int:
        with self._tx() as db:
            row = db.execute("SELECT COUNT(*) FROM payments WHERE execution_id = ?",
                             (execution_id,)).fetchone()
        return int(row[0])

    def inject(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(Fault(fault))

    def deliver_late(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for r in held:
            self._apply(r)  # a fenced one is dropped; nobody hears the answer

    def deliver_late_on_next_query(self) -> None:
        with self._lock:
            self._land_on_query = True

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)


@dataclass
class PaymentsClient:
    """The adapter of :class:`PaymentsFake`: ``charge`` (the tool body) and ``reconcile``.

    ``idempotent``: sends the attempt's idempotency key; ``reconcile``: asks the
    fake's atomic status-and-fence query.  Every request carries the session
    owner's epoch (``Attempt.epoch``, ``CallRef.epoch``), and
    ``announce_epoch`` is ``Session.open``'s hook.  A declined charge is
    :class:`~toolledger.NotApplied`; the key answers are raised as
    :class:`~toolledger.KeyInFlight`, :class:`~toolledger.KeyParamsDiffer`,
    :class:`~toolledger.ReplayedFailure`; time-outs, resets and 500s propagate
    (unknown).
    """

    fake: PaymentsFake

    def _epoch(self, epoch: int | None) -> int | None:
        return epoch

    def charge(self, a: Attempt) -> str:
        a.sending()
        try:
            return self.fake.charge(a.execution_id, a.attempt, a.idempotency_key,
                                    int(a.arguments.get("amount", 1)), self._epoch(a.epoch))
        except PaymentDeclined as exc:
            raise NotApplied(str(exc)) from exc
        except PaymentInProgress as exc:
            raise KeyInFlight(str(exc)) from exc
        except PaymentKeyMismatch as exc:
            raise KeyParamsDiffer(str(exc)) from exc
        except PaymentServerError as exc:
            if exc.replayed:
                raise ReplayedFailure(str(exc)) from exc
            raise

    def reconcile(self, call: CallRef, attempt: int) -> WasApplied | NotAppliedFenced:
        result = self.fake.reconcile(call.key, attempt, self._epoch(call.epoch))
        return NotAppliedFenced() if result is None else WasApplied(result)

    def announce_epoch(self, call: CallRef, epoch: int) -> None:
        """``Session.open(..., announce_epoch=client.announce_epoch)``."""
        if self._epoch(epoch) is not None:
            self.fake.see_epoch(call.key, epoch)


class EpochBlindPaymentsClient(PaymentsClient):
    """BROKEN: never sends the epoch, so a stale worker's request is applied."""

    def _epoch(self, epoch: int | None) -> int | None:
        return None


class QueryThenFencePaymentsClient(PaymentsClient):
    """BROKEN: reads the status, then fences, in two steps (not atomic)."""

    def reconcile(self, call: CallRef, attempt: int) -> WasApplied | NotAppliedFenced:
        result = self.fake.status(call.key)
        if result is not None:
            return WasApplied(result)
        self.fake.fence(call.key, attempt)  # a late original may have landed meanwhile
        return NotAppliedFenced()
