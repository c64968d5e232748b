"""Load the state graph TLC writes with ``-dump dot,actionlabels FILE``.

TLC 2.15 writes one line per node and one line per edge::

    strict digraph DiskGraph {
    nodesep=0.35;
    subgraph cluster_graph {
    color="white";
    8866644865498082888 [label="/\\\\ x = 0\\n/\\\\ y = \\"a\\"",style = filled]
    8866644865498082888 -> -369681941832397260 [label="Step",color="black",fontcolor="black"];
    -369681941832397260 [label="/\\\\ x = 1\\n/\\\\ y = \\"a\\""];
    {rank = same; 8866644865498082888;}
    ...
    }
    }

* Node ids are TLC's signed 64-bit state fingerprints.
* Initial states, and only they, carry ``,style = filled``.
* The label is the state as TLC prints it, dot-escaped (``\\\\``, ``\\"``,
  ``\\n``); a one-variable spec prints ``x = 0`` without ``/\\``.
* There is one edge line per *generated* successor, so an edge can repeat
  (two parameter choices of one action reaching the same state) and an action
  that leaves the state unchanged is a self-loop (``a -> a``). TLC writes no
  edges for implicit stuttering. Edges are kept exactly as written.
* The ``{rank = same; ...}`` lines are not reliable BFS levels (the last level
  is missing) and are ignored.

This module only reads dumps: it must never run TLC, and never keep the file
text around (a dump of 10^5 states is ~100 MB); states are parsed through one
:class:`~toolledger.check.tlavalues.StateParser` so that shared values are shared
objects.
"""

from __future__ import annotations

import gc
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .tlavalues import StateParser, TLAParseError, Value, dot_unescape
from .tlc import TraceStep

__all__ = ["StateGraph", "StateGraphError", "load_dot"]

State = dict[str, Value]

_EDGE_RE = re.compile(r'(-?\d+) -> (-?\d+) \[label="((?:[^"\\]|\\.)*)"')
_LABEL_OPEN = ' [label="'
_END_INITIAL = '",style = filled]'
_END_PLAIN = '"]'


class StateGraphError(ValueError):
    """A dot file that is not a TLC ``-dump dot`` state graph."""


