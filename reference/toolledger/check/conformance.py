"""Exhaustive conformance: the reference allows exactly the spec's steps.

TLC dumps the whole reachable state graph of a model (``-dump
dot,actionlabels``).  For every spec state the checker builds the reference
state (:func:`toolledger.check.mapping.from_spec`), checks that it maps back to
the same spec state, asks the reference for every enabled transition
(:func:`toolledger.check.system.successors`) and compares the set of
(action name, successor) pairs with the graph's edges out of that state, in
both directions: nothing missing, nothing extra.  The reference's initial
states must equal the spec's.  Within the model's bounds this covers every
interleaving of crashes, answers, time-outs and human decisions.

A mismatch is reported with the smallest reproduction: the shortest path
from an initial state to the state where the two disagree, the action, and
what the spec allows versus what the reference did.

The check can be spread over several processes (``workers``); each takes a
slice of the states.  It never modifies the graph or the model files.

``python -m toolledger.check.conformance --root R --module MCFoo --dot FILE`` is
the form ``toolledger check`` runs: a child process whose ``PYTHONPATH``
starts with ``R/reference``, so that the reference checked is the one of the
checkout whose spec and models TLC checked (not whichever checkout the
running ``toolledger`` command was installed from).  It prints one JSON
object, which names the package it checked (``package``).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._core import protocol as p
from .counterexample import render_trace
from .manifest import ModelEntry
from .mapping import SPEC_VARIABLES, SpecMapper, from_spec, spec_key, to_spec
from .memo import CoreMemo, core_memo
from .stategraph import StateGraph, load_dot
from .system import ModelConfig, SystemState, initial_states, successors
from .tlavalues import Value, pretty
from .tlc import Progress, TLCResult, TraceStep, run_tlc

__all__ = [
    "ConformanceReport",
    "Mismatch",
    "MismatchGroup",
    "check_graph",
    "main",
    "package_dir",
    "render_group",
    "render_mismatch",
    "run_conformance",
]

SuccessorFn = Callable[[ModelConfig, SystemState], list[tuple[p.Action, SystemState]]]
InitialFn = Callable[[ModelConfig], list[SystemState]]
Key = tuple[Value, ...]


@dataclass(frozen=True)
class Mismatch:
    """One disagreement between the spec's graph and the reference."""

    kind: str  # "missing" | "extra" | "roundtrip" | "initial" | "error"
    node: int | None  # the spec state where it happens (TLC fingerprint)
    action: str | None
    detail: str
    expected: dict[str, Value] | None = None  # the spec's successor / state
    got: dict[str, Value] | None = None  # the reference's


# The two directions of a drift, in the order they are reported: a step the
# spec allows and the reference refuses is the one a spec change usually makes
# (and the one that a long list of the other direction used to hide).
DIRECTIONS = {
    "missing": "the spec allows, the reference refuses",
    "extra": "the reference allows, the spec refuses",
}
_KIND_ORDER = ("missing", "extra", "initial", "roundtrip", "error")


@dataclass
class MismatchGroup:
    """Every mismatch of one kind on one action: how many, and the one at the
    state closest to an initial state (the smallest reproduction)."""

    kind: str
    action: str | None
    count: int
    first: Mismatch
    depth: int  # steps from an initial state to ``first.node``

    @property
    def title(self) -> str:
        what = DIRECTIONS.get(self.kind, self.first.detail)
        on = f" on {self.action}" if self.action else ""
        n = f"{self.count:,} mismatch" + ("" if self.count == 1 else "es")
        return f"{n}{on}: {what}"


@dataclass
class ConformanceReport:
    model: str
    states: int = 0
    edges: int = 0
    reference_edges: int = 0
    seconds: float = 0.0
    load_seconds: float = 0.0
    tlc: TLCResult | None = None
    mismatches: list[Mismatch] = field(default_factory=list)
    mismatch_count: int = 0
    graph: StateGraph | None = field(default=None, repr=False)
    # every mismatch, grouped by (kind, action): counted whatever the limit on
    # ``mismatches``; spec-allows-reference-refuses first (see DIRECTIONS)
    groups: list[MismatchGroup] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.mismatch_count == 0 and self.states > 0

    @property
    def ratio(self) -> float | None:
        """Conformance time (load + check) over TLC's own time on the model."""
        if self.tlc is None or not self.tlc.wall_seconds:
            return None
        return (self.seconds + self.load_seconds) / self.tlc.wall_seconds


