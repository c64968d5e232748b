"""Tables and pictures for the notebooks, computed from the project's own objects.

Everything here takes what the checkers produce (a TLC counterexample as
:class:`~toolledger.check.tlc.TraceStep` values, a :class:`~toolledger.check.stategraph.StateGraph`,
state counts) and turns it into something a reviewer reads: an HTML step
table, a sequence diagram, a drawing of a state graph, a state-space chart.
Nothing is typed in: every arrow, row, node and bar comes from the input.

- :func:`trace_rows` / :func:`trace_table_html`: a counterexample as a step
  table (step, action, only what changed; :func:`toolledger.check.counterexample.changes`).
- :func:`sequence_arrows` / :func:`sequence_diagram`: the same trace as a
  sequence diagram with lifelines for the provider, the engine, the inbox
  (approvals), the external system and the store. The sender of a step is
  the actor of its action (:data:`toolledger._core.protocol.TRANSITIONS`); the
  receiver is the lifeline whose variables the step changed
  (:data:`VARIABLE_LIFELINES`).
- :func:`bfs_depths`, :func:`draw_state_graph`: a small state graph drawn
  with networkx, nodes coloured by a category (e.g. the ledger status of a
  call), states and a path highlighted.
- :func:`state_space_chart`: distinct states against crashes, one line per
  number of calls.

matplotlib and networkx are imported inside the functions that draw, so
importing this module (and the package) costs nothing beyond the standard
library. It never runs TLC and never writes files.
"""

from __future__ import annotations

import html
import itertools
import re
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .._core.protocol import TRANSITIONS, Action, Actor
from ..check.counterexample import changes
from ..check.stategraph import StateGraph
from ..check.tlavalues import FnValue, Value, serialize
from ..check.tlc import TraceStep

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "LIFELINES",
    "LIFELINE_TITLES",
    "STATUS_COLOURS",
    "VARIABLE_LIFELINES",
    "Arrow",
    "GraphDrawing",
    "TraceRow",
    "bfs_depths",
    "draw_state_graph",
    "ledger_status",
    "sender_of",
    "sequence_arrows",
    "sequence_diagram",
    "state_space_chart",
    "trace_rows",
    "trace_table_html",
]

State = Mapping[str, Value]

# ----------------------------------------------------------------------------
# Step tables.


