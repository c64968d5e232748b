"""The deep target: TLC's random simulation of a model too big to enumerate.

``toolledger deep`` runs ``model/deep/Deep.cfg`` (3 calls of the three
effectful policies, 3 crashes, 3 attempts, expiring keys; every safety
invariant) with ``-simulate num=N -depth D -seed S``: N random behaviours,
each up to D steps, the same N behaviours for the same seed (one worker).
It samples where the CI models enumerate: a maintainer runs it on demand
after a change the small models may be too small for, and ``make bench``
records what a run covers (docs/protocol.md, "The models").  ``--override
OP=TWIN`` swaps in an operator (a twin of model/MCTwins.tla, which the deep
module extends) to show the target finding a planted bug.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .tlc import run_tlc
from .tlcoutput import Outcome, TLCResult

__all__ = ["DEEP_CFG", "DeepRun", "cmd_deep", "configure", "run_deep"]

DEEP_CFG = Path("model") / "deep" / "Deep.cfg"
DEEP_MODULE = "MCDeep"
_PROGRESS_RE = re.compile(r"Progress\(-?\d+\) at [^:]+:\d+:\d+: (\d+) states generated")
_OVERRIDE_RE = re.compile(r"^[A-Za-z_]\w*=[A-Za-z_]\w*$")


@dataclass(frozen=True)
class DeepRun:
    """What one simulation established: ``violated`` is None when none of the
    ``traces`` behaviours broke an invariant."""

    traces: int
    depth: int
    seed: int
    states: int
    seconds: float
    result: TLCResult

    @property
    def violated(self) -> str | None:
        return self.result.violated if self.result.outcome is not Outcome.PASS else None


def _cfg_with_overrides(root: Path, overrides: list[str], tmp: Path) -> Path:
    cfg = root / DEEP_CFG
    if not overrides:
        return cfg
    for o in overrides:
        if not _OVERRIDE_RE.match(o):
            raise ValueError(f"--override {o!r}: write OPERATOR=REPLACEMENT, "
                             "e.g. DecisionFor=DecideIgnoresKeyRetention")
    text = cfg.read_text()
    lines = "".join(f"    {o.replace('=', ' <- ')}\n" for o in overrides)
    text = text.replace("SPECIFICATION", lines + "SPECIFICATION", 1)
    out = tmp / "Deep.cfg"
    out.write_text(text)
    return out


def run_deep(root: Path, *, traces: int = 2000, depth: int = 120, seed: int = 1,
             overrides: list[str] | None = None, timeout: float | None = None) -> DeepRun:
    """Simulate ``traces`` behaviours of the deep model; raise ``ValueError`` for bad input."""
    if traces < 1 or depth < 1:
        raise ValueError(f"traces and depth must be >= 1 (got {traces}, {depth})")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="toolledger-deep-") as tmp_name:
        cfg = _cfg_with_overrides(root, list(overrides or ()), Path(tmp_name))
        started = time.monotonic()
        result = run_tlc(
            DEEP_MODULE, cfg,
            search_dirs=[root / "spec", root / "model", root / "model" / "deep"],
            check_deadlock=False, workers=1, fp=None, liveness_at_end=False,
            extra_args=["-simulate", f"num={traces}", "-depth", str(depth), "-seed", str(seed)],
            timeout=timeout, jvm_args=(),  # C2: a simulation runs for minutes
        )
        seconds = time.monotonic() - started
    found = _PROGRESS_RE.findall(result.output)
    states = int(found[-1]) if found else (result.generated_states or 0)
    if result.outcome is Outcome.ERROR and result.exit_code == 0:
        # TLC's simulation ends without the model checker's success message
        result = replace(result, outcome=Outcome.PASS, error_text="")
    return DeepRun(traces=traces, depth=depth, seed=seed, states=states, seconds=seconds,
                   result=result)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--traces", type=int, default=2000,
                   help="random behaviours to simulate (default 2000)")
    p.add_argument("--depth", type=int, default=120,
                   help="steps per behaviour at most (default 120)")
    p.add_argument("--seed", type=int, default=1,
                   help="TLC's random seed: the same seed simulates the same behaviours")
    p.add_argument("--override", action="append", default=[], metavar="OP=TWIN",
                   help="swap an operator for a twin's (repeatable), e.g. "
                   "DecisionFor=DecideIgnoresKeyRetention: the run must then find a violation")


def cmd_deep(args: argparse.Namespace, root: Path) -> int:
    """Print what the simulation covered; exit 0 if no invariant broke, 1 if one did."""
    from .counterexample import render_trace

    run = run_deep(root, traces=args.traces, depth=args.depth, seed=args.seed,
                   overrides=args.override)
    r = run.result
    head = (f"deep: {run.traces:,} behaviours of up to {run.depth} steps (seed {run.seed}), "
            f"{run.states:,} states, {run.seconds:.1f} s")
    if r.outcome is Outcome.PASS:
        print(f"{head}: every invariant held")
        return 0
    if r.outcome in (Outcome.INVARIANT_VIOLATED, Outcome.PROPERTY_VIOLATED, Outcome.DEADLOCK):
        print(f"{head}: {r.violated} violated")
        print(render_trace(r.trace, violated=f"invariant {r.violated}"))
        return 1
    print(f"{head}: TLC did not finish ({r.outcome.value}): {r.error_text}")
    return 2