# --------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------

# Set by check_graph before forking workers (copy-on-write shared).
_JOB: tuple[ModelConfig, StateGraph, dict[int, Key], SuccessorFn, int, bool, dict[int, int],
            bool, SpecMapper | None] | None = None

GroupKey = tuple[str, str | None]
Found = tuple[int, int, list[Mismatch], dict[GroupKey, MismatchGroup]]


def _check_nodes(nodes: Sequence[int]) -> Found:
    assert _JOB is not None
    if not _JOB[7]:  # memoise=False: every question asked afresh (a benchmark's baseline)
        return _check_with(None, nodes)
    gc_was_enabled = gc.isenabled()
    # The memos keep ~10^5 acyclic objects alive; the cyclic GC's passes over
    # them cost more than the check itself (measured on SameTurn: 1.5-2x).
    gc.disable()
    try:
        with core_memo() as memo:
            return _check_with(memo, nodes)
    finally:
        if gc_was_enabled:
            gc.enable()


def _check_with(memo: CoreMemo | None, nodes: Sequence[int]) -> Found:
    assert _JOB is not None
    cfg, graph, keys, succ_fn, limit, fail_fast, depth, _, shared_mapper = _JOB
    mismatches: list[Mismatch] = []
    groups: dict[GroupKey, MismatchGroup] = {}
    count = 0

    def found(m: Mismatch) -> None:
        nonlocal count
        count += 1
        if len(mismatches) < limit:
            mismatches.append(m)
        _group(groups, m, depth)
    ref_edges = 0
    index = graph._successor_index()
    # A reference state is named by the node its spec image is (or by that
    # image's key if the graph has no such state), so the two edge sets are
    # compared as small tuples, not as whole states.  With the memo, the
    # mapper keeps each part's image and hands out one object per value, the
    # graph's own (SpecMapper; the keys were made of them in check_graph),
    # so a key is looked up by the identities of its values.
    key_of: Callable[[SystemState], Key]
    back_of: Callable[[dict[str, Value]], SystemState]
    name_of: Callable[[Key], int | Key]
    if memo is None or shared_mapper is None:
        node_of: dict[Key, int] = {k: n for n, k in keys.items()}
        name_of = lambda k: node_of.get(k, k)  # noqa: E731
        key_of = lambda state: spec_key(to_spec(cfg, state))  # noqa: E731
        back_of = lambda spec_state: from_spec(cfg, spec_state)  # noqa: E731
    else:
        by_ids: dict[tuple[int, ...], int] = {tuple(map(id, k)): n for n, k in keys.items()}
        name_of = lambda k: by_ids.get(tuple(map(id, k)), k)  # noqa: E731
        key_of, back_of = shared_mapper.key, shared_mapper.from_spec
    own = {n: name_of(k) for n, k in keys.items()}  # a node's own name (itself)

    def state_of(name: int | Key) -> dict[str, Value]:
        if isinstance(name, int):
            return graph.states[name]
        return SpecMapper.state(name)

    for node in nodes:
        if fail_fast and count:
            break
        spec_state = graph.states[node]
        try:
            ref = back_of(spec_state)
            k = key_of(ref)
        except Exception as exc:  # a state the mapping cannot express
            found(Mismatch("roundtrip", node, None, f"mapping failed: {exc!r}"))
            continue
        back_id = name_of(k)
        if back_id != own[node]:
            found(Mismatch("roundtrip", node, None,
                           "the reference state does not map back to the spec state",
                           spec_state, state_of(back_id)))
            continue
        try:
            mine: set[tuple[str, int | Key]] = set()
            for action, nxt in succ_fn(cfg, ref):
                k = key_of(nxt)
                mine.add((str(action), name_of(k)))
        except Exception as exc:
            found(Mismatch("error", node, None, f"reference raised {exc!r}"))
            continue
        ref_edges += len(mine)
        theirs = {(label, own[dst]): dst for dst, label in index.get(node, [])}
        # sorted: which edge of a node is a group's first does not depend on set order
        for edge in sorted(mine - theirs.keys(), key=repr):
            found(Mismatch("extra", node, edge[0], "the reference allows a step the spec does not",
                           None, state_of(edge[1])))
        for edge in sorted(theirs.keys() - mine, key=repr):
            found(Mismatch("missing", node, edge[0],
                           "the spec allows a step the reference does not",
                           graph.states[theirs[edge]], None))
    return count, ref_edges, mismatches, groups


