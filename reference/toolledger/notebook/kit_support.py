"""What notebooks 03 and 05 show of the engine kit: the fault matrix and a real SQLite file.

Split from :mod:`toolledger.notebook.support` (which re-exports every public
name here; notebooks import them from there): the fault matrix's summary
table and its claims (notebook 03: each claim one function that asserts it
over the matrix's cells), and the engine kit on a real SQLite file
(notebook 05: :class:`SqliteWorld`, the audit and tape tables).  The tables
follow :mod:`toolledger.notebook.support`'s rules (HTML, left-aligned).
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import tokenize
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from toolledger._core import protocol as p
from toolledger._core.sqlite_store import SqliteStore
from toolledger._core.stores import AuditRow
from toolledger.kit.engine import (
    CrashInjector,
    FileConversationStore,
    ScriptedHuman,
    TurnEngine,
    parse_crash_point,
)
from toolledger.kit.external import CountingExternalSystem
from toolledger.notebook.figures_matrix import (
    CellCategory,
    ConversationTap,
    LedgerTape,
    MatrixCell,
    category,
    html_table,
    panels,
    scenario_engine,
)

__all__ = [
    "AUDIT_HEADERS",
    "Glue",
    "SqliteWorld",
    "an_adopted_legacy_call_halts_without_a_second_effect",
    "an_unknown_outcome_is_decided_by_the_policy",
    "audit_table_html",
    "cell_summary",
    "find_cell",
    "glue_of",
    "kit_engine_glue",
    "ledger_engine_never_applies_a_protected_call_twice",
    "legacy_engine_duplicates_where_the_result_is_not_checkpointed",
    "matrix_summary",
    "matrix_summary_html",
    "seed_rows_html",
    "short_id",
    "tape_table_html",
    "the_ledger_engine_does_what_the_issue_expects_at_each_seed_row",
]


# ----------------------------------------------------------------------------
# Notebook 03: the fault matrix in one table


def _panel_name(engine: str, session: str) -> str:
    if engine == "legacy":
        return "legacy engine (today's, issue #443)"
    if session == "new":
        return "ledger engine, new session"
    return "ledger engine resumes a legacy session (adopted)"


def matrix_summary(cells: Sequence[MatrixCell]) -> list[list[str | int]]:
    """Per panel of the fault matrix: crash points x policies run, and the cells per outcome."""
    rows: list[list[str | int]] = []
    for engine, session, _mode in panels():
        mine = [c for c in cells if (c.engine, c.session) == (engine, session)]
        if not mine:
            continue
        count = {cat: sum(category(c) is cat for c in mine) for cat in CellCategory}
        rows.append([_panel_name(engine, session), len(mine),
                     *(count[cat] for cat in _SUMMARY_CATEGORIES)])
    return rows


_SUMMARY_CATEGORIES: Final = (CellCategory.DUPLICATE, CellCategory.ONE_EFFECT,
                              CellCategory.NO_EFFECT, CellCategory.READONLY_REPLAY,
                              CellCategory.NOT_ON_PATH, CellCategory.ERROR)


def matrix_summary_html(cells: Sequence[MatrixCell]) -> str:
    """:func:`matrix_summary` as a table; the duplicate column first, as the finding."""
    return html_table(["panel", "cells", *(cat.value for cat in _SUMMARY_CATEGORIES)],
                      matrix_summary(cells),
                      caption="Every crash point x policy, counted by the external system")


# ----------------------------------------------------------------------------
# Notebook 05: the engine kit on a real SQLite file


class SqliteWorld:
    """What survives a crash, in one directory: the SQLite ledger, the conversation files and
    the external system's fsynced log. :meth:`open_engine` is what a (re)started process does.
    """

    def __init__(self, parent: Path, name: str, policy: str = "manual") -> None:
        self.dir = parent / name
        self.dir.mkdir()
        self.policy = policy
        self.tape = LedgerTape()
        self._store: SqliteStore | None = None
        self._system: CountingExternalSystem | None = None

    @property
    def store(self) -> SqliteStore:
        if self._store is None:
            raise RuntimeError("no engine opened yet: call open_engine() first")
        return self._store

    @property
    def system(self) -> CountingExternalSystem:
        if self._system is None:
            raise RuntimeError("no engine opened yet: call open_engine() first")
        return self._system

    def reopen_store(self) -> SqliteStore:
        """Close the store and open the file again (opening validates it)."""
        self.close()
        self._store = SqliteStore(self.dir / "ledger.sqlite3")
        return self._store

    def open_engine(
        self,
        crash_at: str | None = None,
        human: ScriptedHuman | None = None,
        script: Sequence[Sequence[dict[str, Any]] | str] | None = None,
    ) -> TurnEngine:
        """A new engine process on this directory's files, dying at ``crash_at`` if given."""
        store = self.reopen_store()
        self._system = CountingExternalSystem(self.dir / "external.jsonl")
        conversations = ConversationTap(FileConversationStore(self.dir / "conversation"),
                                        self.tape)
        crash = CrashInjector(parse_crash_point("ledger", crash_at) if crash_at else None)
        return scenario_engine("ledger", self.policy, store=store, conversations=conversations,
                               system=self._system, crash=crash, tape=self.tape, human=human,
                               script=script)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


