"""How often ``toolledger check --quick`` catches what the full check catches.

A set of deliberate mutants, each one small edit of the spec (a dropped
guard, a weakened invariant, a changed decision) or of the Python reference
(``reference/toolledger/_core``), is applied one at a time to a copy of the
project (``spec/``, ``model/``, ``reference/``, committed into a fresh git
repository, so that ``--quick`` sees exactly the mutant in ``git diff HEAD``).
For each mutant it runs ``toolledger check --quick --json`` (from this
environment, checking the copy's own reference): its verdict (exit status 1
is caught), wall seconds and CPU seconds (``getrusage`` of the children:
the command, its JVMs and conformance workers).

The maintainer's real situation is measured: ``make check`` has run on the
unchanged tree, so its TLC cache (``build/tlc-cache``, which ``check --quick``
reads and fills by default) holds every unchanged verdict and state graph.
Before the first mutant the benchmark primes the copy's ``build/tlc-cache``
with one full check of the unmutated copy (``toolledger check --tlc-cache``,
what ``make check`` runs; its own time is reported apart, not counted as a
quick answer); ``--no-prime`` measures a cold cache instead.  A spec mutant
changes every model's inputs, so the cache answers nothing of it; a
reference mutant leaves the spec's graphs unchanged, and its quick answer
is the conformance checks alone.

The full check (``toolledger check --json --tlc-cache``, what ``make check``
runs, on the same cache) is run only for the mutants the quick mode misses:
a mutant it catches counts as caught by the full check too (the quick mode
runs a subset of the full check's rows). Its verdicts are kept in a cache in
the user's cache directory (``~/.cache/toolledger/bench_quick.json``), keyed
by a digest of the copy's files and of the mutant, so a second run of an
unchanged tree does not repeat them; ``--no-cache`` ignores it.

The catch rate is (caught by quick) / (caught by the full check); mutants
neither catches are listed apart (they say what the models cannot see, not
what the quick mode misses).  Goal (issue 24): >= 90 %, each quick answer
<= 20 s on 2 cores.  Times on a loaded machine are inflated: the load
average is printed with them, and CPU seconds beside wall seconds.

``python benchmarks/bench_quick.py [--smoke] [--json] [--only NAME] [--no-cache] [--no-prime]``
(``--smoke``: the first mutant, no full check, and no priming: the first
mutant is a spec mutant, whose quick answer no cached run can serve).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, Result, heading, machine_info, rounded, table

GOAL_RATE = 0.9
GOAL_SECONDS = 20.0
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "toolledger" / (
    "bench_quick.json")
SPEC = "spec/DurableToolExecution.tla"
PROTOCOL = "reference/toolledger/_core/protocol.py"
RECOVERY = "reference/toolledger/_core/recovery.py"


@dataclass(frozen=True)
class Mutant:
    """One edit: ``old`` (which must occur exactly once in ``path``) becomes ``new``."""

    name: str
    kind: str  # "spec" or "reference"
    path: str
    old: str
    new: str
    what: str


MUTANTS: tuple[Mutant, ...] = (
    # -- the spec: dropped guards
    Mutant("spec-reconcile-not-applied-guard", "spec", SPEC,
           '/\\ stage[c] = "reconciling" /\\ applied[e] = 0\n',
           '/\\ stage[c] = "reconciling"\n',
           "EngineReconcileNotApplied without applied[e] = 0"),
    Mutant("spec-dispatch-attempt-bound", "spec", SPEC,
           "    /\\ n <= MaxAttempts\n    /\\ ledger' = [ledger EXCEPT ![e] = [status |-> "
           '"dispatched"',
           "    /\\ ledger' = [ledger EXCEPT ![e] = [status |-> \"dispatched\"",
           "EnginePersistDispatched without n <= MaxAttempts"),
    Mutant("spec-dispatch-approval", "spec", SPEC,
           '    /\\ \\/ stage[c] = "live" /\\ ApprovalOK(c)\n',
           '    /\\ \\/ stage[c] = "live"\n',
           "EnginePersistDispatched without ApprovalOK(c)"),
    Mutant("spec-readonly-approval", "spec", SPEC,
           '/\\ stage[c] = "live" /\\ Policy[c] = "readonly" /\\ ApprovalOK(c)',
           '/\\ stage[c] = "live" /\\ Policy[c] = "readonly"',
           "EngineInvokeReadonly without ApprovalOK(c)"),
    Mutant("spec-reconcile-retry-budget", "spec", SPEC,
           '/\\ stage[c] = "reconciling" /\\ applied[e] = 0\n'
           "    /\\ Rec(c).attempt < MaxAttempts\n",
           '/\\ stage[c] = "reconciling" /\\ applied[e] = 0\n',
           "EngineReconcileNotApplied without Rec(c).attempt < MaxAttempts"),
    Mutant("spec-crash-bound", "spec", SPEC,
           "    /\\ crashes < MaxCrashes\n    /\\ crashes' = crashes + 1\n",
           "    /\\ crashes' = crashes + 1\n",
           "Crash without crashes < MaxCrashes (a bigger state space: drift)"),
    # -- the spec: the recovery decision
    Mutant("spec-decide-key-retention", "spec", SPEC,
           "IF i.attempt < MaxAttempts /\\ i.keyRetained", "IF i.attempt < MaxAttempts",
           "Decide retries an idempotent call whose key may be forgotten"),
    Mutant("spec-decide-reconcile-retries", "spec", SPEC,
           '[] i.policy = "reconcile" -> "reconcile"',
           '[] i.policy = "reconcile" -> "retry_same_id"',
           "Decide retries a reconcile call blindly"),
    Mutant("spec-decide-abandoned", "spec", SPEC,
           'i.status \\in {"succeeded", "failed", "abandoned"} THEN "reconstruct"',
           'i.status \\in {"succeeded", "failed"} THEN "reconstruct"',
           "Decide does not reconstruct an abandoned call"),
    Mutant("spec-decide-digest", "spec", SPEC,
           'ELSE IF i.status # "none" /\\ ~i.digestMatches THEN "recovery_required"\n',
           "",
           "Decide ignores a record for other arguments"),
    # -- the spec: weakened invariants
    Mutant("spec-weak-at-most-once", "spec", SPEC,
           "effects[c] <= 1 + humanRetries[ExecId(c)]", "effects[c] <= 2 + humanRetries[ExecId(c)]",
           "AtMostOnceEffect allows a second effect"),
    Mutant("spec-weak-attempt-sent-once", "spec", SPEC,
           "sent[c][n] <= 1", "sent[c][n] <= 2", "AttemptSentOnce allows a re-sent attempt"),
    Mutant("spec-weak-no-blind-replay", "spec", SPEC,
           '\\/ i[3] = "policy" /\\ Policy[c] = "reconcile" /\\ fenced[i[1]] >= i[2] - 1',
           '\\/ i[3] = "policy" /\\ Policy[c] = "reconcile"',
           "NoBlindReplay does not ask for the fence"),
    Mutant("spec-weak-approval-single-use", "spec", SPEC,
           'Cardinality({i \\in invocations[c] : i[3] = "approval"}) <= 1',
           'Cardinality({i \\in invocations[c] : i[3] = "approval"}) <= 2',
           "ApprovalSingleUse allows a replayed approval"),
    # -- the spec: more of the same kinds (added with the function-level selection)
    Mutant("spec-apply-ignores-fence", "spec", SPEC,
           "      /\\ Sender(c, e, n) /\\ ~Fenced(e, n) /\\ Delivered(e, n)\n",
           "      /\\ Sender(c, e, n) /\\ Delivered(e, n)\n",
           "ExternalApply applies a fenced attempt"),
    Mutant("spec-fenced-off-by-one", "spec", SPEC,
           "Fenced(e, n) == n <= fenced[e]", "Fenced(e, n) == n < fenced[e]",
           "Fenced misses the attempt the fence was set at"),
    Mutant("spec-reconcile-fence-off-by-one", "spec", SPEC,
           "THEN [fenced EXCEPT ![e] = Rec(c).attempt] ELSE fenced",
           "THEN [fenced EXCEPT ![e] = Rec(c).attempt - 1] ELSE fenced",
           "EngineReconcileNotApplied fences one attempt too few"),
    Mutant("spec-cancel-after-dispatch", "spec", SPEC,
           '    /\\ Policy[c] = "readonly" \\/ Rec(c).status = "none"\n', "",
           "HumanCancel without the not-yet-dispatched guard"),
    Mutant("spec-record-succeeded-readonly", "spec", SPEC,
           '/\\ stage[c] = "got_ok" /\\ Policy[c] # "readonly"\n',
           '/\\ stage[c] = "got_ok"\n',
           "EngineRecordSucceeded also records a readonly answer"),
    Mutant("spec-reject-remembered-key", "spec", SPEC,
           "      /\\ ~KeyRemembered(e)\n", "",
           "ExternalRejectDefinite rejects a request the key deduplicates"),
    Mutant("spec-decide-attempt-off-by-one", "spec", SPEC,
           "IF i.attempt < MaxAttempts /\\ i.keyRetained",
           "IF i.attempt <= MaxAttempts /\\ i.keyRetained",
           "Decide retries an idempotent call with its budget spent"),
    Mutant("spec-weak-cancelled-never-invoked", "spec", SPEC,
           '        /\\ stage[c] \\notin {"live", "retry", "dispatched", "waiting"}\n', "",
           "CancelledNeverInvoked does not ask for the stage"),
    Mutant("spec-weak-recovery-required-halts", "spec", SPEC,
           '        \\/ stage[c] = "retry" /\\ RetryGranted(c)\n',
           '        \\/ stage[c] = "retry"\n',
           "RecoveryRequiredHalts allows a retry without a grant"),
    Mutant("spec-weak-result-fidelity", "spec", SPEC,
           '        /\\ result[c].kind \\in {"denied", "cancelled"} => invocations[c] = {}\n',
           "",
           "ResultFidelity allows a denied or cancelled call that was invoked"),
    # -- the reference
    Mutant("ref-decide-key-retention", "reference", RECOVERY,
           "if i.attempt < i.max_attempts and i.key_retained", "if i.attempt < i.max_attempts",
           "decide_recovery retries an idempotent call whose key may be forgotten"),
    Mutant("ref-decide-abandoned", "reference", RECOVERY,
           "{LedgerStatus.SUCCEEDED, LedgerStatus.FAILED, LedgerStatus.ABANDONED}",
           "{LedgerStatus.SUCCEEDED, LedgerStatus.FAILED}",
           "decide_recovery does not reconstruct an abandoned call"),
    Mutant("ref-decide-reconcile-retries", "reference", RECOVERY,
           "            d = Decision.RECONCILE\n", "            d = Decision.RETRY_SAME_ID\n",
           "decide_recovery retries a reconcile call blindly"),
    Mutant("ref-decide-digest", "reference", RECOVERY,
           "elif i.status is not LedgerStatus.NONE and not i.digest_matches:",
           "elif i.status is not LedgerStatus.NONE and not i.digest_matches and i.legacy:",
           "decide_recovery ignores a record for other arguments (unless legacy)"),
    Mutant("ref-dispatch-attempt-bound", "reference", PROTOCOL,
           "    n = rec.attempt + 1\n"
           '    _require(n <= state.max_attempts, ev, f"attempt {n} exceeds max_attempts")\n'
           "    new_rec = ExecutionRecord(\n",
           "    n = rec.attempt + 1\n    new_rec = ExecutionRecord(\n",
           "EnginePersistDispatched without the attempt bound"),
    Mutant("ref-reconcile-retry-budget", "reference", PROTOCOL,
           '    _require(rec.attempt < state.max_attempts, ev, "the retry budget is spent")\n', "",
           "EngineReconcileNotApplied without the retry budget"),
    Mutant("ref-readonly-approval", "reference", PROTOCOL,
           '    _require(_approval_ok(state, c), ev, "the call is not approved")\n'
           "    return state._with_call(c._staged(Stage.GOT_OK))\n",
           "    return state._with_call(c._staged(Stage.GOT_OK))\n",
           "EngineInvokeReadonly without the approval"),
    Mutant("ref-persist-call-overwrites", "reference", PROTOCOL,
           "stage = Stage.LIVE if fresh else Stage.RESUME", "stage = Stage.LIVE",
           "EnginePersistCall dispatches live over an existing record"),
    Mutant("ref-recover-no-audit", "reference", PROTOCOL,
           "    if not call.tool.protected or d is Decision.SKIP:\n",
           "    if not call.tool.protected or d in (Decision.SKIP, Decision.EXECUTE):\n",
           "Recover does not audit an execute decision"),
    Mutant("ref-denied-other-args", "reference", PROTOCOL,
           "    _require(\n        _approval_for(state, c),\n        ev,\n"
           '        "the rejection was for other arguments than this call\'s: '
           'park a new approval",\n'
           "    )\n", "",
           "EngineRecordDenied on a rejection of other arguments"),
    Mutant("ref-crash-resumes-answered", "reference", PROTOCOL,
           "stage=Stage.RESUME if c.result is None else Stage.NONE", "stage=Stage.RESUME",
           "Crash hands answered calls to Recover"),
    Mutant("ref-cancel-after-dispatch", "reference", PROTOCOL,
           "        not c.tool.protected or rec.status is LedgerStatus.NONE,\n",
           "        True,\n",
           "HumanCancel on a call already dispatched"),
    Mutant("ref-record-succeeded-readonly", "reference", PROTOCOL,
           '    _require(c.tool.protected, ev, "a readonly result is appended, not recorded")\n',
           "", "EngineRecordSucceeded also records a readonly answer"),
    Mutant("ref-record-failed-as-succeeded", "reference", PROTOCOL,
           "    new_rec = replace(rec, status=LedgerStatus.FAILED, result=res)\n",
           "    new_rec = replace(rec, status=LedgerStatus.SUCCEEDED, result=res)\n",
           "EngineRecordFailed stores the failure as succeeded (a store mistake)"),
    Mutant("ref-late-answer-other-attempt", "reference", PROTOCOL,
           "        and rec.attempt == attempt\n", "",
           "a late answer of an older attempt is taken as the current one (wrong fencing)"),
    Mutant("ref-reconcile-applied-no-audit", "reference", PROTOCOL,
           '        ._with_audit((c.execution_id, "reconcile_applied", rec.attempt))\n', "",
           "EngineReconcileApplied commits without its audit row"),
    Mutant("ref-timeout-forgets-call", "reference", PROTOCOL,
           "    _stage(c, ev, Stage.WAITING)\n"
           "    return state._with_call(c._staged(Stage.RESUME))\n",
           "    _stage(c, ev, Stage.WAITING)\n"
           "    return state._with_call(c._staged(Stage.NONE))\n",
           "EngineTimeout drops the call instead of handing it to Recover"),
)


from benchmarks.bench_check import _children_cpu, _toolledger  # noqa: E402


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def make_copy(dst: Path) -> Path:
    """spec/, model/ and reference/ of this checkout, committed into a new repository."""
    for d in ("spec", "model", "reference"):
        shutil.copytree(ROOT / d, dst / d,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (dst / "docs").mkdir()
    _git(dst, "init", "-q")
    _git(dst, "add", "-A")
    _git(dst, "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "copy")
    return dst


def stale(root: Path, mutants: Sequence[Mutant]) -> list[str]:
    """The mutants whose text no longer occurs exactly once under ``root`` (the code
    moved): checked for all before the first check runs, and by a test."""
    return [f"mutant {m.name}: its text occurs {n} times in {m.path} (must be once)"
            for m in mutants
            if (n := (root / m.path).read_text(encoding="utf-8").count(m.old)) != 1]


def apply(copy: Path, m: Mutant) -> None:
    """Apply ``m`` to the copy; a mutant whose text is gone is a clear error."""
    if problems := stale(copy, [m]):
        raise SystemExit(f"{problems[0]}: update it in benchmarks/bench_quick.py")
    path = copy / m.path
    path.write_text(path.read_text(encoding="utf-8").replace(m.old, m.new), encoding="utf-8")


def restore(copy: Path) -> None:
    _git(copy, "checkout", "-q", "--", ".")


def run_check(copy: Path, args: Sequence[str], timeout: float) -> dict[str, Any]:
    """One ``toolledger check`` in the copy: exit status, failing rows, wall and CPU."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    done = subprocess.run([*_toolledger(), "check", "--json", *args], cwd=copy,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    try:
        rows = json.loads(done.stdout) if done.stdout.strip() else []
    except json.JSONDecodeError:
        rows = []
    failing = sorted({f"{r['model']}{'' if r['check'] == 'tlc' else ' [' + r['check'] + ']'}"
                      for r in rows if r.get("status") not in ("ok", None)})
    return {"exit_status": done.returncode, "caught": done.returncode == 1,
            "rows": sum(1 for r in rows if r.get("check") == "tlc"),
            "conformance_rows": sum(1 for r in rows if r.get("check") == "conformance"),
            "failing": failing, "wall_seconds": rounded(wall, 2), "cpu_seconds": rounded(cpu, 2),
            "stderr_tail": done.stderr[-600:] if done.returncode not in (0, 1) else ""}