def _short(value: Value, limit: int = 60) -> str:
    """A value as TLA+ text, strings without quotes, cut at ``limit`` characters."""
    text = value if isinstance(value, str) else serialize(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class TraceRow:
    """One step of a counterexample: its number, action and what changed."""

    index: int
    action: str
    changes: tuple[str, ...]  # "path = value" (or "path \\o tail"), TLA+ syntax


def trace_rows(trace: Sequence[TraceStep], *, hide: Iterable[str] = ()) -> list[TraceRow]:
    """The rows of a step table: every variable in the first step, then only changes.

    ``hide`` names variables left out of every row (e.g. the ghost ``crashes``).
    A ``Stuttering`` step has no changes.
    """
    hidden = set(hide)
    rows: list[TraceRow] = []
    prev: dict[str, Value] | None = None
    for step in trace:
        found = [] if step.is_stuttering else changes(prev, step.state)
        text = tuple(
            f"{path} {op} {serialize(value)}"
            for path, op, value in found
            if _root(path) not in hidden
        )
        rows.append(TraceRow(step.index, step.action, text))
        prev = step.state
    return rows


def _root(path: str) -> str:
    """The variable a change path starts with: ``ledger`` in ``ledger[<<...>>].status``."""
    for i, ch in enumerate(path):
        if ch in ".[":
            return path[:i]
    return path


_TABLE_STYLE: Final = (
    "border-collapse:collapse;font-size:14px;text-align:left;margin:4px 0 12px 0"
)
_CELL: Final = "border:1px solid #ccc;padding:2px 8px;vertical-align:top;text-align:left"

#: Figures are drawn one notebook page wide (toolledger.notebook.support shows them at
#: their natural size up to 960 CSS px = 10 in), so these point sizes are what a reader
#: sees; notebook_support refuses a figure with text under 10 pt at the width shown.
FIGURE_WIDTH_IN: Final = 10.0
FONT_PT: Final = 10.0
TITLE_PT: Final = 12.0


def trace_table_html(
    trace: Sequence[TraceStep],
    *,
    violated: str | None = None,
    caption: str | None = None,
    show_init: bool = True,
    hide: Iterable[str] = (),
) -> str:
    """A counterexample as an HTML table (no pandas): step, action, changed variables.

    With ``show_init=False`` the initial state is one summary line (how many
    variables it sets) instead of every variable. With ``violated``, the last
    step is marked as the one whose state breaks that invariant.
    """
    rows = trace_rows(trace, hide=hide)
    out = [f'<table style="{_TABLE_STYLE}">']
    if caption:
        out.append(f'<caption style="text-align:left;font-weight:bold">{html.escape(caption)}'
                   "</caption>")
    out.append(
        "<thead><tr>"
        + "".join(f'<th style="{_CELL}">{h}</th>' for h in ("#", "action", "what changed"))
        + "</tr></thead><tbody>"
    )
    for n, row in enumerate(rows):
        last = n == len(rows) - 1
        if n == 0 and not show_init:
            body = f"<i>initial state ({len(row.changes)} variables set, not shown)</i>"
        elif row.changes:
            body = "<br>".join(f"<code>{html.escape(c)}</code>" for c in row.changes)
        else:
            body = "<i>(nothing changes)</i>"
        style = _CELL
        if last and violated:
            body += (f'<br><b style="color:#b00">&rArr; this state violates '
                     f"{html.escape(violated)}</b>")
            style += ";background:#fdecea"
        out.append(
            f'<tr><td style="{style}">{row.index}</td>'
            f'<td style="{style}"><b>{html.escape(row.action)}</b></td>'
            f'<td style="{style}">{body}</td></tr>'
        )
    out.append("</tbody></table>")
    return "\n".join(out)


# ----------------------------------------------------------------------------
# Sequence diagrams.

LIFELINES: Final = ("provider", "engine", "inbox", "external", "store")
LIFELINE_TITLES: Final[Mapping[str, str]] = {
    "provider": "provider\n(LLM)",
    "engine": "engine\n(memory)",
    "inbox": "inbox\n(approvals)",
    "external": "external\nsystem",
    "store": "store\n(conversation, ledger)",
}

#: Which lifeline holds each spec variable (both specs use these names). A
#: change whose new value is ``"volatile"`` is in the engine's memory instead.
#: Ghost variables (``invocations``, ``humanApproved``, ``humanRetries``,
#: ``crashes``, ``sent``, ``knownOutcome``, ``sentAfterOutcome``, ``decided``)
#: are history for the invariants and belong to no lifeline.
VARIABLE_LIFELINES: Final[Mapping[str, str]] = {
    "msg": "store",
    "args": "store",
    "result": "store",
    "ledger": "store",
    "audit": "store",
    "marker": "store",
    "approval": "inbox",
    "stage": "engine",
    "inflight": "external",
    "fenced": "external",
    "applied": "external",
}
_GHOSTS: Final = frozenset({"invocations", "humanApproved", "humanRetries", "crashes", "sent",
                            "knownOutcome", "sentAfterOutcome", "decided"})
# A step that touches several lifelines points at the first of these.
_RECEIVER_ORDER: Final = ("external", "inbox", "engine", "store", "provider")
# The changes shown under an arrow, most telling first.
_CHANGE_ORDER: Final = ("applied", "result", "approval", "ledger", "msg", "inflight", "fenced",
                        "audit", "args", "stage")
_ACTOR_LIFELINE: Final[Mapping[Actor, str]] = {
    Actor.PROVIDER: "provider",
    Actor.ENGINE: "engine",
    Actor.HUMAN: "inbox",  # a human answers in the inbox
    Actor.EXTERNAL: "external",
    Actor.ENVIRONMENT: "engine",  # Crash: the engine process dies
}
_PREFIX_LIFELINE: Final = (
    ("Provider", "provider"),
    ("Human", "inbox"),
    ("External", "external"),
    ("Engine", "engine"),
)


def sender_of(action: str) -> str:
    """The lifeline that performs ``action``: its actor in
    :data:`~toolledger._core.protocol.TRANSITIONS`, else (an action only the legacy
    spec has) the actor its name starts with."""
    try:
        return _ACTOR_LIFELINE[TRANSITIONS[Action(action)].actor]
    except (ValueError, KeyError):
        pass
    for prefix, lifeline in _PREFIX_LIFELINE:
        if action.startswith(prefix):
            return lifeline
    raise ValueError(f"no lifeline for action {action!r}: name it Provider*/Engine*/Human*/"
                     "External* or add it to toolledger._core.protocol.TRANSITIONS")


@dataclass(frozen=True)
class Arrow:
    """One step of a trace in a sequence diagram."""

    step: int
    action: str
    sender: str
    receiver: str
    changes: tuple[str, ...]  # short "path = value" texts, most telling first
    kind: str  # "message" (sender -> receiver), "self" (sender only), "crash"


def _lifeline_of_change(path: str, value: Value) -> str | None:
    var = _root(path)
    if var in _GHOSTS:
        return None
    if value == "volatile":
        return "engine"
    return VARIABLE_LIFELINES.get(var)


_TUPLE_KEY: Final = re.compile(r"\[<<(.*?)>>\]")


def _compact_path(path: str) -> str:
    """``ledger[<<1, 0, "call_0">>].status`` -> ``ledger[1,0,call_0].status``."""
    return _TUPLE_KEY.sub(lambda m: "[" + m.group(1).replace('"', "").replace(" ", "") + "]",
                          path)


def _change_rank(change: tuple[str, str, Value]) -> tuple[int, int]:
    path = change[0]
    root = _root(path)
    var = _CHANGE_ORDER.index(root) if root in _CHANGE_ORDER else len(_CHANGE_ORDER)
    return var, 0 if path.endswith(".status") else 1


def _arrow_text(path: str, op: str, old: Value | None, new: Value) -> str:
    """One change, short: a set that grew shows only what was added."""
    where = _compact_path(path)
    if isinstance(old, frozenset) and isinstance(new, frozenset) and old < new:
        return f"{where} += {_short(frozenset(new - old), 40)}"
    return f"{where} {op} {_short(new, 40)}"


def sequence_arrows(trace: Sequence[TraceStep]) -> list[Arrow]:
    """One :class:`Arrow` per step after the initial state (stuttering steps excluded)."""
    arrows: list[Arrow] = []
    for prev, step in itertools.pairwise(trace):
        if step.is_stuttering:
            continue
        found = changes(prev.state, step.state)
        sender = sender_of(step.action)
        touched = {_lifeline_of_change(path, value) for path, _, value in found}
        others = [x for x in _RECEIVER_ORDER if x in touched and x != sender]
        if step.action == "Crash":
            kind, receiver = "crash", sender
        elif others:
            kind, receiver = "message", others[0]
        else:
            kind, receiver = "self", sender
        before = {path: value for path, _, value in changes(step.state, prev.state)}
        shown = sorted((c for c in found if _root(c[0]) not in _GHOSTS), key=_change_rank)
        texts = tuple(_arrow_text(path, op, before.get(path), value) for path, op, value in shown)
        arrows.append(Arrow(step.index, step.action, sender, receiver, texts, kind))
    return arrows


_LABEL_BOX: Final[Mapping[str, object]] = {"boxstyle": "square,pad=0.05", "fc": "white",
                                           "ec": "none", "alpha": 0.85}


def sequence_diagram(
    trace: Sequence[TraceStep],
    *,
    title: str | None = None,
    violated: str | None = None,
    max_changes: int = 2,
) -> tuple[Figure, list[Arrow]]:
    """Draw ``trace`` as a sequence diagram; return the figure and its arrows.

    Every step after the initial state is one arrow labelled with its action
    and (in small type) up to ``max_changes`` of the variables it changed; a
    ``Crash`` is a red band across every lifeline (the engine's memory is
    lost, the store and the external system keep theirs). With ``violated``
    the last arrow is red and names the invariant its state breaks.
    """
    import matplotlib.pyplot as plt

    arrows = sequence_arrows(trace)
    gap, row = 2.6, 0.9
    xs = {name: i * gap for i, name in enumerate(LIFELINES)}
    height = 1.8 + row * len(arrows) * 0.8
    # 10 in wide: shown at its natural size on a notebook page, so FONT_PT is what a reader sees.
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH_IN, max(3.0, height)))
    bottom = -(len(arrows) + 0.6) * row
    for name, x in xs.items():
        ax.plot([x, x], [0.2, bottom], color="#999", lw=1, ls="--", zorder=0)
        ax.text(x, 0.45, LIFELINE_TITLES[name], ha="center", va="bottom", fontsize=FONT_PT,
                fontweight="bold",
                bbox={"boxstyle": "round,pad=0.3", "fc": "#eef3fb", "ec": "#6b8cc7"})
    for n, arrow in enumerate(arrows):
        y = -(n + 0.6) * row
        bad = violated is not None and n == len(arrows) - 1
        colour = "#b00" if bad else "#222"
        ax.text(-1.2, y, str(arrow.step), ha="right", va="center", fontsize=FONT_PT,
                color="#666")
        detail = "\n".join(arrow.changes[:max_changes])
        if arrow.kind == "crash":
            ax.axhspan(y - 0.25 * row, y + 0.25 * row, color="#f6c9c9", zorder=0)
            ax.plot([xs["engine"]], [y], marker="X", ms=14, color="#b00", zorder=3)
            ax.text(xs["engine"] + 0.25, y, f"{arrow.action}: the engine's memory is lost",
                    va="center", fontsize=FONT_PT, color="#b00", fontweight="bold")
            continue
        x0 = xs[arrow.sender]
        if arrow.kind == "self":
            ax.annotate("", xy=(x0, y - 0.18 * row), xytext=(x0, y + 0.18 * row),
                        arrowprops={"arrowstyle": "->", "color": colour,
                                    "connectionstyle": "arc3,rad=-1.6", "lw": 1.3})
            lx, ha = x0 + 0.3, "left"
        else:
            x1 = xs[arrow.receiver]
            ax.annotate("", xy=(x1, y), xytext=(x0, y),
                        arrowprops={"arrowstyle": "->", "color": colour, "lw": 1.5})
            lx, ha = (x0 + x1) / 2, "center"
        ax.text(lx, y + 0.06 * row, arrow.action, ha=ha, va="bottom", fontsize=FONT_PT,
                color=colour, fontweight="bold", bbox=_LABEL_BOX)
        if detail:
            ax.text(lx, y - 0.06 * row, detail, ha=ha, va="top", fontsize=FONT_PT, color="#555",
                    family="monospace", bbox=_LABEL_BOX)
        if bad:
            ax.text(xs[LIFELINES[-1]] + 0.4, y, f"violates\n{violated}", va="center",
                    fontsize=FONT_PT, color="#b00", fontweight="bold")
    ax.set_xlim(-1.5, xs[LIFELINES[-1]] + 1.6)
    ax.set_ylim(bottom - 0.1, 1.4)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=TITLE_PT, loc="left")
    fig.tight_layout()
    return fig, arrows