AUDIT_HEADERS: Final = ("kind", "attempt", "authorization", "recovery_decision",
                        "tool_call_id", "execution_id", "position", "note",
                        "inputs (of the decision)")


def short_id(execution_id: str) -> str:
    """An execution id cut to its first 13 characters, for a table."""
    return execution_id[:13] + "…"


def audit_table_html(rows: Sequence[AuditRow], *, caption: str | None = None) -> str:
    """Audit rows as stored, one line each (execution ids shortened)."""
    return html_table(list(AUDIT_HEADERS), [
        [r.kind, r.attempt, r.authorization.value, r.recovery_decision or "", r.tool_call_id,
         short_id(r.execution_id), r.position, r.note,
         ", ".join(f"{k}={v}" for k, v in r.inputs.items())] for r in rows], caption=caption)


def tape_table_html(tape: LedgerTape) -> str:
    """A turn's tape: every ledger call and conversation checkpoint in order, with the SQLite
    commits each made; the rows that wrote a ledger record are shaded."""
    who = {"open": "engine opens the ledger", "commit": "Ledger.step / step_many",
           "conversation": "conversation checkpoint", "crash": "crash"}
    rows = []
    for n, entry in enumerate(tape.entries, 1):
        what = entry.note
        if entry.kind == "open" and entry.after is not None:
            what = f"session {entry.after.session_id!r}, marker {entry.after.marker}"
        rows.append([n, who[entry.kind], what, entry.commits, entry.ledger_commits])
    return html_table(["#", "who", "events / what was saved", "SQLite commits",
                       "of which wrote a ledger record"], rows,
                      highlight=[i for i, e in enumerate(tape.entries) if e.ledger_commits])


# ----------------------------------------------------------------------------
# Notebook 03: what the matrix shows, each claim one function that asserts it

_UNKNOWN_OUTCOME: Final = ("after EngineInvokeAdapter", "after ExternalApply")
_POLICY_DECISION: Final[Mapping[str, str]] = {"manual": "recovery_required",
                                              "idempotent": "retry_same_id",
                                              "reconcile": "reconcile"}


def _panel(cells: Sequence[MatrixCell], engine: str, session: str) -> list[MatrixCell]:
    return [c for c in cells if (c.engine, c.session) == (engine, session)]


def find_cell(cells: Sequence[MatrixCell], engine: str, session: str, policy: str,
              point: str) -> MatrixCell:
    """The one cell of the matrix at (engine, session kind, policy, crash point)."""
    found = [c for c in cells
             if (c.engine, c.session, c.policy, c.point) == (engine, session, policy, point)]
    if len(found) != 1:
        raise KeyError(f"{len(found)} cells at {(engine, session, policy, point)}")
    return found[0]


