"""A session's steps through its ledger, guarded against store errors and interrupts.

Private module of :mod:`toolledger`: the base of :class:`~toolledger._core.session.Session`
(its module documentation, "Threads" and "Store errors", says what an engine sees).
Every step a session makes goes through :meth:`LedgerGuard._step_many`: a commit
that fails (:class:`~toolledger._core.stores.StoreError`) makes the session reload
the durable state, as a restarted engine would; if that reload fails too, the
engine gets the commit's own error and the session starts nothing
(:meth:`LedgerGuard._usable`) until a reload succeeds.  After an interrupt (a
``BaseException`` in a tool body) it starts nothing at all, and after
:class:`~toolledger._core.stores.LeaseLost` neither: another worker took the
session, and reloading under the old epoch would only decide again on a
session whose every commit is refused (spec/ConcurrentResumers.tla:
``Refused`` leaves the process idle; the liveness twin
ConcurrentLivenessRefusedReloads is the session that reloads instead).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .calls import SessionInterrupted
from .ledger import Ledger, Void
from .protocol import CallPosition, Event, SessionState
from .stores import LeaseLost, StoreError

__all__ = ["LedgerGuard"]


class LedgerGuard:
    """The ledger, the lock and the guarded steps of one session (see the module doc)."""

    def __init__(
        self, ledger: Ledger, observe: Callable[[Sequence[Event]], None] | None
    ) -> None:
        self._ledger = ledger
        self._observe = observe
        self._lock = threading.RLock()
        self._interrupted_by: str | None = None
        # set when the reload after a failed commit failed too: the state in memory
        # is not known to be durable, so nothing starts before a reload succeeds
        self._reload_failed: str | None = None
        # set when a commit was refused for a lost lease: this worker stops
        self._lease_lost: str | None = None

    @contextmanager
    def _usable(self) -> Iterator[None]:
        """The lock, for a method that starts something: refused after an interrupt."""
        with self._lock:
            if self._interrupted_by is not None:
                raise SessionInterrupted(
                    f"a tool of session {self._ledger.session_id!r} was interrupted "
                    f"({self._interrupted_by}): open a new Session on the store, as a "
                    "restarted engine would, and call recover()"
                )
            if self._lease_lost is not None:
                raise LeaseLost(
                    f"session {self._ledger.session_id!r}: this Session lost its lease "
                    f"({self._lease_lost}) and starts nothing more; nothing was written. "
                    "Another worker owns the session now; open a new Session with "
                    "take_session=True only if this worker is to own it again"
                )
            if self._reload_failed is not None:
                self._reload_again()
            yield

    def _step_many(
        self,
        events: list[Event],
        *,
        result_content: Mapping[CallPosition, str] | None = None,
        arguments: Mapping[CallPosition, Mapping[str, Any]] | None = None,
        voids: Sequence[Void] = (),
    ) -> SessionState:
        state = self._guard(lambda: self._ledger.step_many(
            events, result_content=result_content, arguments=arguments, voids=voids))
        if self._observe is not None:
            self._observe(tuple(events))
        return state

    def _step(self, event: Event) -> SessionState:
        """One step that commits nothing (a volatile stage change)."""
        return self._step_many([event])

    def _guard(self, commit: Callable[[], SessionState]) -> SessionState:
        try:
            return commit()
        except LeaseLost as exc:
            # Another worker owns the session: no reload (its epoch would still be
            # the old one), nothing more from this Session.
            self._lease_lost = str(exc)
            exc.add_note(
                f"Session {self._ledger.session_id!r} starts nothing more: open a new "
                "Session with take_session=True if this worker is to own it again."
            )
            raise
        except StoreError as exc:
            # What is durable is unknown to this process now: reload, as a
            # restarted engine would, before anyone acts on it.
            try:
                self._ledger.reload()
            except StoreError as again:
                # The store is still out of reach (a server down): the adopter gets the
                # ORIGINAL error (what failed, and whether it may have been written),
                # never the reload's, and the session starts nothing until a reload works.
                self._reload_failed = f"{type(again).__name__}: {again}"
                exc.add_note(
                    f"Reloading session {self._ledger.session_id!r} after this failed too "
                    f"({self._reload_failed}). The session starts nothing until the "
                    "store is reachable: its next call reloads first; then call recover() "
                    "and act on what it returns (or open a new Session)."
                )
            raise

    def _reload_again(self) -> None:
        """The reload :meth:`_guard` could not do; the store's error if it fails again."""
        try:
            self._ledger.reload()
        except StoreError as exc:
            exc.add_note(
                f"Session {self._ledger.session_id!r} could not reload after an earlier store "
                f"error either ({self._reload_failed}); nothing was started. Retry once the "
                "store is reachable; the session then reloads and recover() says what to do."
            )
            raise
        self._reload_failed = None
