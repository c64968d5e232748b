"""Rewrite the benchmark figures in docs/benchmarks.md from ``benchmarks/results.json``.

(The figures lived in README.md once, hence the script's name; the README links
the page.)  Only the text between the ``<!-- bench:begin -->`` and
``<!-- bench:end -->`` lines of ``docs/benchmarks.md`` (or ``--readme FILE``)
is replaced; nothing else in the file is touched.  If
the markers are missing (or out of order, or repeated), the script says so
and exits with status 2 without writing anything.  ``--check`` writes
nothing and exits 1 if the block is not what the results file renders to.

``python benchmarks/render_readme.py [--results FILE] [--readme FILE] [--check]``
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"


def _md(head: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    align = ["---:" if i in right else "---" for i in range(len(head))]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _n(x: Any) -> str:
    return "-" if x is None else f"{x:,}"


def _yes(met: Any) -> str:
    return "-" if met is None else ("yes" if met else "**no**")


def render(doc: dict[str, Any]) -> str:
    """The benchmark block (without the markers) for a results document."""
    m = doc["machine"]
    b = doc["benchmarks"]
    code = doc.get("code") or {}
    start = code.get("at_start") or {}
    commit = f"`{start.get('commit', m['git_commit'])}`"
    if code.get("changed_during_run"):
        commit += " (the code changed during the run)"
    elif start.get("uncommitted"):
        commit += f" (with uncommitted changes in {', '.join(start['uncommitted'])})"
    out = [
        f"Produced by `make bench` (`python benchmarks/run_all.py`, "
        f"{doc['seconds']['total'] / 60:.0f} min) on {m['date'][:10]}, commit "
        f"{commit}: {m['nproc']} cores "
        f"({m['cpu']}), {m['memory']}, Python {m['python']}, {m['java']}, SQLite "
        f"{m['sqlite']}, scratch files on {m['scratch_fs']}.  The machine is shared: times are "
        "medians of repeated runs, and every ratio compares two things measured side by side "
        "in the same run.  All figures, per run, are in `benchmarks/results.json`; each comes "
        "from one script in `benchmarks/` that can be rerun alone "
        "(`python benchmarks/bench_sqlite.py`)."
        + "".join(f"  `{n}` was rerun alone since (`run_all.py --only {n}`, "
                  f"{r['seconds']:.0f} s) on {r['date'][:10]}, commit `{r['commit']}`"
                  + (f" (with uncommitted changes in {', '.join(r['uncommitted'])})"
                     if r.get("uncommitted") else "") + f", {r['cpu']}."
                  for n, r in (doc.get("reruns") or {}).items()),
        "",
        _md(("goal", "target", "measured", "met"),
            [(g["goal"], g["target"], g["measured"] or "-", _yes(g["met"]))
             for g in doc["goals"]]),
    ]
    models = b.get("models") or {}
    if "models" in models:
        out += ["", "**Model checking** (`bench_models.py`; one TLC worker per model, wall time "
                "includes the JVM's start):", ""]
        out.append(_md(
            ("model", "CI", "expected", "distinct states", "wall s", "states/s"),
            [(x["name"], "yes" if x["ci"] else "no", x["expect"], _n(x["distinct_states"]),
              f"{x['seconds']:.1f}", _n(x["states_per_second"])) for x in models["models"]],
            right=(3, 4, 5)))
        ci = models["ci_set"]
        check = ci.get("toolledger_check_seconds")
        out += ["", f"CI set ({ci['models']} models): {ci['sequential_sum_seconds']:.1f} s "
                f"one after the other, {ci['parallel_seconds']:.1f} s {ci['parallel_jobs']} at "
                "a time" + (f"; a complete `toolledger check` (TLC with state-graph dumps, "
                            f"then the conformance checks) took {check:.0f} s"
                            if check is not None else "") + "."]
        grid: dict[tuple[int, int], str] = {}
        for g in models["growth"]:
            grid[(g["calls"], g["crashes"])] = (
                f"{_n(g['distinct_states'])} ({g['seconds']:.0f} s)" if g["complete"]
                else f"> {_n(g['distinct_states_seen'])} (stopped at {g['time_limit']:.0f} s)")
        calls = sorted({c for c, _ in grid})
        crashes = sorted({k for _, k in grid})
        out += ["", "Growth of the state space (distinct states, wall time), generated models: "
                "manual and idempotent calls in turn 1, a reconcile call reusing `call_0` in "
                "turn 2, all approved, `MaxAttempts` 2:", ""]
        out.append(_md(("calls", *(f"{k} crash{'es' if k != 1 else ''}" for k in crashes)),
                       [(c, *(grid.get((c, k), "-") for k in crashes)) for c in calls],
                       right=tuple(range(1, len(crashes) + 1))))
    c = b.get("conformance") or {}
    if "ratio_vs_tlc" in c:
        out += ["", f"**Conformance** (`bench_conformance.py`, {c['model']}, {_n(c['states'])} "
                f"states, {_n(c['edges'])} edges, {c['mismatches']} mismatches): TLC "
                f"{c['tlc_seconds']:.1f} s without dump, {c['tlc_with_dump_seconds']:.1f} s with "
                f"the {c['dump_megabytes']:.0f} MB dump; loading it {c['load_seconds']:.1f} s, "
                f"checking every state and edge {c['check_seconds']:.1f} s "
                f"({c['conformance_workers']} processes): {c['ratio_vs_tlc']:.2f}x TLC's time "
                f"({c['ratio_vs_tlc_with_dump']:.2f}x TLC-with-dump's)."]
    out += _check(b.get("check") or {})
    s = b.get("sqlite") or {}
    if "commits" in s:
        out += ["", f"**SQLite durability** (`bench_sqlite.py`, WAL + `synchronous=FULL`, "
                f"{s['filesystem']}): commits per call, counted by the store, by SQLite's "
                "statement trace and by `strace` (sync system calls):", ""]
        rows = []
        for kind, x in s["commits"].items():
            st = x.get("strace_syncs") or {}
            syncs = st.get("total_per_call")
            rows.append((kind, f"{x['ledger_commits_per_call']:g}", f"{x['commits_per_call']:g}",
                         f"{x['traced_commit_statements_per_call']:g}",
                         "-" if syncs is None else f"{syncs:g}"))
        out.append(_md(("call", "ledger commits", "all commits", "COMMITs traced",
                        "syncs (strace)"), rows, right=(1, 2, 3, 4)))
        r = s["rates_per_second"]
        q = s["ratios"]
        fr = s["ratios_fresh_store"]
        out += ["", f"Throughput, same directory, {s['rounds']} interleaved rounds (medians): "
                f"{r['ledger_calls_in_service']:.0f} protected calls/s on the ledger path (2 "
                f"commits each, sessions of 5 calls) on a store in service (its WAL has wrapped "
                f"once), {r['ledger_calls']:.0f}/s on a fresh store (WAL still growing), "
                f"{r['full_calls']:.0f}/s with the call's own persist commit in one growing "
                f"session (3 each); raw `write`+`fsync` {r['fsync']:.0f}/s, "
                f"`write`+`fdatasync` {r['fdatasync']:.0f}/s, in-place `fdatasync` "
                f"{r['fdatasync_in_place']:.0f}/s, raw one-row SQLite commits "
                f"{r['sqlite_in_service']:.0f}/s in service ({r['sqlite']:.0f}/s fresh).  "
                f"Ratio calls/s x 2 / syncs/s in service: {q['vs_fsync']:.2f} vs fsync, "
                f"{q['vs_fdatasync']:.2f} vs fdatasync, {q['vs_fdatasync_in_place']:.2f} vs "
                f"in-place fdatasync, {q['vs_sqlite_commit_in_service']:.2f} vs raw SQLite "
                f"commits (fresh store: {fr['vs_fsync']:.2f} / {fr['vs_fdatasync']:.2f} / "
                f"{fr['vs_fdatasync_in_place']:.2f}); the goal is judged in service against "
                f"the fastest ({s['goal_ratio_against']}).  The same calls with "
                f"`synchronous=OFF` run at {r['ledger_calls_no_sync']:.0f}/s: a call takes "
                f"{s['call_ms_in_service']:.2f} ms, {s['call_cost_without_syncs_ms']:.2f} ms of "
                f"it work besides the syncs and {s['commit_sync_ms']:.2f} ms per commit of "
                f"sync, where a raw sync here takes {s['raw_sync_ms']:.2f} ms.  With zero work "
                f"the ratio would be {s['ceiling_ratio_zero_work']:.2f} "
                f"({s['ceiling_ratio_one_row_commits']:.2f} for one-row commits); it reaches "
                f"0.8 on a disk whose sync takes >= {s['sync_ms_needed_for_goal']:.2f} ms."]
    pe = b.get("peers") or {}
    if "systems" in pe:
        out += _peers(pe)
    by = b.get("bytes") or {}
    if "measured" in by:
        out += _bytes(by)
    gr = b.get("group") or {}
    if "rows" in gr:
        out += _group(gr)
    r2 = b.get("recovery") or {}
    if "by_history" in r2:
        out += ["", "**Recovery vs history** (`bench_recovery.py`): one call pending after "
                "`dispatched`, H completed calls before it; open the store, load the session, "
                "`Recover` the call (medians of interleaved rounds, one pending call each, "
                "warm cache):", ""]
        out.append(_md(
            ("past calls", "file MB", "open ms", "load ms", "Recover ms", "total ms"),
            [(_n(int(h)), x["file_megabytes"], f"{x['open_seconds'] * 1000:.2f}",
              f"{x['load_seconds'] * 1000:.2f}", f"{x['recover_seconds'] * 1000:.2f}",
              f"{x['total_seconds'] * 1000:.2f}") for h, x in r2["by_history"].items()],
            right=(0, 1, 2, 3, 4, 5)))
        parts = r2["ratio_parts"]
        out += ["", f"t(largest) / t(smallest) = {r2['ratio_largest_to_smallest']:.1f} (open "
                f"{parts['open']:.1f}, load {parts['load']:.1f}, Recover {parts['recover']:.1f})"
                + ("; opening checks the header and schema only, loading reads the open calls "
                   "and the last turn by index, so recovery does not read the history."
                   if r2["goal_met"] else
                   ": NOT within the goal; the parts say which step grows with the history.")]
    h = b.get("bugfinding") or {}
    if "hypothesis" in h:
        hy, tl, ctl = h["hypothesis"], h["tlc"], h["control_ledger_engine"]
        out += ["", f"**Bug finding** (`bench_bugfinding.py`): Hypothesis finds the legacy "
                f"engine's duplicate delivery with {hy['found_with_seeds']}/{hy['seeds']} seeds, "
                f"median {hy['median_seconds']:.3f} s and {hy['median_examples']:g} examples "
                f"(max {hy['max_seconds']:.3f} s); against the ledger engine the same property "
                f"finds nothing in the {ctl['examples']} examples it generates.  TLC reports "
                f"`{tl['violated']}` on `{tl['model']}` in {tl['median_seconds']:.1f} s "
                f"({tl['counterexample_states']}-state counterexample)."]
    k = b.get("crash_campaign") or {}
    if "totals" in k:
        t = k["totals"]
        by = k["kills_by_kind"]
        lc = k["legacy_control"]
        cr = k["corruption"]
        fz = k.get("fuzz") or {}
        out += ["", f"**Crash campaign** (`crash_campaign.py`): {k['runs']} runs of a two-turn "
                f"session in real processes on SqliteStore, policies "
                f"{', '.join(k.get('policies') or [])}, {k['kills']} "
                f"SIGKILLs ({by['point']} at the enumerated crash points, {by['io']} at I/O "
                f"boundaries, {by['timer']} by timer, {by['multi']} in runs killed 2-3 times, "
                "recovery included"
                + (f"; {by['fused']} at every I/O boundary of the fused path "
                   "(`TurnEngine(fused=True)`: n + 1 commits per message)"
                   if by.get("fused") else "")
                + (f"; {by['together']} at every I/O boundary of the together path "
                   "(`TurnEngine(together=True)`, two calls per message: [record + both "
                   "`dispatched`], [both outcomes + results])" if by.get("together") else "")
                + "), checked against the external system's own log:", ""]
        out.append(_md(("duplicate effects", "results lost", "results fabricated",
                        "contradicted", "unsettled calls", "store unusable", "child errors"),
                       [(t["duplicates"], t["lost"], t["fabricated"], t["contradicted"],
                         t["unsettled"], t["store_unusable"], t["child_errors"])]))
        for counter, f in (k.get("findings") or {}).items():
            for cause, n in f["causes"].items():
                out += ["", f"Found, `{counter}` in {n} of {k['runs']} runs: {cause}."]
        out += ["", f"Control: the legacy engine through the same harness: {lc['duplicates_found']}"
                f" duplicate effects, at {', '.join(lc['points_with_duplicates'])}.  Store "
                f"damaged at a random byte ({cr['trials']} trials, truncated or changed): "
                f"{cr['detected']} failed closed (`StoreCorrupt` naming the file, exit 3, store "
                f"and external log byte for byte unchanged), {cr['harmless']} hit "
                f"unused bytes (same data read back), {cr.get('detected_on_read', 0)} hit rows the "
                f"resume does not read (it completed, no effect twice, and every read of those "
                f"rows is refused with `StoreCorrupt`), {cr['silent']} silent.  Fuzz of the public "
                f"API: {_n(fz.get('examples'))} calls, {_n(fz.get('unhandled'))} exceptions "
                "other than the documented typed errors"
                + (": " + "; ".join(f"{n} x {kind}" for kind, n in
                                    (fz.get("unhandled_kinds") or {}).items())
                   if fz.get("unhandled") else "") + "."]
    out += _power_loss(b.get("power_loss") or {})
    ra = b.get("races") or {}
    if "stores" in ra:
        out += ["", f"**Races** (`bench_races.py`): {ra['workers']} worker processes load the "
                "same session, wait for each other, then all resume it at once; "
                f"{ra['races_per_store']} races per store, the policies in turn; every loser's "
                "INSERT/UPDATE/DELETE counted by its store's statement trace:", ""]
        out.append(_md(
            ("store", "policy", "races", "losers refused", "losers that wrote",
             "duplicate effects", "max dispatches per attempt"),
            [(store, pol, x["races"], x.get("refused", 0), x.get("losers_that_wrote", 0),
              x.get("duplicate_effects", "-"),
              x.get("max_dispatches_per_attempt", 0))
             for store, r in ra["stores"].items() for pol, x in r["by_policy"].items()],
            right=(2, 3, 4, 5, 6)))
        out += ["", "In all: " + "; ".join(
            f"{store}: {r['refused_losers']} losers refused, {r['losers_that_wrote']} wrote, "
            f"{r['duplicate_effects']} duplicate effects, audit rows the winner's: "
            f"{'yes' if r['ok'] else '**no**'}"
            + ("" if r.get("server_rows_written") is None else
               f" (rows written as the server counts them: {r['server_rows_written']:,}, "
               f"the winners' write statements: {r['winners_write_statements']:,})")
            for store, r in ra["stores"].items()) + "."]
    f = b.get("pg_faults") or {}
    if "rows" in f:
        names = {"sigkill": "SIGKILL at crash points", "stop_fast": "stop -m fast",
                 "kill_postmaster": "kill -9 postmaster",
                 "terminate_backend": "pg_terminate_backend"}
        out += ["", "**Faults on PostgreSQL** (`bench_pg_faults.py`): the crash campaign's "
                "two-turn runs on a PostgresStore (throwaway cluster, `fsync` on), effects "
                "counted by the external system's own log; the server faults hit at the k-th "
                "SQL statement of a run (a `COMMIT` included), then the server is started "
                "again and a new process resumes:", ""]
        out.append(_md(
            ("fault", "policy", "runs", "fail-closed errors", "duplicates", "lost",
             "unsettled", "other counts"),
            [(names.get(r["fault"], r["fault"]), r["policy"], r["runs"], r["fail_closed"],
              r["duplicates"], r["lost"], r["unsettled"],
              sum(r[k] for k in ("fabricated", "contradicted", "store_unusable",
                                 "child_errors"))) for r in f["rows"]],
            right=(2, 3, 4, 5, 6, 7)))
        u = f["unreachable"]
        out += ["", f"{f['sigkills']} SIGKILLs; {f['server_fault_runs_failed_closed']} of "
                f"{f['server_fault_runs']} workers hit by a server fault stopped with a "
                "`StoreError` naming the server; after recovery every call settled.  An "
                f"unreachable server: a refused port fails in {u['refused']['seconds']:.2f} s, "
                f"a host that never answers in {u['never_answers']['seconds']:.2f} s "
                f"(`connect_timeout={u['never_answers']['connect_timeout']:g}`), both "
                f"`{u['never_answers']['error']}` naming host, port and database."]
    sc = b.get("scale") or {}
    if "cells" in sc:
        out += _scale(sc)
    return "\n".join(out)


def _power_loss(pl: dict[str, Any]) -> list[str]:
    """The power-loss harness: crash states explored and each outcome counted, per
    workload, for the real store and each planted bug (benchmarks/power_loss.py)."""
    rows = pl.get("rows") or []
    if not rows:
        return []
    kinds = ("no_store", "recovered", "failed_closed", "lost", "wrong", "unbacked",
             "duplicate", "error")
    found = pl.get("planted_found") or {}
    benign = pl.get("benign") or {}
    out = ["", f"**Power loss** (`power_loss.py`): the SQLite store's workloads under `strace`, "
           f"then every crash state a power cut may leave (any unsynced suffix lost, a write "
           f"torn at sector boundaries, unsynced directory entries missing), each opened and "
           f"judged: {pl['states_explored']:,} states explored, {pl['real_incorrect']} incorrect "
           f"recoveries on the real store ({pl['real_failed_closed']} failed closed); planted "
           f"bugs found: {', '.join(v for v, f in found.items() if f) or 'none'}"
           + "".join(f"; `{v}` not found, benign by design: {why}" for v, why in benign.items())
           + ".", ""]
    out.append(_md(("variant", "workload", "operations", "syncs", "crash states",
                    *kinds, "incorrect"),
                   [(r["variant"], r["workload"], r["operations"], r["syncs"], r["states"],
                     *(r["outcomes"].get(k, 0) for k in kinds), r["incorrect"])
                    for r in rows], right=tuple(range(2, 6 + len(kinds)))))
    return out


def _check(ck: dict[str, Any]) -> list[str]:
    """Where the time of `make check` goes (bench_check.py)."""
    c = ck.get("check")
    if not c or c.get("args"):
        return []
    f, f0, m = ck["fixed_cost"], ck.get("fixed_cost_without_cds"), ck.get("conformance_memo")
    text = (f"**`make check`** (`bench_check.py`): {c['row_count']} rows in {c['tlc_runs']} "
            f"TLC runs, {c['wall_seconds']:.0f} s wall and {c['cpu_seconds']:.0f} s CPU "
            f"(load average {ck['load_average']} at the end: the floor on 2 quiet cores is "
            f"CPU / 2 = {c['cpu_seconds'] / 2:.0f} s"
            + (f", and the longest job, {c['longest_job']}, took {c['longest_job_seconds']:.0f} s"
               if "longest_job" in c else "")
            + "). One JVM start (a 3-state model) costs "
            f"{f['cpu_seconds']:.2f} s CPU with class-data sharing")
    if f0:
        text += f", {f0['cpu_seconds']:.2f} s without"
    if m:
        text += (f"; the conformance check of {m['model']} ({_n(m['states'])} states) "
                 f"{m['memo']['cpu_seconds']:.1f} s CPU with the memo of the core's answers, "
                 f"{m['no_memo']['cpu_seconds']:.1f} s without ({m['speedup']:.1f}x, "
                 f"{m['memo']['mismatches']} and {m['no_memo']['mismatches']} mismatches)")
    text += (f". Summed wall time of the overlapping parts: TLC {c['tlc_seconds']:.0f} s "
             f"(JVM start and parse {c['jvm_start_and_parse_seconds']:.0f} s, search "
             f"{c['search_seconds']:.0f} s), conformance {c['conformance_seconds']:.0f} s "
             f"({c.get('conformance_cpu_seconds', 0):.0f} s CPU).")
    return ["", text]


def _scale(sc: dict[str, Any]) -> list[str]:
    """The scale table: one row per (processes, sessions), the stores side by side."""
    out = ["", f"**Scale** (`bench_scale.py`): protected calls/s with "
           f"{', '.join(map(str, sc['sessions']))} concurrent sessions spread evenly over "
           f"{', '.join(map(str, sc['processes']))} worker processes on {sc['cpus']} cores, "
           "every session a real `Session` in its own thread with its own store connection, "
           f"{sc['calls_per_turn']}-call turns of an `idempotent` tool with a trivial effect "
           f"for {sc['window_seconds']:g} s per cell; SQLite (one file shared by the "
           f"processes, on {sc['scratch_fs']}) and PostgreSQL (throwaway server on loopback, "
           "`fsync` on) side by side, cells interleaved.  Commits counted by the stores; "
           "PostgreSQL's WAL flushes by the server (`pg_stat_wal`); SQLite's sync system calls "
           f"by `{sc.get('sqlite_syncs_counted_by') or 'nothing (no strace)'}` during the "
           "sessions' windows.  One session cannot be spread over several processes (n/a).",
           ""]
    cells = {(c["store"], c["processes"], c["sessions"]): c for c in sc["cells"]}

    def f(store: str, procs: int, sessions: int, key: str) -> str:
        c = cells.get((store, procs, sessions))
        if c is None or not c.get("applicable"):
            return "n/a"
        return "-" if c.get(key) is None else f"{c[key]:g}"

    out.append(_md(
        ("processes", "sessions", "SQLite calls/s", "PostgreSQL calls/s",
         "SQLite commits / call", "PostgreSQL commits / call", "SQLite syncs / call",
         "PostgreSQL WAL flushes / call"),
        [(procs, sessions, f("sqlite", procs, sessions, "calls_per_second"),
          f("postgres", procs, sessions, "calls_per_second"),
          f("sqlite", procs, sessions, "commits_per_call"),
          f("postgres", procs, sessions, "commits_per_call"),
          f("sqlite", procs, sessions, "syncs_per_call"),
          f("postgres", procs, sessions, "syncs_per_call"))
         for procs in sc["processes"] for sessions in sc["sessions"]],
        right=(0, 1, 2, 3, 4, 5, 6, 7)))  # fmt: skip
    done = [c for c in sc["cells"] if c.get("applicable")]
    out += ["", f"Afterwards, in all {len(done)} cells ({sum(c['calls'] for c in done):,} "
            "calls): every session's calls durable with their result, one `dispatch` audit "
            "row per call, and every effect applied exactly once at the external system: "
            f"{'yes' if sc['ok'] else '**no**'}."]
    return out


def _peer_ref(pe: dict[str, Any]) -> str:
    """The toolledger row the peers' ratios are computed from."""
    for gl in (pe.get("goals") or {}).values():
        if isinstance(gl, dict) and "row" in gl:
            return str(gl["row"])
    return "toolledger-batched"