def legacy_engine_duplicates_where_the_result_is_not_checkpointed(
        cells: Sequence[MatrixCell]) -> str:
    """Today's engine applies a protected call twice exactly at the three crash points between
    the request leaving and the result being checkpointed: the issue's rows 2, 3 and 4."""
    from toolledger.notebook.figures_matrix import seed_row_of

    legacy = _panel(cells, "legacy", "new")
    duplicated = {c.point for c in legacy if category(c) is CellCategory.DUPLICATE}
    assert duplicated == {"after EngineInvokeAdapter", "after ExternalApply",
                          "after EngineAppendResult"}, duplicated
    assert all(c.effects == 2 for c in legacy if c.point in duplicated)
    assert {seed_row_of("legacy", pt) for pt in duplicated} == {
        "after_dispatched_call_out", "after_external_success",
        "after_succeeded_before_tool_message"}
    n = sum(category(c) is CellCategory.DUPLICATE for c in legacy)
    return (f"legacy engine: {len(duplicated)} crash points deliver a protected call twice "
            f"({n} cells)")


def ledger_engine_never_applies_a_protected_call_twice(cells: Sequence[MatrixCell]) -> str:
    """On a new session and on an adopted legacy one, no protected call is applied twice."""
    ledger = [c for c in cells if c.engine == "ledger"]
    twice = [c.label for c in ledger if c.protected and c.effects > 1]
    assert not twice, twice
    return f"ledger engine: 0 of {len(ledger)} cells apply a protected call twice"


def an_unknown_outcome_is_decided_by_the_policy(cells: Sequence[MatrixCell]) -> str:
    """Where the outcome is unknown, manual halts, idempotent retries under the same id and
    reconcile asks the connector, each with one effect; a manual halt before the request
    left has no effect at all."""
    checked = 0
    for c in _panel(cells, "ledger", "new"):
        if c.point in _UNKNOWN_OUTCOME and c.protected:
            assert c.decisions == (_POLICY_DECISION[c.policy],), c.label
            assert c.effects == 1
            assert c.status == ("recovery_required" if c.policy == "manual" else "done")
            checked += 1
        if c.point == "after EnginePersistDispatched" and c.policy == "manual":
            assert (c.decisions, c.effects, c.invocations) == (("recovery_required",), 0, 0)
    return f"unknown outcome: {checked} cells decided by their policy, one effect each"


def an_adopted_legacy_call_halts_without_a_second_effect(cells: Sequence[MatrixCell]) -> str:
    """On an adopted legacy session, an approved unanswered call halts whatever its policy,
    and the ledger engine sends nothing (the only effects are the legacy engine's)."""
    adopted = _panel(cells, "ledger", "legacy")
    halted = [c for c in adopted if c.protected and c.status != "error"
              and c.decisions == ("recovery_required",)]
    assert {c.point for c in halted} == {"after HumanApprove", "after EngineInvokeAdapter",
                                         "after ExternalApply", "after EngineAppendResult"}
    assert all(c.effects == c.legacy_effects for c in halted)
    assert all(c.effects == 0 for c in halted if c.point == "after HumanApprove")
    return f"adopted legacy session: {len(halted)} cells halt, none adds an effect"


def cell_summary(c: MatrixCell) -> str:
    """A matrix cell in one line: decisions, effects, invocations, turn status."""
    decided = ", ".join(c.decisions) or "no recovery decision"
    return f"{decided}; effects {c.effects}; invocations {c.invocations}; turn {c.status}"


def seed_rows_html(cells: Sequence[MatrixCell]) -> str:
    """The issue's five rows in its own words next to what was measured at each."""
    from toolledger.kit.engine import SEED_MATRIX
    from toolledger.notebook.figures_matrix import POLICIES

    rows = []
    for number, row in enumerate(SEED_MATRIX.values(), 1):
        new = {pol: find_cell(cells, "ledger", "new", pol, row.ledger.name)
               for pol in POLICIES[1:]}
        old = find_cell(cells, "legacy", "new", "manual", row.legacy.name)
        adopted = find_cell(cells, "ledger", "legacy", "manual", row.legacy.name)
        ledger_text = "\n".join(f"{pol}: {cell_summary(c)}" for pol, c in new.items())
        rows.append([f"{number}. {row.crash_point}", row.durable_state, row.expected,
                     f"{row.legacy.name}\n{cell_summary(old)}",
                     f"{row.ledger.name}\n{ledger_text}",
                     cell_summary(adopted) if adopted.status != "error"
                     else f"ERROR: {adopted.error}"])
    return html_table(["seed row", "durable state (issue)", "expected recovery (issue)",
                       "legacy engine (manual)", "ledger engine, new session",
                       "ledger engine, legacy session (manual)"], rows)