def _tree_digest(copy: Path, m: Mutant) -> str:
    h = hashlib.sha256(_git(copy, "rev-parse", "HEAD^{tree}").encode())
    h.update(json.dumps([m.path, m.old, m.new]).encode())
    return h.hexdigest()[:24]


def _load_cache() -> dict[str, Any]:
    try:
        data = json.loads(CACHE.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _save_cache(cache: dict[str, Any]) -> None:
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(CACHE)


def rate(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The catch rate of the quick mode over the mutants the full check catches."""
    full = [r for r in results if r["full_caught"]]
    quick = [r for r in full if r["quick"]["caught"]]
    unknown = [r["name"] for r in results if r["full_caught"] is None]
    slow = [r["name"] for r in results if r["quick"]["wall_seconds"] > GOAL_SECONDS]
    return {
        "mutants": len(results),
        "caught_by_full": len(full),
        "caught_by_quick": len(quick),
        "rate": rounded(len(quick) / len(full), 3) if full else None,
        # as if the full check caught every mutant it was not run on
        "rate_lower_bound": (rounded(len(quick) / (len(full) + len(unknown)), 3)
                             if full or unknown else None),
        "missed_by_quick": [r["name"] for r in full if not r["quick"]["caught"]],
        "caught_by_neither": [r["name"] for r in results if r["full_caught"] is False],
        # quick missed, full check not run: the rate is a lower bound while any is left
        "full_not_run": unknown,
        "quick_over_goal_seconds": slow,
        "quick_max_wall_seconds": max((r["quick"]["wall_seconds"] for r in results), default=0),
        "quick_max_cpu_seconds": max((r["quick"]["cpu_seconds"] for r in results), default=0),
    }


def run(smoke: bool = False, only: Sequence[str] = (), use_cache: bool = True,
        full_timeout: float = 1800.0, run_full: bool = True, prime: bool | None = None) -> Result:
    if prime is None:
        prime = not smoke
    mutants = [m for m in MUTANTS if not only or m.name in only]
    if smoke:
        mutants = list(MUTANTS[:1])  # the cheapest quick answer (about 10 s of CPU)
    if not mutants:
        raise SystemExit(f"no mutant named {', '.join(only)}; the names: "
                         + ", ".join(m.name for m in MUTANTS))
    if problems := stale(ROOT, mutants):
        raise SystemExit("; ".join(problems) + ": update them in benchmarks/bench_quick.py")
    cache = _load_cache() if use_cache else {}
    results: list[dict[str, Any]] = []
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-quick-") as tmp:
        copy = make_copy(Path(tmp) / "copy")
        tlc_cache = copy / "build" / "tlc-cache"  # where `make check` keeps it
        primed: dict[str, Any] | None = None
        if prime:
            heading("priming the TLC cache: the full check of the unmutated copy")
            tlc_cache.mkdir(parents=True)
            primed = run_check(copy, ["--tlc-cache", str(tlc_cache)], timeout=full_timeout)
            loads.append(os.getloadavg()[0])
            print(f"primed: exit {primed['exit_status']}, {primed['wall_seconds']:.0f} s wall, "
                  f"{primed['cpu_seconds']:.0f} s CPU; load {loads[-1]:.1f}", flush=True)
            if primed["exit_status"] != 0:
                raise SystemExit("the unmutated copy fails its full check: "
                                 f"{', '.join(primed['failing']) or primed['stderr_tail']}")
        # 1. the quick answer to every mutant (what a maintainer waits for)
        heading(f"{len(mutants)} mutants, toolledger check --quick on each")
        for m in mutants:
            apply(copy, m)
            quick = run_check(copy, ["--quick"], timeout=600)
            key = _tree_digest(copy, m)
            restore(copy)
            loads.append(os.getloadavg()[0])
            results.append({"name": m.name, "kind": m.kind, "what": m.what, "quick": quick,
                            "key": key, "full_caught": True if quick["caught"] else None,
                            "full_source": "implied by quick", "full": None})
            print(f"{m.name}: quick {'caught' if quick['caught'] else 'MISSED'} "
                  f"(exit {quick['exit_status']}, {quick['rows']} TLC + "
                  f"{quick['conformance_rows']} conformance rows, {quick['wall_seconds']:.1f} s "
                  f"wall, {quick['cpu_seconds']:.1f} s CPU; "
                  f"{', '.join(quick['failing'][:3]) or '-'}); load {loads[-1]:.1f}", flush=True)
        # 2. the full check's verdict on the mutants quick missed (cached)
        missed = [(m, r) for m, r in zip(mutants, results, strict=True) if not r["quick"]["caught"]]
        if missed:
            heading(f"the full check on the {len(missed)} mutants quick missed")
        for m, r in missed:
            if r["key"] in cache:
                r["full"], r["full_source"] = cache[r["key"]], "cache"
            elif smoke or not run_full:
                r["full_source"] = "not run"
                continue
            else:
                apply(copy, m)
                full_args = ["--tlc-cache", str(tlc_cache)] if prime else []
                r["full"], r["full_source"] = run_check(copy, full_args,
                                                        timeout=full_timeout), "run"
                restore(copy)
                loads.append(os.getloadavg()[0])
                cache[r["key"]] = r["full"]
                if use_cache:
                    _save_cache(cache)
            r["full_caught"] = bool(r["full"]["caught"])
            print(f"{m.name}: full check {'caught' if r['full_caught'] else 'not caught'} "
                  f"({r['full_source']}; {r['full']['wall_seconds']:.0f} s wall, "
                  f"{r['full']['cpu_seconds']:.0f} s CPU; "
                  f"{', '.join(r['full']['failing'][:3]) or '-'})", flush=True)
    heading("per mutant")
    print(table(
        ("mutant", "kind", "quick", "rows", "wall s", "CPU s", "full"),
        [(r["name"], r["kind"], "caught" if r["quick"]["caught"] else "missed",
          f"{r['quick']['rows']}+{r['quick']['conformance_rows']}",
          f"{r['quick']['wall_seconds']:.1f}", f"{r['quick']['cpu_seconds']:.1f}",
          {True: "caught", False: "not caught", None: "?"}[r["full_caught"]]
          + f" ({r['full_source']})")
         for r in results],
        right=(4, 5),
    ))
    summary = rate(results)
    heading("catch rate")
    pct = "-" if summary["rate"] is None else f"{100 * summary['rate']:.0f} %"
    print(f"quick caught {summary['caught_by_quick']} of the {summary['caught_by_full']} mutants "
          f"the full check catches ({pct}; goal >= {100 * GOAL_RATE:.0f} %); "
          f"caught by neither: {', '.join(summary['caught_by_neither']) or 'none'}"
          + (f"; full check not run on {', '.join(summary['full_not_run'])}: the rate is "
             f"between {100 * (summary['rate_lower_bound'] or 0):.0f} % and {pct}"
             if summary["full_not_run"] else ""))
    print(f"slowest quick answer {summary['quick_max_wall_seconds']:.1f} s wall "
          f"(goal <= {GOAL_SECONDS:.0f} s), largest CPU {summary['quick_max_cpu_seconds']:.1f} s; "
          f"1-minute load average {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores")
    print("the quick answers read a TLC cache "
          + ("primed by one full check of the unmutated tree (as after `make check`)"
             if prime else "that was empty (--no-prime)"))
    return {"machine": machine_info(), "mutants": results, **summary,
            "cache": "primed by one unmutated full check" if prime else "cold",
            "priming": primed,
            "load_average": {"min": rounded(min(loads), 2), "max": rounded(max(loads), 2)},
            "goal_rate": GOAL_RATE, "goal_seconds": GOAL_SECONDS}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--smoke", action="store_true",
                   help="one mutant, no full check, no priming")
    p.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="only this mutant")
    p.add_argument("--no-cache", action="store_true", help="ignore the full check's cache")
    p.add_argument("--no-full", action="store_true",
                   help="do not run the full check (its cached verdicts are still used)")
    p.add_argument("--no-prime", action="store_true",
                   help="do not prime the TLC cache with a full check of the unmutated copy")
    args = p.parse_args(argv)
    result = run(smoke=args.smoke, only=args.only, use_cache=not args.no_cache,
                 run_full=not args.no_full, prime=False if args.no_prime else None)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