def _group(groups: dict[GroupKey, MismatchGroup], m: Mismatch, depth: dict[int, int],
           count: int = 1) -> None:
    """Count ``m`` in its group; keep the group's mismatch nearest an initial
    state (ties: the smaller TLC fingerprint), so that the one shown does not
    depend on how the states were split among workers."""
    d = depth.get(m.node, 0) if m.node is not None else 0
    key = (m.kind, m.action)
    g = groups.get(key)
    if g is None:
        groups[key] = MismatchGroup(m.kind, m.action, count, m, d)
        return
    g.count += count
    if (d, m.node or 0) < (g.depth, g.first.node or 0):
        g.first, g.depth = m, d


def _depths(graph: StateGraph) -> dict[int, int]:
    """Steps from the nearest initial state, for every reachable state (breadth first)."""
    succ = graph._successor_index()
    depth = dict.fromkeys(graph.initial, 0)
    frontier = sorted(graph.initial)
    while frontier:
        nxt = []
        for node in frontier:
            for dst, _ in succ.get(node, ()):
                if dst not in depth:
                    depth[dst] = depth[node] + 1
                    nxt.append(dst)
        frontier = nxt
    return depth


def _ordered(groups: dict[GroupKey, MismatchGroup]) -> list[MismatchGroup]:
    def rank(g: MismatchGroup) -> tuple[int, str]:
        kind = _KIND_ORDER.index(g.kind) if g.kind in _KIND_ORDER else len(_KIND_ORDER)
        return kind, g.action or ""
    return sorted(groups.values(), key=rank)


def check_graph(
    cfg: ModelConfig,
    graph: StateGraph,
    *,
    model: str = "",
    successors_fn: SuccessorFn = successors,
    initial_fn: InitialFn = initial_states,
    workers: int = 1,
    max_mismatches: int = 10,
    fail_fast: bool = False,
    memoise: bool = True,
) -> ConformanceReport:
    """Compare the reference with every state and edge of ``graph``.

    ``fail_fast`` stops each worker at its first mismatch (for tests that
    only need to know that a broken reference is caught).  ``memoise=False``
    asks the core and maps every state afresh, for every edge (the same
    verdict, slower: see :mod:`toolledger.check.memo`)."""
    global _JOB
    started = time.perf_counter()
    report = ConformanceReport(model=model, states=len(graph.states), edges=len(graph.edges))
    report.graph = graph
    mapper = None
    if memoise:  # adopted before forking: the workers share the graph's values
        mapper = SpecMapper(cfg)
        mapper.adopt(graph.states.values())
        keys = {n: mapper.canonical(spec_key(s)) for n, s in graph.states.items()}
    else:
        keys = {n: spec_key(s) for n, s in graph.states.items()}
    ref_init = {spec_key(to_spec(cfg, s)): to_spec(cfg, s) for s in initial_fn(cfg)}
    spec_init = {keys[n]: n for n in graph.initial}
    for k in ref_init.keys() - spec_init.keys():
        report.mismatches.append(
            Mismatch("initial", None, None, "an initial reference state the spec lacks",
                     None, ref_init[k])
        )
    for k in spec_init.keys() - ref_init.keys():
        report.mismatches.append(
            Mismatch("initial", spec_init[k], None,
                     "an initial spec state the reference lacks", graph.states[spec_init[k]])
        )
    report.mismatch_count = len(report.mismatches)
    groups: dict[GroupKey, MismatchGroup] = {}
    depth = _depths(graph)  # before forking, so workers share it (and the index it builds)
    for m in report.mismatches:
        _group(groups, m, depth)
    if fail_fast and report.mismatch_count:
        report.groups = _ordered(groups)
        report.seconds = time.perf_counter() - started
        return report
    nodes = sorted(graph.states)
    _JOB = (cfg, graph, keys, successors_fn, max_mismatches, fail_fast, depth, memoise, mapper)
    try:
        if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            chunks = [nodes[i::workers] for i in range(workers)]
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(workers) as pool:
                results = pool.map(_check_nodes, chunks)
        else:
            results = [_check_nodes(nodes)]
    finally:
        _JOB = None
    for count, ref_edges, found, found_groups in results:
        report.mismatch_count += count
        report.reference_edges += ref_edges
        report.mismatches.extend(found[: max(0, max_mismatches - len(report.mismatches))])
        for g in found_groups.values():
            _group(groups, g.first, depth, g.count)
    report.groups = _ordered(groups)
    report.seconds = time.perf_counter() - started
    return report


