"""What a store raises: its errors, and the lease check every store makes first.

Private module of :mod:`toolledger`: import the public names from ``toolledger``
(:mod:`toolledger._core.stores` re-exports every name here).  Every error is a
:class:`StoreError`; each says what went wrong and what the engine does next.
"""

from __future__ import annotations

__all__ = [
    "LeaseLost",
    "SessionExists",
    "StaleState",
    "StoreCorrupt",
    "StoreError",
    "UnknownSession",
    "UnsupportedSchema",
    "check_lease",
]


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class StoreError(Exception):
    """A store could not do what was asked; nothing was written.

    The message says what went wrong and what to do.  After a
    :class:`StoreError` from a commit, a :class:`~toolledger.Session` has
    reloaded the durable state already (what a restarted engine would do):
    call ``recover()`` and act on what it returns.  A bare
    :class:`~toolledger._core.ledger.Ledger` is reloaded with
    :meth:`~toolledger._core.ledger.Ledger.reload`.
    """


class UnknownSession(StoreError, KeyError):
    """The session id is not in the store."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class SessionExists(StoreError):
    """:meth:`Store.create_session` was asked for a session that already exists."""


class StaleState(StoreError):
    """A commit's ``before`` is not what is durable now.

    Another engine (or another :class:`~toolledger._core.ledger.Ledger`) changed the
    session since this one loaded it: a call the commit writes for (its
    result, approval, record or audit keys) or the session's marker.  Nothing
    was written.  A :class:`~toolledger.Session` has reloaded the durable
    state when this reaches its caller: call ``recover()`` and act on what
    it returns (a bare Ledger: :meth:`~toolledger._core.ledger.Ledger.reload`,
    then decide again).
    """


class LeaseLost(StaleState):
    """The commit's lease epoch is no longer the session's.

    Another worker took the session (:meth:`Store.take_session` bumped its
    epoch) after this one did: this worker was declared dead, or a second
    resume path took over.  Checked inside the commit's transaction before
    any write, so nothing was written.  Stop working on the session (a
    :class:`~toolledger.Session` does: it starts nothing more); take it again
    (a new Session or :class:`~toolledger._core.ledger.Ledger` with
    ``take_session=True``) only if this worker is meant to own it now.
    Reloading under the old epoch is no way back: every commit stays refused.
    """


def check_lease(session_id: str, stored: int, epoch: int | None) -> None:
    """Raise :class:`LeaseLost` unless ``epoch`` (if given) is the stored epoch.

    Every store calls it first inside a commit's transaction: a worker that
    lost the session cannot commit (spec/ConcurrentResumers.tla,
    StaleWorkerNeverCommits).  ``None``: the caller holds no lease, only the
    compare-and-set applies.
    """
    if epoch is not None and stored != epoch:
        raise LeaseLost(
            f"session {session_id!r} is held under lease epoch {stored}, this worker "
            f"holds epoch {epoch}: another worker took the session since; nothing was "
            "written; stop working on it (take the session again only if this worker "
            "is to own it)"
        )


class StoreCorrupt(StoreError):
    """The store's file is damaged, truncated or not a store at all.

    Raised when opening (before anything is executed or written) or when a
    stored value cannot be read back.  ``path`` names the file.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class UnsupportedSchema(StoreError):
    """The store was written with a schema this version cannot read.

    ``found`` is the schema version found (``None`` if the file belongs to
    another application), ``supported`` the one this version reads.
    """

    def __init__(
        self, message: str, *, path: str | None = None, found: int | None, supported: int
    ) -> None:
        super().__init__(message)
        self.path = path
        self.found = found
        self.supported = supported