@dataclass
class StateGraph:
    """TLC's reachable state graph: states by fingerprint, labelled edges."""

    states: dict[int, State]
    edges: list[tuple[int, int, str]]
    initial: set[int]
    _succ: dict[int, list[tuple[int, str]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _pred: dict[int, list[tuple[int, str]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def _successor_index(self) -> dict[int, list[tuple[int, str]]]:
        if self._succ is None:
            succ: dict[int, list[tuple[int, str]]] = {}
            for src, dst, label in self.edges:
                succ.setdefault(src, []).append((dst, label))
            self._succ = succ
        return self._succ

    def successors(self, node: int) -> list[tuple[int, str]]:
        """``(successor, action)`` pairs of ``node``, as TLC wrote them (may repeat)."""
        return self._successor_index().get(node, [])

    def predecessors(self, node: int) -> list[tuple[int, str]]:
        """``(predecessor, action)`` pairs of ``node``."""
        if self._pred is None:
            pred: dict[int, list[tuple[int, str]]] = {}
            for src, dst, label in self.edges:
                pred.setdefault(dst, []).append((src, label))
            self._pred = pred
        return self._pred.get(node, [])

    def actions(self) -> set[str]:
        """All action labels on edges."""
        return {label for _, _, label in self.edges}

    def terminal(self) -> list[int]:
        """States with no outgoing edge (deadlocks, when deadlock checking is off)."""
        succ = self._successor_index()
        return [n for n in self.states if n not in succ]

    def find(self, predicate: Callable[[State], bool]) -> Iterator[int]:
        """Ids of the states for which ``predicate(state)`` is true."""
        return (n for n, s in self.states.items() if predicate(s))

    def shortest_path(self, target: int) -> list[tuple[int, str]]:
        """A shortest ``[(node, action), ...]`` from an initial state to ``target``.

        The first pair's action is ``"Init"``. Breadth-first from all initial
        states; ties are broken by edge order in the file, so the result is
        deterministic for a given dump. Raises ``KeyError`` if ``target`` is
        not a state of the graph and ``ValueError`` if no initial state reaches it.
        """
        if target not in self.states:
            raise KeyError(f"state {target} is not in the graph")
        succ = self._successor_index()
        parent: dict[int, tuple[int, str] | None] = {}
        queue: deque[int] = deque()
        for n in sorted(self.initial):
            parent[n] = None
            queue.append(n)
        while queue and target not in parent:
            node = queue.popleft()
            for nxt, label in succ.get(node, ()):
                if nxt not in parent:
                    parent[nxt] = (node, label)
                    queue.append(nxt)
        if target not in parent:
            raise ValueError(f"state {target} is not reachable from an initial state")
        path: list[tuple[int, str]] = []
        node = target
        while True:
            link = parent[node]
            if link is None:
                path.append((node, "Init"))
                break
            path.append((node, link[1]))
            node = link[0]
        path.reverse()
        return path

    def trace_to(self, target: int) -> list[TraceStep]:
        """:meth:`shortest_path` as :class:`~toolledger.check.tlc.TraceStep` values,
        ready for :func:`toolledger.check.counterexample.render_trace` (a minimal reproduction)."""
        return [
            TraceStep(index=i, action=action, state=self.states[node])
            for i, (node, action) in enumerate(self.shortest_path(target), 1)
        ]


def load_dot(path: Path | str) -> StateGraph:
    """Read a ``-dump dot,actionlabels`` file (``-dump dot`` works too: empty labels).

    Raises :class:`StateGraphError` naming the line number for anything that
    is neither a node, an edge, nor one of TLC's fixed framing lines.
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the loader allocates millions of acyclic objects; GC passes only cost time
    try:
        return _load_dot(path)
    finally:
        if gc_was_enabled:
            gc.enable()


def _load_dot(path: Path | str) -> StateGraph:
    parser = StateParser()
    parse_label = parser.parse_dot_label
    states: dict[int, State] = {}
    edges: list[tuple[int, int, str]] = []
    initial: set[int] = set()
    append_edge = edges.append
    edge_match = _EDGE_RE.match
    open_len = len(_LABEL_OPEN)
    labels: dict[str, str] = {}  # one shared str per action label
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, 1):
            c = line[:1]
            if c == "-" or "0" <= c <= "9":
                sp = line.find(" ")
                if line.startswith("->", sp + 1):
                    # 'SRC -> DST [label="ACTION",color=...];' -- by offsets (fast), else by regex
                    j = line.find(" ", sp + 4)
                    k = line.find('"', j + 9)
                    if line.startswith(_LABEL_OPEN, j) and "\\" not in line[j + 9 : k]:
                        src, dst, label = line[:sp], line[sp + 4 : j], line[j + 9 : k]
                    else:
                        m = edge_match(line)
                        if m is None:
                            raise StateGraphError(
                                f"{path}:{lineno}: malformed edge line: {line[:120]!r}"
                            )
                        src, dst, label = m.groups()
                    shared = labels.get(label)
                    if shared is None:
                        shared = labels[label] = dot_unescape(label)
                    append_edge((int(src), int(dst), shared))
                    continue
                if not line.startswith(_LABEL_OPEN, sp):
                    raise StateGraphError(f"{path}:{lineno}: malformed node line: {line[:120]!r}")
                body = line.rstrip("\n")
                if body.endswith(";"):  # plain nodes end in '"];', initial ones in 'filled]'
                    body = body[:-1]
                if body.endswith(_END_INITIAL):
                    text = body[sp + open_len : -len(_END_INITIAL)]
                    is_init = True
                elif body.endswith(_END_PLAIN):
                    text = body[sp + open_len : -len(_END_PLAIN)]
                    is_init = False
                else:
                    raise StateGraphError(
                        f"{path}:{lineno}: node line does not end in '\"]': {line[-120:]!r}"
                    )
                node = int(line[:sp])
                try:
                    states[node] = parse_label(text)
                except TLAParseError as e:
                    raise StateGraphError(f"{path}:{lineno}: state {node}: {e}") from None
                if is_init:
                    initial.add(node)
            elif (
                lineno == 1
                and not line.startswith("strict digraph")
                and not line.startswith("digraph")
            ):
                raise StateGraphError(f"{path}: not a TLC dot dump (first line {line[:80]!r})")
    return StateGraph(states=states, edges=edges, initial=initial)