def _peers(pe: dict[str, Any]) -> list[str]:
    """The peers' block: calls/s side by side, syncs, bytes, CPU, the crash table."""
    sd = pe.get("slow_disk") or {}
    ms = sd.get("model_sync_ms") or {}

    def g(r: dict[str, Any], k: str, fmt: str) -> str:
        return "-" if r.get(k) is None else format(r[k], fmt)

    out = ["", f"**Peers** (`bench_peers.py`): a durably recorded call with a trivial effect, "
           f"{pe['calls_per_turn']}-call turns, every system on SQLite in the same directory "
           f"({pe['scratch_fs']}), {pe['rounds']} interleaved rounds of {pe['timed_turns']} timed "
           f"turns in fresh processes (medians).  Syncs counted by {pe['syncs_counted_by']}; "
           f"bytes by {pe['bytes_counted_by']}.  The slow disk is this disk with every "
           f"`fsync`/`fdatasync` delayed by `{sd.get('how', '-')}` (a raw sync took "
           f"{g(sd, 'fast_sync_ms', '.2f')} ms, {g(sd, 'slow_sync_ms', '.2f')} ms delayed).  "
           f"The model rows take each system's measured time per call with every sync skipped "
           f"(`{sd.get('no_sync', '-')}`) plus its measured syncs per call times a sync latency "
           f"of {ms.get('fast', '-')} ms (a fast disk) or {ms.get('slow', '-')} ms (a slow "
           "cloud volume); the model's error against the two measured disks is shown.  "
           + ("" if not pe.get("load_average_1min") else
              f"The 1-minute load average was {min(pe['load_average_1min']):.2f} to "
              f"{max(pe['load_average_1min']):.2f} during the run (2 cores).  ")
           +
           "`toolledger / it` is the reference row's rate over the row's (reference: "
           f"`{_peer_ref(pe)}`); `-parallel` rows are the peers' own concurrent forms "
           "of the same message.", ""]
    rows = []
    for name, r in pe["systems"].items():
        rows.append((name, g(r, "calls_per_second", ".0f"), g(r, "ratio_measured_fast", ".2f"),
                     g(r, "slow_calls_per_second", ".0f"), g(r, "ratio_measured_slow", ".2f"),
                     g(r, "model_fast_disk_calls_per_second", ".0f"),
                     g(r, "ratio_model_fast_disk", ".2f"),
                     g(r, "model_slow_disk_calls_per_second", ".0f"),
                     g(r, "ratio_model_slow_disk", ".2f"),
                     g(r, "model_error_fast", "+.0%") + " / " + g(r, "model_error_slow", "+.0%"),
                     g(r, "syncs_per_call", ".2f"), g(r, "commits_per_message", ".1f"),
                     f"{r['write_bytes_per_call'] / 1024:.1f}", f"{r['cpu_ms_per_call']:.2f}"))
    out.append(_md(("system", "calls/s", "toolledger / it", "slow disk calls/s",
                    "toolledger / it", f"model @{ms.get('fast', '-')} ms", "toolledger / it",
                    f"model @{ms.get('slow', '-')} ms", "toolledger / it", "model error",
                    "syncs / call", "commits / message", "KB written / call", "CPU ms / call"),
                   rows, right=tuple(range(1, 14))))
    goals = pe.get("goals") or {}
    judged = [(peer, gl) for peer, gl in goals.items()
              if isinstance(gl, dict) and "forms" in gl]
    if judged:
        def rs(gl: dict[str, Any], prefix: str) -> str:
            return " / ".join(g(gl, prefix + k, ".2f") for k in (
                "ratio_measured_fast", "ratio_measured_slow", "ratio_model_fast_disk",
                "ratio_model_slow_disk"))

        out += ["", "Goals against each peer's best form (the higher calls/s of its sequential "
                "and parallel rows, rate by rate; ratios measured fast / slowed, model fast / "
                "slow): " + "; ".join(
                    f"{peer} >= {gl['target']:g}x: `{gl['row']}` {rs(gl, '')}, "
                    f"`{gl['sequential_row']}` {rs(gl, 'sequential_')}, met by "
                    + (", ".join(f"`{x}`" for x in gl["met_by"]) or "neither")
                    for peer, gl in judged) + "."]
    bounds = [(peer, gl) for peer, gl in goals.items()
              if isinstance(gl, dict) and "ratio_sync_bound" in gl]
    if bounds:
        out += ["", "Where syncs bound the work (a slow enough disk), toolledger / it tends to "
                "the peer's syncs per call (its form with the fewest) over toolledger's: "
                + ", ".join(
                    f"{peer} {gl['ratio_sync_bound']:.2f}"
                    + (f" (`{gl['sequential_row']}`: {gl['sequential_ratio_sync_bound']:.2f})"
                       if "sequential_ratio_sync_bound" in gl else "") for peer, gl in bounds)
                + "; one sync per protected call, the floor of sequential calls (`dispatched` "
                "is durable before the tool runs), would give " + ", ".join(
                    f"{peer} {gl['ratio_sync_bound_at_one_sync_per_call']:.2f}"
                    for peer, gl in bounds) + "; a message's calls dispatched together share "
                "their syncs (2 commits per message)."]
    out += ["", "A SIGKILL between the effect and the system's checkpoint, then the "
            "documented resume; effects the external system applied:", ""]
    out.append(_md(("system", "policy", "effects", "duplicates"),
                   [(c["system"], c["policy"], c["effects"], c["duplicates"])
                    for c in pe["crash"]], right=(2, 3)))
    pq = pe.get("postgres") or {}
    if "systems" in pq:
        out += _peers_pg(pq)
    return out