# ----------------------------------------------------------------------------
# State graphs.

#: One colour per ledger status of ``spec/DurableToolExecution.tla``.
STATUS_COLOURS: Final[Mapping[str, str]] = {
    "none": "#c7c7c7",
    "dispatched": "#f0a030",
    "succeeded": "#3a9a4a",
    "failed": "#7a5cc0",
    "recovery_required": "#d03030",
    "abandoned": "#555555",
}


def bfs_depths(graph: StateGraph) -> dict[int, int]:
    """Distance of every reachable state from the nearest initial state."""
    depth: dict[int, int] = {}
    queue: deque[int] = deque()
    for n in sorted(graph.initial):
        depth[n] = 0
        queue.append(n)
    while queue:
        node = queue.popleft()
        for nxt, _ in graph.successors(node):
            if nxt not in depth:
                depth[nxt] = depth[node] + 1
                queue.append(nxt)
    return depth


@dataclass(frozen=True)
class GraphDrawing:
    """What :func:`draw_state_graph` drew, for checks next to the picture."""

    nodes: int
    edges: int  # distinct (source, target) pairs, self-loops left out
    colour_counts: Mapping[str, int]  # category -> number of nodes drawn in its colour
    highlighted: int
    path_edges: int


def draw_state_graph(
    graph: StateGraph,
    category: Mapping[int, str],
    *,
    colours: Mapping[str, str] = STATUS_COLOURS,
    highlight: Iterable[int] = (),
    path: Sequence[int] = (),
    dashed_actions: Iterable[str] = ("Crash",),
    title: str | None = None,
    legend_title: str = "",
) -> tuple[Figure, GraphDrawing]:
    """Draw every state of ``graph`` as a dot, left to right by distance from Init.

    ``category`` gives each state's class (for example the ledger status of a
    call); ``colours`` its colour. ``highlight`` states get a thick red ring,
    and the consecutive states of ``path`` are joined by thick red edges.
    Edges whose action is in ``dashed_actions`` are dashed. Self-loops are
    not drawn.
    """
    import matplotlib.pyplot as plt
    import networkx as nx
    from matplotlib.lines import Line2D

    missing = set(graph.states) - set(category)
    if missing:
        raise ValueError(f"{len(missing)} states have no category, e.g. {min(missing)}")
    unknown = set(category.values()) - set(colours)
    if unknown:
        raise ValueError(f"no colour for categories {sorted(unknown)}")
    depth = bfs_depths(graph)
    rank = {name: i for i, name in enumerate(colours)}
    order = sorted(graph.states, key=lambda n: (depth.get(n, -1), rank[category[n]], n))
    g = nx.DiGraph()
    for n in order:
        g.add_node(n, depth=depth.get(n, -1))
    dashed = set(dashed_actions)
    styles: dict[tuple[int, int], str] = {}
    for src, dst, label in graph.edges:
        if src == dst:
            continue
        g.add_edge(src, dst)
        if label in dashed:
            styles[(src, dst)] = "dashed"
        else:
            styles.setdefault((src, dst), "solid")
    pos = nx.multipartite_layout(g, subset_key="depth", align="vertical")
    # One page wide, so the legend and labels are read at FONT_PT.
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH_IN, 6.5))
    solid = [e for e in g.edges if styles[e] == "solid"]
    dash = [e for e in g.edges if styles[e] == "dashed"]
    path_edges = [(a, b) for a, b in itertools.pairwise(path) if a != b]
    # With a path to show, the rest of the graph is context: faint, so the path reads.
    faint = 0.25 if path_edges else 1.0
    nx.draw_networkx_edges(g, pos, edgelist=solid, ax=ax, width=0.4, alpha=0.35 * faint,
                           arrows=False, edge_color="#555")
    nx.draw_networkx_edges(g, pos, edgelist=dash, ax=ax, width=0.6, alpha=0.5 * faint,
                           arrows=False, edge_color="#c03030", style="dashed")
    if path_edges:
        g.add_edges_from(path_edges)
        nx.draw_networkx_edges(g, pos, edgelist=path_edges, ax=ax, width=2.6,
                               edge_color="#b00000", arrows=True, arrowsize=12)
    counts: Counter[str] = Counter()
    for name, colour in colours.items():
        nodes = [n for n in order if category[n] == name]
        if not nodes:
            continue
        counts[name] = len(nodes)
        nx.draw_networkx_nodes(g, pos, nodelist=nodes, node_color=colour, node_size=28,
                               ax=ax, linewidths=0.3, edgecolors="#333",
                               alpha=0.45 if path_edges else 1.0)
    ringed = sorted(set(highlight))
    if ringed:
        nx.draw_networkx_nodes(g, pos, nodelist=ringed, node_color="none", node_size=80,
                               ax=ax, linewidths=1.5, edgecolors="#b00000")
    # The path's states numbered as the steps of graph.trace_to (1 = the initial state),
    # so the picture and the step table below it read together.
    numbered = [n for i, n in enumerate(path) if i == 0 or n != path[i - 1]]
    if path_edges:
        for step, node in enumerate(numbered, 1):
            x, y = pos[node]
            ax.annotate(str(step), (x, y), textcoords="offset points", xytext=(0, 8),
                        ha="center", va="bottom", fontsize=FONT_PT, fontweight="bold",
                        color="#b00000")
    handles = [
        Line2D([], [], marker="o", ls="", color=colours[name], markeredgecolor="#333",
               label=f"{name} ({counts[name]})")
        for name in colours if counts[name]
    ]
    if dash:
        handles.append(Line2D([], [], color="#c03030", ls="--",
                              label=" / ".join(sorted(dashed)) + f" ({len(dash)} edges)"))
    if ringed:
        handles.append(Line2D([], [], marker="o", ls="", markerfacecolor="none",
                              markeredgecolor="#b00000", markeredgewidth=1.8,
                              label=f"violating ({len(ringed)})"))
    if path_edges:
        handles.append(Line2D([], [], color="#b00000", lw=2.6,
                              label="shortest path to one\n(numbers: its steps)"))
    ax.legend(handles=handles, title=legend_title or None, loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=FONT_PT, title_fontsize=FONT_PT,
              frameon=False)
    ax.set_xlabel("distance from the initial state (steps)  →", fontsize=FONT_PT)
    ax.set_yticks([])
    ax.set_xticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=TITLE_PT, loc="left")
    fig.tight_layout()
    return fig, GraphDrawing(
        nodes=g.number_of_nodes(),
        edges=len(styles),
        colour_counts=dict(counts),
        highlighted=len(ringed),
        path_edges=len(path_edges),
    )


