"""What the notebooks show, and how: tables, figures, spec excerpts and TLC runs in one place.

The notebooks are read by reviewers, mostly as HTML with the code hidden
(``make notebooks-html``).  So the helpers here follow a few rules:

- **Tables** are HTML with every column left-aligned (Jupyter's default CSS
  right-aligns table cells, which makes sentences hard to read).
- **Figures** are shown as ``<img>`` elements with alt text, at a width that
  fits the page, and refused if any of their text would render smaller than
  :data:`MIN_TEXT_PT` at that width.
- **Spec text** is read from ``spec/`` when the notebook runs, never pasted:
  a protocol change shows up in the notebook at the next execution.
- **TLC runs** are summarised (result, states, depth, time, the counterexample
  as a table); TLC's raw output, with its banners, seeds and temp paths, is
  never shown.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import itertools
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from toolledger._core import protocol as p
from toolledger.check.invariants import INVARIANTS
from toolledger.check.manifest import Manifest, ModelEntry
from toolledger.check.mapping import from_spec
from toolledger.check.stategraph import StateGraph, load_dot
from toolledger.check.system import CallConfig, ModelConfig
from toolledger.check.tlc import Outcome, TLCResult, TraceStep, parse_cfg, run_tlc
from toolledger.check.tlccache import cache_from_env
from toolledger.check.tracecheck import config_module
from toolledger.notebook.figures import bfs_depths
from toolledger.notebook.figures_matrix import (
    html_table,
)

# The engine kit's tables and claims (notebooks 03 and 05) live in kit_support;
# re-exported here, so notebooks keep importing everything from this module.
from toolledger.notebook.kit_support import (
    AUDIT_HEADERS,
    SqliteWorld,
    an_adopted_legacy_call_halts_without_a_second_effect,
    an_unknown_outcome_is_decided_by_the_policy,
    audit_table_html,
    cell_summary,
    find_cell,
    ledger_engine_never_applies_a_protected_call_twice,
    legacy_engine_duplicates_where_the_result_is_not_checkpointed,
    matrix_summary,
    matrix_summary_html,
    seed_rows_html,
    short_id,
    tape_table_html,
    the_ledger_engine_does_what_the_issue_expects_at_each_seed_row,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "AUDIT_HEADERS",
    "MIN_TEXT_PT",
    "PAGE_WIDTH_PX",
    "ModelRun",
    "Rendered",
    "SmallTextError",
    "SqliteWorld",
    "TLCWorkspace",
    "an_adopted_legacy_call_halts_without_a_second_effect",
    "an_unknown_outcome_is_decided_by_the_policy",
    "audit_table_html",
    "cell_summary",
    "code_block",
    "compare_decide_with_spec",
    "decisions_through_tlc",
    "definition",
    "definition_names",
    "every_state_of",
    "figure_html",
    "find_cell",
    "find_issue_443_steps",
    "html_table",
    "invariants_of",
    "issue_443_steps_html",
    "leading_comment",
    "ledger_engine_never_applies_a_protected_call_twice",
    "legacy_engine_duplicates_where_the_result_is_not_checkpointed",
    "manual_calls_model",
    "matrix_summary",
    "matrix_summary_html",
    "models_of_spec",
    "next_actions",
    "one_call_model",
    "recovery_inputs_space",
    "recovery_table",
    "recovery_table_html",
    "run_manifest_model",
    "seed_rows_html",
    "short_id",
    "show_figure",
    "smallest_text",
    "spec_approval_gate",
    "spec_at_most_once_effect",
    "spec_excerpt_markdown",
    "step_value",
    "study_broken_twin",
    "tape_table_html",
    "the_ledger_engine_does_what_the_issue_expects_at_each_seed_row",
    "tlc_summary_html",
    "variables_block",
]

# ----------------------------------------------------------------------------
# Figures

#: The widest a figure is shown (CSS px): about the text width of a notebook page.
PAGE_WIDTH_PX: Final = 960
#: The smallest text a figure may have at the width it is shown.
MIN_TEXT_PT: Final = 10.0
_CSS_PX_PER_INCH: Final = 96.0
# PNG pixels per CSS pixel: 1, as Jupyter's inline backend does; keeps committed notebooks small.
_PNG_SCALE: Final = 1.0


class SmallTextError(ValueError):
    """A figure has text that would render smaller than :data:`MIN_TEXT_PT`."""


def shown_width_px(fig: Figure) -> float:
    """The CSS width a figure is shown at: its natural size, or the page width if narrower."""
    natural = float(fig.get_figwidth()) * _CSS_PX_PER_INCH
    return min(natural, float(PAGE_WIDTH_PX))


def smallest_text(fig: Figure) -> tuple[float, str]:
    """The smallest visible, non-empty text of ``fig`` as rendered on the page: (pt, text).

    Sizes are scaled by how much the figure is shrunk to fit :data:`PAGE_WIDTH_PX`.
    A figure without text gives ``(inf, "")``.
    """
    from matplotlib.text import Text

    scale = shown_width_px(fig) / (float(fig.get_figwidth()) * _CSS_PX_PER_INCH)
    fig.canvas.draw()  # tick labels and legends exist only once drawn
    found: list[tuple[float, str]] = []
    for artist in fig.findobj(Text):
        assert isinstance(artist, Text)
        text = artist.get_text().strip()
        if not text or not artist.get_visible():
            continue
        found.append((float(artist.get_fontsize()) * scale, text))
    return min(found, default=(float("inf"), ""))


def _png(fig: Figure, dpi: float) -> bytes:
    # A 128-colour palette PNG: these figures are flat colours and text, and a palette
    # makes them about five times smaller than matplotlib's RGBA output, which keeps the
    # committed notebooks small.
    from PIL import Image

    raw = io.BytesIO()
    fig.savefig(raw, format="png", dpi=dpi, metadata={"Software": None})
    raw.seek(0)
    with Image.open(raw) as img:
        palette = img.convert("RGB").quantize(colors=128, method=Image.Quantize.FASTOCTREE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def figure_html(fig: Figure, alt: str, *, min_pt: float = MIN_TEXT_PT) -> str:
    """``fig`` as an ``<img>`` element with ``alt`` text, at most :data:`PAGE_WIDTH_PX` wide.

    Raises :class:`SmallTextError` naming the smallest text if any text would
    render below ``min_pt`` at that width: make the figure narrower or its text
    larger.
    """
    if not alt.strip():
        raise ValueError("a figure needs alt text: say what it shows")
    size, text = smallest_text(fig)
    if size < min_pt:
        raise SmallTextError(
            f"text {text[:40]!r} would render at {size:.1f} pt (< {min_pt} pt) at "
            f"{shown_width_px(fig):.0f} px wide: enlarge it or make the figure narrower")
    width = shown_width_px(fig)
    dpi = width * _PNG_SCALE / float(fig.get_figwidth())
    data = base64.b64encode(_png(fig, dpi)).decode("ascii")
    return (f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt, quote=True)}" '
            f'style="width:{width:.0f}px;max-width:100%;height:auto">')


@dataclass(frozen=True)
class Rendered:
    """HTML that Jupyter displays when a cell ends with it (or with ``display(it)``)."""

    html: str
    #: What a plain-text front end (and the notebook file's text/plain copy) shows instead.
    text: str = "(HTML output)"

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


def show_figure(fig: Figure, alt: str) -> Rendered:
    """``fig`` ready to display (see :func:`figure_html`); the figure is closed, so
    matplotlib's inline backend does not show it a second time without alt text."""
    import matplotlib.pyplot as plt

    try:
        return Rendered(figure_html(fig, alt), text=f"[figure: {alt}]")
    finally:
        plt.close(fig)