def _peers_pg(pq: dict[str, Any]) -> list[str]:
    """The peers' PostgreSQL block: the same workload on one throwaway server."""
    gl = pq["goals"]
    peers = list(gl["best_form"])
    load = pq.get("load_average_1min") or []
    out = ["", f"On PostgreSQL (`bench_peers.py`, one throwaway server on loopback, `fsync` "
           f"on, a fresh database per child): toolledger's `PostgresStore` on each path, "
           f"DBOS with its system database there, LangGraph's `PostgresSaver` "
           f"(`durability=\"sync\"`); {pq['rounds']} interleaved rounds of "
           f"{pq['timed_turns']} timed turns (medians); WAL flushes (`pg_stat_wal.wal_sync`) "
           f"and WAL bytes (the insert position) counted by the server over the timed turns"
           + ("" if pq.get("wal_counts_timed_turns_only") else " and the untimed ones")
           + "; CPU is the client process's."
           + ("" if not load else f"  Load average {min(load):.2f} to {max(load):.2f}.")
           + f"  `/ peer`: the row's calls/s over the peer's best form's "
           f"({', '.join(f'`{v}`' for v in gl['best_form'].values())}).", ""]
    rows = []
    for name, r in pq["systems"].items():
        rs = gl["ratios"].get(name, {})
        rows.append((name, f"{r['calls_per_second']:.0f}",
                     *(f"{rs[p]:.2f}" if p in rs else "-" for p in peers),
                     f"{r['wal_flushes_per_call']:.2f}", f"{r['wal_bytes_per_call'] / 1024:.1f}",
                     f"{r['commits_per_message']:.1f}" if "commits_per_message" in r else "-",
                     f"{r['cpu_ms_per_call']:.2f}"))
    out.append(_md(("system", "calls/s", *(f"/ {p}" for p in peers), "WAL flushes / call",
                    "WAL KB / call", "commits / message", "client CPU ms / call"),
                   rows, right=tuple(range(1, 6 + len(peers)))))
    out += ["", f"Goal: every toolledger path >= {gl['target']:g}x each peer's best form: "
            + {True: "met", False: "not met", None: "not judged"}[gl["met"]] + "."]
    return out