def ledger_status(state: State, exec_id: Value) -> str:
    """The ledger status of execution ``exec_id`` in a ``DurableToolExecution`` state."""
    ledger = state["ledger"]
    if not isinstance(ledger, FnValue):
        raise ValueError(f"ledger is not a function: {ledger!r}")
    record = ledger[exec_id]
    if not isinstance(record, FnValue):
        raise ValueError(f"ledger[{serialize(exec_id)}] is not a record: {record!r}")
    return str(record["status"])


# ----------------------------------------------------------------------------
# State-space size.


def state_space_chart(
    counts: Mapping[tuple[int, int], int],
    *,
    title: str | None = None,
) -> Figure:
    """Distinct states (log scale) against crashes, one line per number of calls.

    ``counts`` maps ``(calls, crashes)`` to TLC's number of distinct states;
    every point is labelled with its count.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for calls in sorted({c for c, _ in counts}):
        points = sorted((k, v) for (c, k), v in counts.items() if c == calls)
        xs = [k for k, _ in points]
        ys = [v for _, v in points]
        ax.plot(xs, ys, marker="o", label=f"{calls} call{'s' if calls > 1 else ''}")
        for x, y in points:
            ax.annotate(f"{y:,}", (x, y), textcoords="offset points", xytext=(6, -3),
                        fontsize=FONT_PT)
    ax.set_yscale("log")
    ax.set_xlabel("MaxCrashes", fontsize=FONT_PT)
    ax.set_ylabel("distinct states (TLC)", fontsize=FONT_PT)
    ax.set_xticks(sorted({k for _, k in counts}))
    ax.tick_params(labelsize=FONT_PT)
    ax.legend(frameon=False, fontsize=FONT_PT)
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=TITLE_PT, loc="left")
    fig.tight_layout()
    return fig