# --------------------------------------------------------------------------
# Running TLC and the check together
# --------------------------------------------------------------------------


def run_conformance(
    root: Path,
    entry: ModelEntry,
    *,
    workers: int | None = None,
    successors_fn: SuccessorFn = successors,
    initial_fn: InitialFn = initial_states,
    on_progress: Callable[[Progress], None] | None = None,
    dump_dir: Path | None = None,
    cache: Path | None = None,
) -> ConformanceReport:
    """Run TLC on ``entry`` with a state-graph dump, then check the reference.

    The report carries TLC's result, so the caller also sees whether the model
    itself passed and how long TLC took on it (the time ratio).  ``cache``:
    a graph dumped before from the same inputs is reused
    (:mod:`toolledger.check.tlccache`).
    """
    cfg = ModelConfig.from_mc_module(_module_path(root, entry.module))
    with tempfile.TemporaryDirectory(prefix="toolledger-conf-") as tmp:
        dot = (dump_dir or Path(tmp)) / f"{entry.name}.dot"
        tlc = run_tlc(
            entry.module,
            root / "model" / entry.cfg,
            search_dirs=[root / "spec", root / "model"],
            check_deadlock=entry.check_deadlock,
            workers=entry.workers,
            dump_dot=dot,
            on_progress=on_progress,
            cache=cache,
            expected_states=entry.distinct_states,
        )
        if not dot.exists():
            report = ConformanceReport(model=entry.name, tlc=tlc)
            report.mismatches.append(
                Mismatch("error", None, None, f"TLC wrote no state graph ({tlc.outcome.name}): "
                         f"{tlc.error_text or tlc.output[-400:]}")
            )
            report.mismatch_count = 1
            return report
        t0 = time.perf_counter()
        graph = load_dot(dot)
        load_seconds = time.perf_counter() - t0
    report = check_graph(
        cfg,
        graph,
        model=entry.name,
        successors_fn=successors_fn,
        initial_fn=initial_fn,
        workers=workers if workers is not None else min(2, os.cpu_count() or 1),
    )
    report.tlc = tlc
    report.load_seconds = load_seconds
    return report


def _module_path(root: Path, module: str) -> Path:
    for d in ("model", "spec"):
        path = root / d / f"{module}.tla"
        if path.exists():
            return path
    raise FileNotFoundError(f"no {module}.tla in {root / 'model'} or {root / 'spec'}")


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------


def _changed(before: dict[str, Value], after: dict[str, Value]) -> list[str]:
    return [
        f"    {v}' = {pretty(after[v], indent=6)}"
        for v in SPEC_VARIABLES
        if v in after and before.get(v) != after[v]
    ]


