"""What an engine declares per tool: the adapter seam and the tool registry.

Private module of :mod:`toolledger`: import the public names from ``toolledger``.

An engine that adopts toolledger declares, for every tool, a
:class:`~toolledger._core.protocol.ToolProfile` (its recovery policy and whether it
needs a human's approval) and an adapter that talks to the external system.
This module holds:

- the adapter seam: :class:`ToolAdapter` (``invoke``), and for ``reconcile``
  tools :class:`ReconcilingAdapter` (``invoke`` and ``reconcile``), with the
  closed sets of answers they may give (:data:`AdapterOutcome`,
  :data:`ReconcileAnswer`).  An adapter *classifies* what happened:
  :class:`Applied`, :class:`DefiniteFailure` (known NOT applied) or
  :class:`Unknown` (a time-out, a reset connection, anything ambiguous).  The
  engine treats :class:`Unknown` exactly like a crash (``EngineTimeout`` then
  ``Recover``), and so does it with an exception raised by an adapter;
- :class:`ToolRegistry`: tool name -> (profile, adapter), validated when a
  tool is registered, and the check that keeps the execution identity out of
  the model's reach (:func:`check_arguments`, :data:`RESERVED_ARGUMENT_NAMES`);
- :func:`frozen_arguments`: the read-only copy of the arguments an adapter gets.

Not here (no engine needs them), in :mod:`toolledger.kit.external`:

- :class:`CountingExternalSystem` and :class:`CountingAdapter`: an external
  system that applies effects and counts them per execution id, deduplicates
  on the idempotency key, fences attempts for reconciliation, keeps requests
  in flight across engine crashes, and can be told to lose an answer, fail
  definitely or time out.  With a ``path`` it is durable (one JSON line,
  appended and fsynced, per event), so that a separate process can count
  effects across SIGKILLs.

The idempotency key reaches an adapter through the ``idempotency_key`` keyword
only, never through ``arguments``: the arguments are model-controlled text,
and a model that could write the key could make two different calls share one
execution, or make one call look like a new one.  The ``attempt`` keyword
carries the attempt number so that a reconcile connector can fence attempts
*per attempt* (``docs/protocol.md#subtleties``): the late original (attempt n) is
rejected, the retry (attempt n+1) is not.

This module must never decide recovery (that is
:func:`toolledger._core.protocol.decide_recovery`'s job), never derive an execution
id, and never forward a model-supplied argument named like the key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Protocol, TypeAlias, runtime_checkable

from .protocol import InvalidInput, RecoveryPolicy, ToolProfile

__all__ = [
    "RESERVED_ARGUMENT_NAMES",
    "AdapterOutcome",
    "Applied",
    "CannotTell",
    "DefiniteFailure",
    "NotAppliedFenced",
    "ReconcileAnswer",
    "ReconcilingAdapter",
    "RegisteredTool",
    "ToolAdapter",
    "ToolRegistry",
    "Unknown",
    "WasApplied",
    "check_arguments",
    "frozen_arguments",
    "reserved_argument_paths",
]


# --------------------------------------------------------------------------
# What an adapter may answer
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """The external system applied the effect (or deduplicated it) and answered."""

    result: str


@dataclass(frozen=True, slots=True)
class DefiniteFailure:
    """The external system definitely did NOT apply the effect (e.g. rejected it)."""

    error: str


@dataclass(frozen=True, slots=True)
class Unknown:
    """Nobody knows whether the effect was applied (time-out, lost answer, ...).

    The engine handles it like a crash: ``EngineTimeout`` then ``Recover``.
    """

    reason: str


AdapterOutcome: TypeAlias = Applied | DefiniteFailure | Unknown


@dataclass(frozen=True, slots=True)
class WasApplied:
    """Reconciliation: execution X was applied; ``result`` is what it returned."""

    result: str


@dataclass(frozen=True, slots=True)
class NotAppliedFenced:
    """Reconciliation: execution X was not applied, and every attempt so far is fenced.

    Only this answer allows a retry: a late original request can no longer land.
    """


@dataclass(frozen=True, slots=True)
class CannotTell:
    """Reconciliation: the connector cannot say (unreachable, no such query, ...)."""

    reason: str


ReconcileAnswer: TypeAlias = WasApplied | NotAppliedFenced | CannotTell


@runtime_checkable
class ToolAdapter(Protocol):
    """Talks to the external system for one tool.

    ``arguments`` are the model's (already checked by :func:`check_arguments`,
    read-only).  ``execution_id`` is the engine's stable identity of the call's
    execution (for logs and for reconciliation).  ``idempotency_key`` is the
    execution id when the tool's policy is ``idempotent`` and ``None``
    otherwise; an idempotent adapter must send it to the external system as
    its deduplication key (e.g. an ``Idempotency-Key`` header).  ``attempt``
    numbers the attempts of one execution (1, 2, ...).

    Return :class:`Applied`, :class:`DefiniteFailure` only when the effect is
    known not to have happened, and :class:`Unknown` for anything else.  An
    exception is treated as :class:`Unknown`.
    """

    def invoke(
        self,
        arguments: Mapping[str, Any],
        *,
        execution_id: str,
        idempotency_key: str | None,
        attempt: int,
    ) -> AdapterOutcome: ...


@runtime_checkable
class ReconcilingAdapter(ToolAdapter, Protocol):
    """An adapter of a ``reconcile`` tool: it can also answer "was X applied?".

    ``reconcile(execution_id, attempt=n)`` must, before it answers
    :class:`NotAppliedFenced`, make the external system reject every request
    of attempts ``<= n`` of that execution that may still arrive.
    """

    def reconcile(self, execution_id: str, *, attempt: int) -> ReconcileAnswer: ...


# --------------------------------------------------------------------------
# The execution identity stays out of the model's reach
# --------------------------------------------------------------------------

RESERVED_ARGUMENT_NAMES: Final[tuple[str, ...]] = (
    "idempotency_key",
    "execution_id",
    "Idempotency-Key",
)
"""Argument names a model may not use: they look like the execution identity.