def the_ledger_engine_does_what_the_issue_expects_at_each_seed_row(
        cells: Sequence[MatrixCell]) -> str:
    """Row 1: execute once on a session known to use the protocol, else review; rows 2-3: no
    silent replay, the declared policy applies; row 4: reconstruct, never call again; row 5:
    no replay on either engine."""
    from toolledger.kit.engine import SEED_MATRIX

    r1, r2, r3, r4, r5 = SEED_MATRIX.values()
    assert cell_summary(find_cell(cells, "ledger", "new", "manual", r1.ledger.name)).startswith(
        "execute; effects 1")
    assert find_cell(cells, "ledger", "legacy", "manual", r1.legacy.name).decisions == (
        "recovery_required",)
    invocations = {(r2, "manual"): 1, (r2, "idempotent"): 2, (r2, "reconcile"): 2,
                   (r3, "manual"): 1, (r3, "idempotent"): 2, (r3, "reconcile"): 1}
    for (r, pol), n in invocations.items():
        c = find_cell(cells, "ledger", "new", pol, r.ledger.name)
        assert (c.decisions, c.effects, c.invocations) == ((_POLICY_DECISION[pol],), 1, n), c.label
    for pol in ("manual", "idempotent", "reconcile"):
        c = find_cell(cells, "ledger", "new", pol, r4.ledger.name)
        assert (c.invocations, c.effects, c.tool_status, c.status) == (1, 1, "ok", "done")
    for engine in ("legacy", "ledger"):
        c = find_cell(cells, engine, "new", "manual", r5.point(engine).name)
        assert (c.effects, c.invocations, c.decisions) == (1, 1, ())
    return "the five seed rows: the ledger engine does what the issue expects at each"


# ----------------------------------------------------------------------------
# Notebook 05 and docs/adopting.md: how much of the kit engine talks to the ledger


@dataclass(frozen=True)
class Glue:
    """The lines of an engine module's code (no docstring, comment or blank line) that
    reach the ledger or the spec's vocabulary directly, or call the adopter's API."""

    code_lines: int
    spec_events: tuple[str, ...]  # lines naming an action of the spec (an Event's name)
    ledger: tuple[str, ...]  # lines touching the Ledger, an Event or a Stage directly
    session: tuple[str, ...]  # lines calling the Session (the adopter's API)


_LEDGER_NAMES: Final = frozenset({"ledger", "Ledger", "Event", "Stage"})
# tokens joined by single spaces: "self . session . record ("
_SESSION_CALL: Final = re.compile(r"\b(?:session|Session) \. \w+ \(")


def glue_of(source: str) -> Glue:
    """Count :class:`Glue` in a module's source.

    Docstrings and comments are skipped (prose may name the spec; code that
    does is glue an adopter would have to write).  A spec action's name counts
    anywhere in the code, strings too (``"after ExternalApply"`` narrates the
    spec as much as ``Action.ExternalApply``); the ledger counts as a name in
    the code (``self.ledger.step``), not inside a message's text.
    """
    tree = ast.parse(source)
    prose: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            prose.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    actions = re.compile(r"\b(?:" + "|".join(a.value for a in p.Action) + r")\b")
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    lines: dict[int, list[tokenize.TokenInfo]] = {}
    cut: dict[int, int] = {}  # line -> column where its comment starts
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0]] = tok.start[1]
        elif tok.type not in skip and tok.start[0] not in prose:
            lines.setdefault(tok.start[0], []).append(tok)
    physical = source.splitlines()
    code = []  # (the line as written, its tokens joined by spaces, its names)
    for n, toks in sorted(lines.items()):
        code.append((physical[n - 1][:cut.get(n)].strip(), " ".join(t.string for t in toks),
                     {t.string for t in toks if t.type == tokenize.NAME}))
    return Glue(len(code), tuple(line for line, text, _ in code if actions.search(text)),
                tuple(line for line, _, names in code if names & _LEDGER_NAMES),
                tuple(line for line, text, _ in code if _SESSION_CALL.search(text)))


def kit_engine_glue() -> Glue:
    """:func:`glue_of` the kit engine (:mod:`toolledger.kit.engine`)."""
    from toolledger.kit import engine

    return glue_of(inspect.getsource(engine))