def render_mismatch(report: ConformanceReport, m: Mismatch) -> str:
    """The smallest reproduction of a mismatch, as text."""
    lines = [f"{m.kind}: {m.detail}"]
    graph = report.graph
    if graph is not None and m.node is not None:
        path = graph.shortest_path(m.node)
        lines.append("  path from an initial state:")
        if path:
            lines.append("    " + " -> ".join(["Init", *(label for _, label in path[1:])]))
        here = graph.states[m.node]
        if m.action is not None:
            lines.append(f"  then {m.action}:")
            other = m.expected if m.expected is not None else m.got
            if other is not None:
                who = "the spec allows" if m.kind == "missing" else "the reference did"
                lines.append(f"  {who} (changed variables):")
                lines.extend(_changed(here, other))
            if m.kind == "missing":
                lines.append("  the reference has no such step")
            elif m.kind == "extra":
                lines.append("  the spec has no such step")
    elif m.expected is not None or m.got is not None:
        state = m.expected if m.expected is not None else m.got
        assert state is not None
        lines.extend(f"    {v} = {pretty(state[v], indent=6)}" for v in SPEC_VARIABLES)
    if m.kind == "roundtrip" and m.expected is not None and m.got is not None:
        lines.append("  differs in:")
        lines.extend(_changed(m.expected, m.got))
    return "\n".join(lines)


def render_group(report: ConformanceReport, group: MismatchGroup) -> str:
    """A group of mismatches: its title (count, action, direction) and its
    first mismatch as a step table (:func:`render_trace`): the shortest path
    from an initial state, then the step on which the two disagree."""
    m = group.first
    graph = report.graph
    if graph is None or m.node is None or m.action is None:
        return f"{group.title}\n" + render_mismatch(report, m)
    steps = graph.trace_to(m.node)
    other = m.expected if m.kind == "missing" else m.got
    lines = [group.title + (f"; the first, after {len(steps) - 1} steps:" if steps else ":")]
    if other is not None:
        steps.append(TraceStep(index=len(steps) + 1, action=f"{m.action} (!)", state=other))
    lines.append(render_trace(steps))
    who = {"missing": "the spec takes step (!); the reference has no such step",
           "extra": "the reference takes step (!); the spec has no such step"}
    lines.append(who.get(m.kind, m.detail))
    return "\n".join(lines)


# --------------------------------------------------------------------------
# The child process of `toolledger check`
# --------------------------------------------------------------------------


def package_dir() -> Path:
    """The directory of the ``toolledger`` package this code was imported from."""
    return Path(__file__).resolve().parent.parent  # this module is toolledger/check/


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    """Check this package against a dumped state graph; print the report as JSON.

    Exit status 0 whenever the check ran (the JSON says whether it
    conforms); anything else is a failure to check, explained on stderr.
    """
    parser = argparse.ArgumentParser(
        prog="python -m toolledger.check.conformance",
        description="check this toolledger package against a TLC state graph (-dump dot)",
    )
    parser.add_argument("--root", type=Path, required=True, help="the checkout (spec/, model/)")
    parser.add_argument("--module", required=True, help="the model's MC module, e.g. MCTwoCalls")
    parser.add_argument("--dot", type=Path, required=True, help="TLC's state graph of the model")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--max-mismatches", type=int, default=10)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cfg = ModelConfig.from_mc_module(_module_path(args.root, args.module))
    graph = load_dot(args.dot)
    report = check_graph(cfg, graph, model=args.module, workers=max(1, args.workers),
                         max_mismatches=args.max_mismatches)
    json.dump(
        {
            "package": str(package_dir()),
            "states": report.states,
            "edges": report.edges,
            "reference_edges": report.reference_edges,
            "mismatch_count": report.mismatch_count,
            "reasons": [render_mismatch(report, m) for m in report.mismatches],
            "groups": [{"kind": g.kind, "action": g.action, "count": g.count,
                        "title": g.title, "text": render_group(report, g)}
                       for g in report.groups],
            "seconds": time.perf_counter() - started,
            # this process and its workers (forked, waited for by the pool)
            "cpu_seconds": _cpu_seconds(),
        },
        sys.stdout,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