def _bytes(by: dict[str, Any]) -> list[str]:
    """Where a protected call's bytes go (bench_bytes), and the top of its CPU profile."""
    m = by["measured"]
    out = ["", f"**Bytes per protected call** (`bench_bytes.py`): 5-call turns, each a new "
           "session run with `lazy_create` + `execute_message` (n + 1 commits for n calls, "
           f"the session's creation included) on a SqliteStore (page size {m['page_size']}), "
           "the `-wal` parsed frame by frame and each page attributed by `dbstat`: "
           f"{m['commits_per_call']:.2f} commits, {m['wal_frames_per_call']:.2f} WAL frames "
           f"({m['wal_frames_per_commit']:.2f} per commit), "
           f"{m['wal_bytes_per_call'] / 1024:.1f} KB of WAL, "
           f"{m['checkpoint_bytes_per_call'] / 1024:.1f} KB checkpointed; the floor of this "
           f"table layout (one page per table or index a commit touches) is "
           f"{m['floor_frames_per_call']:.2f} frames, {m['floor_wal_bytes_per_call'] / 1024:.1f} "
           "KB of WAL; the kernel counted "
           f"{m['write_bytes_per_call'] / 1024:.1f} KB `write_bytes` "
           f"({m['wchar_per_call'] / 1024:.1f} KB `wchar`) per call.", ""]
    out.append(_md(("table / index", "WAL frames / call"),
                   [(k, f"{v:.2f}") for k, v in m["wal_frames_per_call_by_object"].items()],
                   right=(1,)))
    out += [""]
    out.append(_md(("table", "rows / call", "payload bytes / call"),
                   [(t, f"{m['rows_per_call'][t]:.2f}", f"{m['payload_bytes_per_call'][t]:.0f}")
                    for t in m["rows_per_call"]], right=(1, 2)))
    p = by.get("profile")
    if p:
        plain = by.get("profile_plain")
        also = ("" if not plain else f" (the plain path, `record` then `execute` per call: "
                f"{plain['cpu_ms_per_call_nosync']:.3f} ms)")
        out += ["", f"CPU per call with syncs off: {p['cpu_ms_per_call_nosync']:.3f} ms "
                f"(`getrusage`){also}; the top of `cProfile` by own time:", ""]
        out.append(_md(("function", "calls / call", "own us / call"),
                       [(f"`{r['function']}`", f"{r['calls_per_call']:.1f}",
                         f"{r['own_us_per_call']:.1f}") for r in p["top"][:8]], right=(1, 2)))
    return out


