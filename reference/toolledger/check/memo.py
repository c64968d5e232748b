"""Memoisation for the exhaustive checkers: the same question is asked once.

The conformance checker asks the core about every event from every state of
a model's graph, but a graph of 10^5 states holds only ~10^3 distinct
:class:`~toolledger._core.protocol.SessionState` values (the rest of a spec
state is the external system, the ghosts and the conversation's rewrites,
which the core never reads).  :func:`toolledger._core.protocol.apply` is a
pure function of the session and the event (no clock, no I/O, no global it
writes), so its answer, the next session or the ``ProtocolError`` it raised,
can be kept per (session value, event) and given again.  Nothing is pruned:
every event is still offered from every state, and the core's own code
computed every answer that is given; a core that accepts a step the spec
does not is still an ``extra`` edge.

A memo is made for one check and dropped after it (:func:`core_memo`), so a
test that swaps in a broken core (``p._HANDLERS``, ``p.derive_execution_id``)
for the duration of a check gets that core's answers, never a previous
core's.  :func:`value_key` turns a checker state into a hashable value with
the same equality (two states with equal keys are equal dataclasses): the
memo keys sessions by it.  (The conformance checker maps reference states to
the spec through :class:`toolledger.check.mapping.SpecMapper`, which keeps
each part's image.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .._core import protocol as p

__all__ = ["CoreMemo", "KeyCache", "active", "core_memo", "value_key"]

Answer = p.SessionState | p.ProtocolError

# per class: the fields that make up its key, or () if it hashes itself
_FIELDS: dict[type, tuple[str, ...]] = {}


def value_key(v: Any) -> Hashable:
    """A hashable value equal for equal ``v`` and different for different ``v``.

    Mappings become frozensets of their (frozen) items, dataclasses that do
    not hash (frozen dataclasses with dict fields, such as the session, the
    external system, the ghosts) become their class and the tuple of their
    frozen fields; everything else must already be hashable.  Every field is
    read by name from the dataclass, so a field added later is part of the key
    without changing this function."""
    cls = type(v)
    if cls is dict:
        try:  # the common case: the values hash themselves
            return frozenset(v.items())
        except TypeError:
            return frozenset((k, value_key(x)) for k, x in v.items())
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = _structural_fields(v)
    if names:
        return (cls, *[value_key(getattr(v, n)) for n in names])
    if isinstance(v, Mapping):  # a mapping that is not a dict (rare)
        return frozenset((k, value_key(x)) for k, x in v.items())
    return v  # type: ignore[no-any-return]


def _structural_fields(v: Any) -> tuple[str, ...]:
    """The fields to key ``v``'s class by, or () if its values hash themselves.

    A frozen dataclass has a ``__hash__`` even when a field holds a dict (it
    fails only when called), so the class is tried once on its first value."""
    if not dataclasses.is_dataclass(v):
        return ()
    try:
        hash(v)
    except TypeError:
        return tuple(f.name for f in dataclasses.fields(v))
    return ()


class KeyCache:
    """:func:`value_key` of objects seen before, by identity.

    The checker's states share most of their parts (a successor that only
    changes the external system keeps its parent's session and ghosts), so a
    part's key is computed once per object.  Entries hold the object, so an
    id is never reused while its entry lives; the cache is emptied when it
    grows past ``limit`` entries."""

    def __init__(self, limit: int = 200_000) -> None:
        self._ids: dict[int, tuple[object, Hashable]] = {}
        self._limit = limit

    def key(self, v: object) -> Hashable:
        known = self._ids.get(id(v))
        if known is not None and known[0] is v:
            return known[1]
        k = value_key(v)
        if len(self._ids) >= self._limit:
            self._ids.clear()
        self._ids[id(v)] = (v, k)
        return k


class CoreMemo:
    """The core's answers of one check, per (session value, event)."""

    def __init__(self) -> None:
        self.keys = KeyCache()
        self._answers: dict[Hashable, dict[p.Event, Answer]] = {}
        # one object per distinct next session: the sessions the memo hands
        # out are shared, so their keys come from the cache
        self._canonical: dict[Hashable, p.SessionState] = {}
        # the session asked about last (successors asks ~40 events of one session)
        self._last: p.SessionState | None = None
        self._last_table: dict[p.Event, Answer] = {}
        self.asked = 0
        self.computed = 0

    def canonical(self, s: p.SessionState) -> p.SessionState:
        """The memo's one object equal to ``s`` (``s`` itself the first time)."""
        return self._canonical.setdefault(self.keys.key(s), s)

    def answer(self, s: p.SessionState, ev: p.Event) -> Answer:
        """What ``p.apply(s, ev)`` returns, or the ``ProtocolError`` it raises."""
        self.asked += 1
        if s is not self._last:
            self._last = s
            self._last_table = self._answers.setdefault(self.keys.key(s), {})
        table = self._last_table
        got = table.get(ev)
        if got is None:
            self.computed += 1
            try:
                got = self.canonical(p.apply(s, ev))
            except p.ProtocolError as e:
                got = e
            table[ev] = got
        return got


_ACTIVE: CoreMemo | None = None


def active() -> CoreMemo | None:
    """The memo of the check running in this process, if any."""
    return _ACTIVE


@contextmanager
def core_memo() -> Iterator[CoreMemo]:
    """Memoise the core's answers until the block ends (forked workers
    started inside the block inherit the memo)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, CoreMemo()
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = previous