# ----------------------------------------------------------------------------
# The spec, read when the notebook runs

_DEFINITION: Final = re.compile(r"^([A-Za-z_]\w*)\s*(\([^)]*\))?\s*==", re.MULTILINE)


def definition_names(spec: str) -> list[str]:
    """Every operator defined at the left margin of ``spec``, in order."""
    return [m.group(1) for m in _DEFINITION.finditer(spec)]


def _definition_span(spec: str, name: str) -> tuple[int, int]:
    starts = list(_DEFINITION.finditer(spec))
    for i, m in enumerate(starts):
        if m.group(1) == name:
            end = starts[i + 1].start() if i + 1 < len(starts) else len(spec)
            return m.start(), end
    raise KeyError(f"{name} is not defined at the left margin of the spec")


def leading_comment(spec: str, name: str) -> str:
    """The comment just above the definition of ``name`` (``\\*`` lines or a ``(* *)`` box).

    Comment markers and box borders are stripped; an empty string if there is none.
    """
    start, _ = _definition_span(spec, name)
    lines = spec[:start].splitlines()
    taken: list[str] = []
    while lines and lines[-1].strip().startswith(("\\*", "(*")):
        taken.append(lines.pop())
    words = []
    for line in reversed(taken):
        body = line.strip()
        if re.fullmatch(r"\(\*+\)", body):  # a box border
            continue
        body = re.sub(r"^\\\*\s?", "", body)
        body = re.sub(r"^\(\*+", "", body)
        body = re.sub(r"\*+\)$", "", body).strip()
        if body and set(body) != {"*"}:
            words.append(body)
    return " ".join(" ".join(words).split())


def definition(spec: str, name: str) -> str:
    """The text of the definition of ``name``, up to the next definition or comment.

    A trailing comment or separator that introduces the next definition is left out.
    """
    start, end = _definition_span(spec, name)
    lines = spec[start:end].rstrip().splitlines()
    while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith(("\\*", "(*"))
                     or set(lines[-1].strip()) <= {"-", "="}):
        lines.pop()
    return "\n".join(lines)