def _group(gr: dict[str, Any]) -> list[str]:
    """Group commit: 1, 4, 16 sessions in one process (bench_group)."""
    out = ["", "**Group commit** (`bench_group.py`): N threads of one process, a session each "
           "per 5-call turn, on one `SqliteStore(path, group_commit=True)` "
           f"({gr['filesystem']}); the slow disk as in the peers' runs; `commits` is counted per "
           "session (as without grouping), `syncs` by strace and by the store:", ""]
    out.append(_md(("disk", "sessions", "group commit", "calls/s", "syncs / call",
                    "commits per sync", "CPU ms / call"),
                   [(r["disk"], r["sessions"], "yes" if r["group_commit"] else "no",
                     f"{r['calls_per_second']:.0f}",
                     "-" if r["syncs_per_call"] is None else f"{r['syncs_per_call']:.2f}",
                     f"{r['commits_per_sync']:.1f}", f"{r['cpu_ms_per_call']:.2f}")
                    for r in gr["rows"]], right=(1, 3, 4, 5, 6)))
    speed = ", ".join(f"{d}: {x:.2f}x" for d, x in gr["speedup"].items())
    bound = gr.get("cpu_ceiling_over_one_session_this_disk")
    out += ["", f"16 sessions / 1 session: {speed} (goal >= {gr['goal']:g}x on the "
            f"{gr['goal_disk']})" + ("" if bound is None else
                                     f"; the CPU ceiling (one session, every sync skipped) is "
                                     f"{bound:.2f}x one session on this disk: threads of one "
                                     "interpreter share one core's worth of Python")]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="rewrite docs/benchmarks.md's benchmark block")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results.json")
    p.add_argument("--readme", type=Path, default=ROOT / "docs" / "benchmarks.md",
                   help="the page holding the block (default: docs/benchmarks.md)")
    p.add_argument("--check", action="store_true", help="only check that the block is current")
    a = p.parse_args(argv)
    text = a.readme.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    begins = [i for i, ln in enumerate(lines) if ln.strip() == BEGIN]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or begins[0] >= ends[0]:
        print(f"render_readme: {a.readme} needs exactly one line '{BEGIN}' followed later by "
              f"one line '{END}' (found {len(begins)} and {len(ends)}); add them where the "
              "benchmark figures belong. Nothing was written.", file=sys.stderr)
        return 2
    doc = json.loads(a.results.read_text(encoding="utf-8"))
    block = render(doc).rstrip("\n") + "\n"
    new = "".join([*lines[: begins[0] + 1], block, *lines[ends[0]:]])
    if a.check:
        if new != text:
            print(f"render_readme: the block in {a.readme} is not current: run "
                  "python benchmarks/render_readme.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        a.readme.write_text(new, encoding="utf-8")
    print(f"render_readme: {a.readme} block rewritten from {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