Matched case-insensitively and ignoring separators, so ``IDEMPOTENCY_KEY``,
``idempotencyKey``, ``execution-id`` and ``ExecutionId`` are reserved too; at
any depth of the arguments (a ``headers`` object may hold one)."""


def _normalized(name: str) -> str:
    return "".join(ch for ch in name.casefold() if ch.isalnum())


_RESERVED: Final = frozenset(_normalized(n) for n in RESERVED_ARGUMENT_NAMES)


def reserved_argument_paths(arguments: Mapping[str, Any]) -> list[str]:
    """Where ``arguments`` use a reserved name, as JSON-ish paths (``headers.Idempotency-Key``)."""
    found: list[str] = []

    def walk(value: object, path: str) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and _normalized(key) in _RESERVED:
                    found.append(where)
                walk(inner, where)
        elif isinstance(value, list | tuple):
            for i, inner in enumerate(value):
                walk(inner, f"{path}[{i}]")

    walk(arguments, "")
    return found


def check_arguments(tool_name: str, arguments: object) -> None:
    """Reject model-supplied arguments that the engine must not forward.

    Raises :class:`~toolledger._core.protocol.InvalidInput` if ``arguments`` is not
    a JSON object, or uses a name of :data:`RESERVED_ARGUMENT_NAMES`.  The
    engine calls it before anything about the call is recorded or executed.
    """
    if not isinstance(arguments, Mapping):
        raise InvalidInput(
            f"arguments of {tool_name!r} must be a JSON object, got {type(arguments).__name__}: "
            "the provider adapter must parse the call's arguments JSON into a dict"
        )
    paths = reserved_argument_paths(arguments)
    if paths:
        raise InvalidInput(
            f"call of {tool_name!r} has a model-supplied argument named like the execution "
            f"identity ({', '.join(paths)}); reserved names: "
            f"{', '.join(RESERVED_ARGUMENT_NAMES)} (any case, any separator). The engine "
            "passes the idempotency key to the adapter itself: remove that argument from the "
            "tool's schema; nothing was recorded or executed"
        )


# --------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisteredTool:
    """One tool as the engine knows it: engine-owned profile and its adapter."""

    profile: ToolProfile
    adapter: ToolAdapter

    @property
    def name(self) -> str:
        return self.profile.name


def _policy(name: str, policy: object) -> RecoveryPolicy:
    if isinstance(policy, RecoveryPolicy):
        return policy
    try:
        return RecoveryPolicy(str(policy))
    except ValueError:
        valid = ", ".join(p.value for p in RecoveryPolicy)
        raise InvalidInput(
            f"unknown recovery policy {policy!r} for tool {name!r}; declare one of: {valid} "
            f"(use {RecoveryPolicy.MANUAL.value!r} when unsure: it never replays)"
        ) from None


class ToolRegistry:
    """Tool name -> (:class:`~toolledger._core.protocol.ToolProfile`, adapter).

    The recovery policy is declared here by the engine, per tool, and is never
    inferred from a category or taken from the model.  Registration validates:
    an unknown policy string, a ``reconcile`` tool whose adapter has no
    ``reconcile()``, an adapter without ``invoke()`` and a duplicate name are
    errors that change nothing.
    """

    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}

    def register(
        self,
        name: str,
        adapter: ToolAdapter,
        *,
        policy: RecoveryPolicy | str = RecoveryPolicy.MANUAL,
        requires_approval: bool = True,
    ) -> ToolProfile:
        """Declare tool ``name``; returns its profile."""
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"tool name must be a non-empty string, got {name!r}")
        if name in self._tools:
            raise InvalidInput(
                f"tool {name!r} is already registered; register each tool once"
            )
        pol = _policy(name, policy)
        if not callable(getattr(adapter, "invoke", None)):
            raise InvalidInput(
                f"adapter of {name!r} ({type(adapter).__name__}) has no invoke(): "
                "implement toolledger._core.tools.ToolAdapter"
            )
        if pol is RecoveryPolicy.RECONCILE and not callable(getattr(adapter, "reconcile", None)):
            raise InvalidInput(
                f"tool {name!r} declares policy 'reconcile' but its adapter "
                f"({type(adapter).__name__}) has no reconcile(execution_id, *, attempt): "
                "implement it, or declare 'manual'"
            )
        profile = ToolProfile(name, pol, requires_approval)
        self._tools[name] = RegisteredTool(profile, adapter)
        return profile

    def get(self, name: str) -> RegisteredTool:
        """The registered tool ``name``; :class:`InvalidInput` naming the known ones if none."""
        tool = self._tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "(none)"
            raise InvalidInput(
                f"no tool named {name!r} is registered; registered tools: {known}"
            )
        return tool

    def profile(self, name: str) -> ToolProfile:
        return self.get(name).profile

    def check_call(self, name: str, arguments: object) -> RegisteredTool:
        """Validate one model call (known tool, arguments a JSON object, no reserved names)."""
        tool = self.get(name)
        check_arguments(name, arguments)
        return tool

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[RegisteredTool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)


def frozen_arguments(arguments: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only deep copy of ``arguments`` (an adapter cannot change the call)."""
    copied = json.loads(json.dumps(arguments))
    assert isinstance(copied, dict)
    return MappingProxyType(copied)