def next_actions(spec: str) -> list[str]:
    """The operators that are disjuncts of ``Next``, in the order ``Next`` lists them."""
    body = definition(spec, "Next")
    return re.findall(r"\\/\s+(?:\\E [^:]+:\s*)?(\w+)", body)


def variables_block(spec: str) -> str:
    """The spec's ``VARIABLES`` declaration with its comments, up to the first blank line."""
    m = re.search(r"^VARIABLES\b.*?(?=\n\s*\n)", spec, re.MULTILINE | re.DOTALL)
    if m is None:
        raise KeyError("the spec declares no VARIABLES at the left margin")
    return m.group(0)


def code_block(text: str) -> str:
    """``text`` as a Markdown code block.

    No language tag: nbconvert's Markdown renderer prints an unknown tag (``tla``)
    as the first line of the code.
    """
    fence = "````" if "```" in text else "```"
    return f"{fence}\n{text}\n{fence}"


def spec_excerpt_markdown(spec: str, names: Iterable[str], *, source: str) -> str:
    """A Markdown code block with the definitions of ``names``, cited as from ``source``."""
    chosen = list(names)
    body = "\n\n".join(definition(spec, n) for n in chosen)
    return f"From `{source}` ({', '.join(f'`{n}`' for n in chosen)}):\n\n{code_block(body)}"


def models_of_spec(manifest: Manifest, spec: str = "DurableToolExecution") -> list[ModelEntry]:
    """The manifest's models whose module extends ``spec`` (the others model another spec,
    e.g. ``LegacyResume``, whose invariants share some names)."""
    def extended(module: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """``module``'s EXTENDS, transitively (MC modules may extend one another)."""
        path = manifest.root / "model" / f"{module}.tla"
        if module in seen or not path.is_file():
            return set()
        m = re.search(r"^EXTENDS\b([^\n]*)", path.read_text(), re.MULTILINE)
        names = set(re.findall(r"\w+", m.group(1))) if m else set()
        return names.union(*(extended(n, seen | {module}) for n in names))

    return [m for m in manifest.models if spec in extended(m.module)]


def invariants_of(entry: ModelEntry) -> tuple[str, ...]:
    """The invariants a manifest model's ``.cfg`` checks, in its order."""
    return parse_cfg(entry.cfg_path).invariants


# ----------------------------------------------------------------------------
# The recovery table


#: The rows of the recovery table: the durable state recovery finds for a call with no
#: result in the conversation, and the ledger status, legacy flag and approval behind it.
RECOVERY_ROWS: Final[tuple[tuple[str, p.LedgerStatus, bool, p.ApprovalState], ...]] = (
    ("no record (a call the protocol governs)", p.LedgerStatus.NONE, False,
     p.ApprovalState.APPROVED),
    ("no record, legacy call (before the marker), approved", p.LedgerStatus.NONE, True,
     p.ApprovalState.APPROVED),
    ("no record, legacy call, approval still pending", p.LedgerStatus.NONE, True,
     p.ApprovalState.PENDING),
    ("dispatched (outcome unknown)", p.LedgerStatus.DISPATCHED, False, p.ApprovalState.APPROVED),
    ("succeeded", p.LedgerStatus.SUCCEEDED, False, p.ApprovalState.APPROVED),
    ("failed", p.LedgerStatus.FAILED, False, p.ApprovalState.APPROVED),
    ("abandoned", p.LedgerStatus.ABANDONED, False, p.ApprovalState.APPROVED),
    ("recovery_required", p.LedgerStatus.RECOVERY_REQUIRED, False, p.ApprovalState.APPROVED),
)
#: Rows that hold for every record status: a result in the conversation; a record written
#: for other arguments than the call now at its position.
RESULT_ROW: Final = "any record, and a result is already in the conversation"
MISMATCH_ROW: Final = "a record for other arguments than the call at its position"
#: The dispatched row once the idempotency key's retention window has passed
#: (keyRetained false): the key may be gone, so no retry with it.
KEY_EXPIRED_ROW: Final = "dispatched, past the key's retention window"


def _inputs(status: p.LedgerStatus, policy: p.RecoveryPolicy, *, attempt: int = 1,
            max_attempts: int = 2, legacy: bool = False,
            approval: p.ApprovalState = p.ApprovalState.APPROVED, has_result: bool = False,
            digest_matches: bool = True, requires_approval: bool = True,
            key_retained: bool = True) -> p.RecoveryInputs:
    return p.RecoveryInputs(
        status=status, attempt=0 if status is p.LedgerStatus.NONE else attempt,
        digest_matches=digest_matches, approval=approval, has_result=has_result, policy=policy,
        legacy=legacy, requires_approval=requires_approval, max_attempts=max_attempts,
        key_retained=key_retained)


def _cell(status: p.LedgerStatus, policy: p.RecoveryPolicy, max_attempts: int, *,
          legacy: bool = False, approval: p.ApprovalState = p.ApprovalState.APPROVED,
          has_result: bool = False, digest_matches: bool = True,
          key_retained: bool = True) -> str:
    # The decision at every attempt the budget allows; two when the budget matters.
    by_attempt = {
        a: p.decide_recovery(_inputs(
            status, policy, attempt=a, max_attempts=max_attempts, legacy=legacy,
            approval=approval, has_result=has_result, digest_matches=digest_matches,
            key_retained=key_retained,
        )).decision.value
        for a in range(1, max_attempts + 1)
    }
    first, last = by_attempt[1], by_attempt[max_attempts]
    if first == last:
        return first
    return f"{first}\n(at the last attempt: {last})"


def recovery_table(max_attempts: int = 2) -> list[list[str]]:
    """The recovery table computed by :func:`toolledger._core.protocol.decide_recovery`.

    One row per durable state recovery can find (:data:`RECOVERY_ROWS`, then
    :data:`RESULT_ROW`, :data:`MISMATCH_ROW` and :data:`KEY_EXPIRED_ROW`), one column
    per policy; each cell
    is the decision, with the last-attempt decision where the retry budget matters.
    """
    rows: list[list[str]] = []
    for label, status, legacy, approval in RECOVERY_ROWS:
        rows.append([label, *(_cell(status, pol, max_attempts, legacy=legacy, approval=approval)
                              for pol in p.RecoveryPolicy)])
    rows.append([RESULT_ROW, *(_cell(p.LedgerStatus.DISPATCHED, pol, max_attempts,
                                     has_result=True) for pol in p.RecoveryPolicy)])
    rows.append([MISMATCH_ROW, *(_cell(p.LedgerStatus.DISPATCHED, pol, max_attempts,
                                       digest_matches=False) for pol in p.RecoveryPolicy)])
    rows.append([KEY_EXPIRED_ROW, *(_cell(p.LedgerStatus.DISPATCHED, pol, max_attempts,
                                          key_retained=False) for pol in p.RecoveryPolicy)])
    return rows


def recovery_table_html(max_attempts: int = 2, *, caption: str | None = None) -> str:
    """:func:`recovery_table` as an HTML table (the dispatched row shaded: the unknown outcome)."""
    rows = recovery_table(max_attempts)
    shaded = [i for i, (label, status, *_rest) in enumerate(RECOVERY_ROWS)
              if status is p.LedgerStatus.DISPATCHED]
    return html_table(["durable state found", *(pol.value for pol in p.RecoveryPolicy)], rows,
                      highlight=shaded, caption=caption)


def recovery_inputs_space(max_attempts: int = 2) -> Iterator[p.RecoveryInputs]:
    """Every input of the recovery decision, for a budget of ``max_attempts``."""
    for status, policy, approval, has_result, legacy, needs, matches in itertools.product(
            p.LedgerStatus, p.RecoveryPolicy, p.ApprovalState, (False, True), (False, True),
            (False, True), (True, False)):
        if status is p.LedgerStatus.NONE:
            if matches:  # no record, no digest to compare: one input, not two
                yield _inputs(status, policy, max_attempts=max_attempts, legacy=legacy,
                              approval=approval, has_result=has_result,
                              requires_approval=needs)
            continue
        for attempt, kept in itertools.product(range(1, max_attempts + 1), (True, False)):
            yield _inputs(status, policy, attempt=attempt, max_attempts=max_attempts,
                          legacy=legacy, approval=approval, has_result=has_result,
                          digest_matches=matches, requires_approval=needs, key_retained=kept)


def _tla_bool(b: bool) -> str:
    return "TRUE" if b else "FALSE"


def _decide_call(i: p.RecoveryInputs) -> str:
    # The spec's Decide on the same inputs, as the record DecisionInputs builds (the
    # fields of the spec's Inputs set).
    return (f'Decide([status |-> "{i.status.value}", attempt |-> {i.attempt}, '
            f"digestMatches |-> {_tla_bool(i.digest_matches)}, "
            f'approval |-> "{i.approval.value}", hasResult |-> {_tla_bool(i.has_result)}, '
            f'policy |-> "{i.policy.value}", legacy |-> {_tla_bool(i.legacy)}, '
            f"requiresApproval |-> {_tla_bool(i.requires_approval)}, "
            f"keyRetained |-> {_tla_bool(i.key_retained)}])")


# ----------------------------------------------------------------------------
# TLC runs


@dataclass(frozen=True)
class ModelRun:
    """One TLC run for a notebook: what was asked, and TLC's answer."""

    name: str
    question: str
    result: TLCResult
    graph: StateGraph | None = field(default=None, compare=False)

    @property
    def verdict(self) -> str:
        r = self.result
        if r.outcome is Outcome.PASS:
            return "no error: every invariant and property holds"
        if r.violated:
            return f"{r.violated} is violated"
        return str(r.outcome.value)


def one_call_model(policy: p.RecoveryPolicy | str, *, marker: int = 0, turn: int = 1,
                   needs_approval: bool = True, max_crashes: int = 1,
                   max_attempts: int = 2) -> ModelConfig:
    """A model with one ``send_email``-like call ``c1`` at (turn, 0) with the given policy."""
    tool = p.ToolProfile("send_email", p.RecoveryPolicy(policy), needs_approval)
    call = CallConfig("c1", (turn, 0), "call_0", tool, ("a1",))
    return ModelConfig(calls=(call,), marker=marker, max_crashes=max_crashes,
                       max_attempts=max_attempts)


class TLCWorkspace:
    """A temporary directory for the models a notebook generates; nothing in ``model/`` changes.

    Generated modules extend ``spec/DurableToolExecution.tla`` as it is on disk.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = Path(tempfile.mkdtemp(prefix="toolledger-notebook-"))
        self._names: set[str] = set()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> TLCWorkspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _folder(self, name: str) -> Path:
        if name in self._names or not re.fullmatch(r"[A-Za-z]\w*", name):
            raise ValueError(f"model name {name!r} is taken or not a TLA+ identifier")
        self._names.add(name)
        folder = self.dir / name
        folder.mkdir()
        return folder

    def model_check(
        self,
        cfg: ModelConfig,
        name: str,
        *,
        question: str = "",
        invariants: Sequence[str] = (),
        properties: Sequence[str] = (),
        specification: str = "Spec",
        dump: bool = False,
        extends: Sequence[str] = (),
        extra: str = "",
    ) -> ModelRun:
        """Model-check ``cfg`` (written as module ``MC<name>``) with TLC.

        ``extends`` names modules the model extends besides the spec (e.g.
        ``TLC`` for ``PrintT``); ``extra`` is TLA+ text appended to the model
        module (e.g. ``ASSUME`` lines). With ``dump=True`` the run also
        carries the whole state graph.
        """
        folder = self._folder(name)
        module = config_module(cfg, f"MC{name}")
        if extends:
            module = module.replace("EXTENDS DurableToolExecution",
                                    "EXTENDS " + ", ".join(["DurableToolExecution", *extends]), 1)
        if extra:
            module = module.replace("\n====\n", f"\n{extra.rstrip()}\n====\n")
        (folder / f"MC{name}.tla").write_text(module)
        constants = re.findall(r"^MC(\w+) ==", module, re.MULTILINE)
        text = "CONSTANTS\n" + "".join(f"    {c} <- MC{c}\n" for c in constants)
        text += f"SPECIFICATION {specification}\n"
        if invariants:
            text += "INVARIANTS\n" + "".join(f"    {i}\n" for i in invariants)
        if properties:
            text += "PROPERTIES\n" + "".join(f"    {i}\n" for i in properties)
        (folder / f"{name}.cfg").write_text(text)
        dot = folder / "graph.dot" if dump else None
        result = run_tlc(f"MC{name}", folder / f"{name}.cfg",
                         search_dirs=[self.root / "spec", folder], check_deadlock=False,
                         dump_dot=dot, cache=cache_from_env())
        graph = load_dot(dot) if dot is not None and result.outcome is Outcome.PASS else None
        return ModelRun(name, question, result, graph)


def run_manifest_model(manifest: Manifest, name: str) -> ModelRun:
    """Run model ``name`` of ``model/manifest.toml`` and require the answer the manifest records.

    Raises ``AssertionError`` naming the difference if TLC's outcome, violated
    invariant or number of distinct states is not the manifest's.  Under
    ``make test`` (``TOOLLEDGER_TLC_CACHE``) a run of inputs ``make check`` or
    a test already model-checked is answered from that run's output
    (:mod:`toolledger.check.tlccache`).
    """
    entry = manifest.get(name)
    result = run_tlc(entry.module, entry.cfg_path, search_dirs=manifest.search_dirs,
                     check_deadlock=entry.check_deadlock, cache=cache_from_env(),
                     expected_states=entry.distinct_states)
    if result.outcome is not entry.expected_outcome:
        raise AssertionError(f"{name}: TLC says {result.outcome}, the manifest expects "
                             f"{entry.expected_outcome}")
    if entry.expect != "pass" and result.violated != entry.expect:
        raise AssertionError(f"{name}: {result.violated} is violated, the manifest expects "
                             f"{entry.expect}")
    if result.distinct_states != entry.distinct_states:
        raise AssertionError(f"{name}: {result.distinct_states} distinct states, the manifest "
                             f"records {entry.distinct_states}")
    return ModelRun(name, entry.question, result)


def tlc_summary_html(runs: Iterable[ModelRun], *, caption: str | None = None) -> str:
    """TLC's answers as a table: model, question, result, states, depth, counterexample, time."""
    rows = []
    for run in runs:
        r = run.result
        rows.append([
            run.name, run.question, run.verdict,
            f"{r.distinct_states:,}" if r.distinct_states is not None else "",
            str(r.depth) if r.depth is not None else "",
            f"{len(r.trace)} states" if r.trace else "",
            f"{r.wall_seconds:.1f} s",
        ])
    return html_table(["model", "question", "TLC", "distinct states", "depth",
                       "counterexample", "time"], rows, caption=caption)


def decisions_through_tlc(workspace: TLCWorkspace, inputs: Sequence[p.RecoveryInputs],
                          *, max_attempts: int) -> tuple[list[str], ModelRun]:
    """The spec's ``Decide`` on every one of ``inputs``, evaluated by TLC.

    Generates a one-call model whose ``ASSUME`` prints ``Decide`` of each input
    (TLC evaluates every ``ASSUME`` before it explores), runs it, and returns
    the printed decisions in the order of ``inputs`` with the run.
    """
    if any(i.max_attempts != max_attempts for i in inputs):
        raise ValueError("every input must have the model's max_attempts")
    lines = [f"ASSUME PrintT(<<{k}, {_decide_call(i)}>>)" for k, i in enumerate(inputs)]
    run = workspace.model_check(one_call_model("manual", max_attempts=max_attempts),
                                "DecideEverywhere", extends=("TLC",), extra="\n".join(lines),
                                question="Decide on every input")
    return _printed_decisions(run, len(inputs)), run


@dataclass(frozen=True)
class DecideComparison:
    """The Python ``decide_recovery`` against the spec's ``Decide`` on every input."""

    inputs: int
    disagreements: tuple[tuple[p.RecoveryInputs, str, str], ...]  # (inputs, Python, spec)
    run: ModelRun


def compare_decide_with_spec(workspace: TLCWorkspace, *, max_attempts: int = 2
                             ) -> DecideComparison:
    """Every input of :func:`recovery_inputs_space`, decided by Python and by TLC on the spec."""
    inputs = list(recovery_inputs_space(max_attempts))
    spec, run = decisions_through_tlc(workspace, inputs, max_attempts=max_attempts)
    differ = tuple((i, p.decide_recovery(i).decision.value, s)
                   for i, s in zip(inputs, spec, strict=True)
                   if p.decide_recovery(i).decision.value != s)
    return DecideComparison(len(inputs), differ, run)


def _printed_decisions(run: ModelRun, n: int) -> list[str]:
    found: dict[int, str] = {}
    for m in re.finditer(r'<<\s*(\d+)\s*,\s*"(\w+)"\s*>>', run.result.output):
        found[int(m.group(1))] = m.group(2)
    missing = [k for k in range(n) if k not in found]
    if run.result.outcome is not Outcome.PASS or missing:
        raise AssertionError(f"TLC did not evaluate Decide on every input: outcome "
                             f"{run.result.outcome}, {len(missing)} of {n} missing: "
                             f"{run.result.error_text[:300]}")
    return [found[k] for k in range(n)]


def step_value(step: TraceStep, var: str, key: str = "c1") -> object:
    """``var[key]`` in the state after ``step`` (e.g. ``applied`` of ``c1``)."""
    value = step.state[var]
    assert isinstance(value, Mapping)
    return value[key]


# ----------------------------------------------------------------------------
# Notebook 01: the issue's reproduction, found in TLC's counterexample

#: The reproduction steps of OpenWorker issue #443, in the issue's words.
ISSUE_443_STEPS: Final = (
    "1. a side-effecting tool is approved",
    "2. the external system applies the effect",
    "3. crash before the tool result is durably checkpointed",
    "4. durable resume sees the call as unanswered",
    "5. the already-resolved approval is reused",
    "6. the tool executes again",
)


def find_issue_443_steps(trace: Sequence[TraceStep]) -> list[tuple[str, TraceStep]]:
    """Each reproduction step of issue #443 located in a ``LegacyResume`` counterexample.

    Raises ``AssertionError`` naming the step that is missing or out of order:
    one approval, applied before a crash whose result was not durable, resume
    invoking the call again with the old approval, and a second application.
    """
    names = [step.action for step in trace]

    def at(action: str, after: int = 0) -> int:
        try:
            return names.index(action, after)
        except ValueError:
            raise AssertionError(f"no {action} after step {after} in the trace: {names}") from None

    approve, first_apply, crash = at("HumanApprove"), at("ExternalApply"), at("Crash")
    recover, again = at("Recover", crash), at("EngineInvokeAdapter", crash)
    checks = {
        "one approval, ever": names.count("HumanApprove") == 1,
        "applied before the crash": approve < first_apply < crash,
        "the result was not durable at the crash": step_value(trace[crash], "result") == "none",
        "the effect was applied once at the crash": step_value(trace[crash], "applied") == 1,
        "resume drives the call again": crash < recover < again,
        "with the old approval": step_value(trace[again], "approval") == "approved",
        "the second delivery": step_value(trace[-1], "applied") == 2,
    }
    failed = [what for what, ok in checks.items() if not ok]
    if failed:
        raise AssertionError(f"the trace is not the issue's reproduction: {failed}")
    where = (approve, first_apply, crash, recover, again, len(trace) - 1)
    return [(text, trace[i]) for text, i in zip(ISSUE_443_STEPS, where, strict=True)]


def issue_443_steps_html(found: Sequence[tuple[str, TraceStep]]) -> str:
    """:func:`find_issue_443_steps` as a table: the issue's step, TLC's step, what it shows."""
    rows = [[text, step.index, step.action,
             f"applied = {step_value(step, 'applied')}, approval = "
             f"{step_value(step, 'approval')}, result = {step_value(step, 'result')}"]
            for text, step in found]
    return html_table(["the issue's reproduction step", "TLC step", "action", "state after it"],
                      rows, caption="Issue #443's reproduction, found in TLC's counterexample")


# ----------------------------------------------------------------------------
# Notebook 04: state spaces and the broken twins


def manual_calls_model(calls: int, crashes: int, *, max_attempts: int = 2) -> ModelConfig:
    """``calls`` manual calls that need approval, one per turn, all reusing ``call_0``."""
    return ModelConfig(
        calls=tuple(
            CallConfig(f"c{t}", (t, 0), "call_0",
                       p.ToolProfile("send_email", p.RecoveryPolicy.MANUAL, True), (f"a{t}",))
            for t in range(1, calls + 1)),
        marker=0, max_crashes=crashes, max_attempts=max_attempts)


def spec_at_most_once_effect(cfg: ModelConfig, s: Mapping[str, object]) -> bool:
    """The spec's ``AtMostOnceEffect``, written directly over a TLC state's variables:
    ``\\A c : Protected(c) => applied[ExecId(c)] <= 1 + humanRetries[ExecId(c)]``."""
    applied, retries = s["applied"], s["humanRetries"]
    assert isinstance(applied, Mapping) and isinstance(retries, Mapping)
    return all(applied[cfg.spec_exec_ids[c.name]] <= 1 + retries[cfg.spec_exec_ids[c.name]]
               for c in cfg.calls if c.tool.protected)


def spec_approval_gate(cfg: ModelConfig, s: Mapping[str, object]) -> bool:
    """The spec's ``ApprovalGate`` over a TLC state: every invocation of a protected call
    that needs approval is of a call a human approved, or is human-authorized."""
    approved, invocations = s["humanApproved"], s["invocations"]
    assert isinstance(invocations, Mapping) and isinstance(approved, frozenset | set)
    approved_calls = {pair[0] for pair in approved}  # <<call, arguments>> pairs
    return all(c.name in approved_calls or inv[2] == "human"
               for c in cfg.calls if c.tool.requires_approval and c.tool.protected
               for inv in invocations[c.name])


@dataclass(frozen=True)
class TwinStudy:
    """A broken twin's whole state graph (no crash), where it breaks, and its fixed twin."""

    name: str
    invariant: str
    switch: str
    verdict: TLCResult  # the manifest model's run: TLC's counterexample
    twin: ModelConfig  # the twin with MaxCrashes = 0
    graph: StateGraph
    violating: frozenset[int]
    path: tuple[int, ...]  # a shortest path from Init to the nearest violating state
    nearest: int
    fixed_states: int

    def describe(self) -> str:
        depth = len(self.path) - 1
        return (f"{self.name}: TLC says {self.verdict.violated} is violated (counterexample of "
                f"{len(self.verdict.trace)} states, no crash). With 0 crashes the full graph has "
                f"{len(self.graph.states):,} states; {len(self.violating)} violate "
                f"{self.invariant} (the spec's condition and the Python invariant agree); the "
                f"nearest is {depth} steps from Init.\nFixed twin ({self.switch} = TRUE), same "
                f"bounds: {self.fixed_states:,} states, {self.invariant} holds in all of them.")


def study_broken_twin(
    manifest: Manifest,
    workspace: TLCWorkspace,
    name: str,
    spec_check: Callable[[ModelConfig, Mapping[str, object]], bool],
    switch: str,
    *,
    fixed_run: tuple[ModelConfig, ModelRun] | None = None,
) -> TwinStudy:
    """Where the broken twin ``name`` of the manifest leaves the safe region, checked 4 ways.

    TLC's counterexample for the manifest model must have no crash; the twin is then
    explored whole with 0 crashes and no invariant; the violating states found by
    ``spec_check`` (the invariant over the spec's variables) must be exactly those the
    Python invariant finds on the mapped states; the shortest path to one must be as long
    as TLC's counterexample; and the fixed twin (``switch`` on; ``fixed_run`` if already
    checked with the same constants) must satisfy the invariant everywhere.
    """
    entry = manifest.get(name)
    invariant = entry.expect
    verdict = run_manifest_model(manifest, name).result
    if "Crash" in [step.action for step in verdict.trace]:
        raise AssertionError(f"{name}: TLC's counterexample has a crash; 0 crashes would hide it")
    twin = dataclasses.replace(ModelConfig.from_mc_module(entry.cfg_path.parent
                                                          / f"{entry.module}.tla"),
                               max_crashes=0)
    if switch == "key_by_position":
        fixed = dataclasses.replace(twin, key_by_position=True)
    elif switch == "fence_on_reconcile":
        fixed = dataclasses.replace(twin, fence_on_reconcile=True)
    else:
        raise ValueError(f"no design switch {switch!r}: key_by_position or fence_on_reconcile")
    full = workspace.model_check(twin, f"{name}Full", dump=True)
    if fixed_run is None:
        fixed_result = workspace.model_check(fixed, f"{name}Fixed", invariants=[invariant]).result
    else:
        same, run = fixed_run
        if config_module(same, "M") != config_module(fixed, "M"):
            raise AssertionError(f"{name}: the given fixed run has other constants")
        fixed_result = run.result
    if full.result.outcome is not Outcome.PASS or fixed_result.outcome is not Outcome.PASS:
        raise AssertionError(f"{name}: {full.result.outcome}, fixed {fixed_result.outcome}")
    graph = full.graph
    assert graph is not None
    by_spec = {n for n, s in graph.states.items() if not spec_check(twin, s)}
    by_reference = {n for n, s in graph.states.items()
                    if INVARIANTS[invariant](twin, from_spec(twin, s))}
    if by_spec != by_reference or not by_spec:
        raise AssertionError(f"{name}: the spec's condition finds {len(by_spec)} violating "
                             f"states, the Python invariant {len(by_reference)}")
    depth = bfs_depths(graph)
    nearest = min(by_spec, key=lambda n: (depth[n], n))
    path = tuple(node for node, _ in graph.shortest_path(nearest))
    if len(path) != len(verdict.trace):
        raise AssertionError(f"{name}: the shortest path has {len(path)} states, TLC's "
                             f"counterexample {len(verdict.trace)}")
    return TwinStudy(name, invariant, switch, verdict, twin, graph, frozenset(by_spec), path,
                     nearest, fixed_result.distinct_states or 0)


@dataclass(frozen=True)
class EveryState:
    """A model explored whole by TLC, its states coloured by the ledger status of one call."""

    config: ModelConfig
    run: ModelRun
    graph: StateGraph
    status: Mapping[int, str]  # state -> ledger status of the call
    figure: Rendered


def every_state_of(workspace: TLCWorkspace, cfg: ModelConfig, name: str,
                   invariants: Sequence[str], *, call: str = "c1",
                   title: str | None = None) -> EveryState:
    """Model-check ``cfg`` against ``invariants``, dump its whole state graph, and draw every
    state coloured by ``call``'s ledger status (TLC must pass; the drawing must show each
    state once)."""
    from toolledger.notebook.figures import draw_state_graph, ledger_status

    run = workspace.model_check(cfg, name, invariants=invariants, dump=True)
    if run.result.outcome is not Outcome.PASS or run.graph is None:
        raise AssertionError(f"{name}: TLC says {run.verdict}")
    graph = run.graph
    if len(graph.states) != run.result.distinct_states:
        raise AssertionError(f"{name}: the dump has {len(graph.states)} states, TLC counted "
                             f"{run.result.distinct_states}")
    key = cfg.spec_exec_ids[call]
    status = {n: ledger_status(s, key) for n, s in graph.states.items()}
    fig, drawn = draw_state_graph(
        graph, status, legend_title=f"ledger status of {call}",
        title=f"{title or name}: all {len(graph.states)} states (TLC: all {len(invariants)} "
              "invariants hold)")
    if drawn.nodes != len(graph.states) or dict(drawn.colour_counts) != dict(
            Counter(status.values())):
        raise AssertionError(f"{name}: the drawing does not show each state once")
    shown = show_figure(fig, f"Every one of the {drawn.nodes} states of {title or name}, drawn "
                             "left to "
                             "right by distance from the initial state and coloured by the "
                             "call's ledger status (none, dispatched, succeeded, failed, "
                             "recovery_required, abandoned); crash steps are dashed.")
    return EveryState(cfg, run, graph, status, shown)
