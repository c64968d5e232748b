"""TLC's results and its ``-tool`` output, read into them.

The values a run gives (:class:`Outcome`, :class:`TLCResult`, :class:`TraceStep`,
:class:`Progress`, :class:`TLCMessage`) and the reader of TLC's machine-readable
output: :func:`parse_tool_output` splits it into ``@!@!@STARTMSG``/``ENDMSG``
blocks, and the collector folds one run's messages into a :class:`TLCResult`
(outcome from the message codes, counts, the counterexample parsed with
:mod:`toolledger.check.tlavalues`).  Split from :mod:`toolledger.check.tlc`,
which runs the JVM and re-exports every public name here: import them from
there.  Standard library only; nothing here starts a process.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from .tlavalues import StateParser, TLAParseError, Value

__all__ = [
    "Outcome",
    "Progress",
    "TLCMessage",
    "TLCResult",
    "TraceStep",
    "parse_tool_output",
]

class Outcome(enum.Enum):
    """What a TLC run established."""

    PASS = "pass"
    INVARIANT_VIOLATED = "invariant_violated"
    PROPERTY_VIOLATED = "property_violated"
    DEADLOCK = "deadlock"
    PARSE_ERROR = "parse_error"
    ERROR = "error"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class TraceStep:
    """One state of a counterexample.

    ``action`` is the operator name of the step (``"Init"`` for the initial
    state). Temporal counterexamples end either with a ``"Stuttering"`` step
    (the state repeats forever; ``state`` is the previous one) or with a lasso
    step: ``action`` is the action that closes the loop, ``loop_to`` is the
    1-based index of the state it returns to, and ``state`` is that state.
    """

    index: int
    action: str
    state: dict[str, Value]
    loop_to: int | None = None

    @property
    def is_stuttering(self) -> bool:
        return self.action == "Stuttering" and self.loop_to is None


@dataclass(frozen=True)
class Progress:
    """Counts reported while TLC runs (initial states, every minute, and at the end)."""

    distinct: int
    generated: int
    queued: int | None
    depth: int | None
    elapsed: float


@dataclass(frozen=True)
class TLCMessage:
    """One ``@!@!@STARTMSG code:severity`` ... ``ENDMSG`` block of ``-tool`` output."""

    code: int
    severity: int  # 0 info, 1 error, 2 TLC bug, 3 warning, 4 state
    text: str


@dataclass(frozen=True)
class TLCResult:
    """Everything a TLC run established; ``output`` is the raw text, for debugging."""

    outcome: Outcome
    violated: str | None
    distinct_states: int | None
    generated_states: int | None
    depth: int | None
    wall_seconds: float
    exit_code: int
    trace: tuple[TraceStep, ...]
    error_text: str
    output: str
    command: tuple[str, ...] = field(repr=False, default=())
    initial_states: int | None = None
    # answered from the cache of runs of the same inputs (toolledger.check.tlccache)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.PASS


# ----------------------------------------------------------------------------
# -tool output.

_MARK_RE = re.compile(r"@!@!@(?:STARTMSG (-?\d+):(\d+)|ENDMSG (-?\d+)) @!@!@")

MSG_SANY_START = 2220
MSG_SANY_END = 2219
MSG_INIT_STATES = 2190  # "N distinct states generated"
MSG_INIT_STATES_DUP = 2191  # "N states generated, with M of them distinct"
MSG_SUCCESS = 2193
MSG_DEPTH = 2194
MSG_STATS = 2199
MSG_PROGRESS = 2200
MSG_INVARIANT_INITIAL = 2107
MSG_INVARIANT = 2110
MSG_ACTION_PROPERTY = 2112  # "Action property X is violated."
MSG_DEADLOCK = 2114
MSG_TEMPORAL = 2116
MSG_BEHAVIOR = 2121
MSG_BACK_TO_STATE = 2122
MSG_TRACE_STATE = 2217
MSG_STUTTERING = 2218
MSG_PARSE_FAILED = 3002


def parse_tool_output(lines: Iterable[str]) -> Iterator[TLCMessage | str]:
    """Split ``-tool`` output into :class:`TLCMessage` blocks and untagged lines.

    Messages can nest (TLC starts one in the middle of another's line); a
    nested message is yielded when it ends, and its text is also part of the
    enclosing message's text. Untagged lines (SANY output) are yielded as str.
    """
    stack: list[tuple[int, int, list[str]]] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        pos = 0
        marked = False
        for m in _MARK_RE.finditer(line):
            marked = True
            seg = line[pos : m.start()]
            pos = m.end()
            if seg:
                if stack:
                    stack[-1][2].append(seg)
                else:
                    yield seg
            if m.group(1) is not None:
                stack.append((int(m.group(1)), int(m.group(2)), []))
            elif stack:
                code, sev, buf = stack.pop()
                text = "\n".join(buf)
                if stack:
                    stack[-1][2].append(text)
                yield TLCMessage(code, sev, text)
        seg = line[pos:]
        if seg or not marked:
            if stack:
                stack[-1][2].append(seg)
            else:
                yield seg
    while stack:  # truncated output (process killed): flush what was open
        code, sev, buf = stack.pop()
        yield TLCMessage(code, sev, "\n".join(buf))


_COUNT = r"(\d[\d,]*)"
_PROGRESS_RE = re.compile(
    r"Progress\((\d+)\).*?: "
    + _COUNT
    + r" states generated.*?, "
    + _COUNT
    + r" distinct states found.*?, "
    + _COUNT
    + r" states left on queue"
)
_STATS_RE = re.compile(
    _COUNT
    + r" states generated, "
    + _COUNT
    + r" distinct states found(?:, "
    + _COUNT
    + r" states left)?"
)
_INIT_RE = re.compile(_COUNT + r" distinct states? generated")
_INIT_DUP_RE = re.compile(_COUNT + r" states? generated, with " + _COUNT + r" of them distinct")
_DEPTH_RE = re.compile(r"depth of the complete state graph search is (\d+)")
_ACTION_PROPERTY_RE = re.compile(r"Action property (\w+) is violated")
_INVARIANT_RE = re.compile(r"Invariant (\S+) is violated")
_TRACE_HEAD_RE = re.compile(
    r"(\d+): (?:(Back to state): )?<(.*?)"
    r"(?: line \d+, col \d+ to line \d+, col \d+ of module \S+)?>\s*$"
)


def _int(s: str) -> int:
    return int(s.replace(",", ""))


class _Collector:
    """Folds the message stream of one run into the fields of a TLCResult."""

    def __init__(self, on_progress: Callable[[Progress], None] | None, started: float) -> None:
        self.on_progress = on_progress
        self.started = started
        self.messages: list[TLCMessage] = []
        self.sany_lines: list[str] = []
        self.in_sany = False
        self.distinct: int | None = None
        self.generated: int | None = None
        self.initial: int | None = None
        self.depth: int | None = None
        self.progress_depth: int | None = None
        self.violated: str | None = None
        self.kind: Outcome | None = None
        self.success = False
        self.parse_failed = False
        self.trace_msgs: list[TLCMessage] = []
        self.initial_violation_state: str | None = None
        self.last_progress: tuple[int, int, int | None] | None = None

    def _progress(self, queued: int | None, depth: int | None) -> None:
        if self.on_progress is None or self.distinct is None or self.generated is None:
            return
        key = (self.distinct, self.generated, queued)
        if key == self.last_progress:  # TLC repeats the final counts in 2200 and 2199
            return
        self.last_progress = key
        elapsed = time.monotonic() - self.started
        self.on_progress(Progress(self.distinct, self.generated, queued, depth, elapsed))

    def feed(self, item: TLCMessage | str) -> None:
        if isinstance(item, str):
            if self.in_sany:
                self.sany_lines.append(item)
            return
        self.messages.append(item)
        code, text = item.code, item.text
        if code == MSG_SANY_START:
            self.in_sany = True
        elif code == MSG_SANY_END:
            self.in_sany = False
        elif code == MSG_INIT_STATES:
            m = _INIT_RE.search(text)
            if m:
                self.initial = self.distinct = self.generated = _int(m.group(1))
                self._progress(None, 1)
        elif code == MSG_INIT_STATES_DUP:
            m = _INIT_DUP_RE.search(text)
            if m:
                self.generated, self.initial = _int(m.group(1)), _int(m.group(2))
                self.distinct = self.initial
                self._progress(None, 1)
        elif code == MSG_PROGRESS:
            m = _PROGRESS_RE.search(text)
            if m:
                self.progress_depth = int(m.group(1))
                self.generated, self.distinct = _int(m.group(2)), _int(m.group(3))
                self._progress(_int(m.group(4)), self.progress_depth)
        elif code == MSG_STATS:
            m = _STATS_RE.search(text)
            if m:
                self.generated, self.distinct = _int(m.group(1)), _int(m.group(2))
                self._progress(_int(m.group(3)) if m.group(3) else None, self.progress_depth)
        elif code == MSG_DEPTH:
            m = _DEPTH_RE.search(text)
            if m:
                self.depth = int(m.group(1))
        elif code == MSG_SUCCESS:
            self.success = True
        elif code in (MSG_INVARIANT, MSG_INVARIANT_INITIAL):
            self.kind = Outcome.INVARIANT_VIOLATED
            m = _INVARIANT_RE.search(text)
            self.violated = m.group(1) if m else None
            if code == MSG_INVARIANT_INITIAL:
                self.initial_violation_state = text.partition("\n")[2]
        elif code == MSG_TEMPORAL:
            self.kind = Outcome.PROPERTY_VIOLATED
        elif code == MSG_ACTION_PROPERTY:
            # a [][A]_v property (a refinement's step relation): TLC names it
            self.kind = Outcome.PROPERTY_VIOLATED
            m = _ACTION_PROPERTY_RE.search(text)
            self.violated = m.group(1) if m else None
        elif code == MSG_DEADLOCK:
            self.kind = Outcome.DEADLOCK
        elif code in (MSG_TRACE_STATE, MSG_STUTTERING, MSG_BACK_TO_STATE):
            self.trace_msgs.append(item)
        elif code == MSG_PARSE_FAILED:
            self.parse_failed = True

    def trace(self) -> tuple[TraceStep, ...]:
        parser = StateParser()
        steps: list[TraceStep] = []
        if self.initial_violation_state is not None:
            steps.append(TraceStep(1, "Init", parser.parse_state(self.initial_violation_state)))
        for msg in self.trace_msgs:
            head, _, body = msg.text.partition("\n")
            if msg.code == MSG_STUTTERING:
                prev = steps[-1].state if steps else {}
                steps.append(TraceStep(len(steps) + 1, "Stuttering", prev))
                continue
            m = _TRACE_HEAD_RE.match(head.strip())
            if m is None:
                raise TLAParseError(f"unrecognised trace step header from TLC: {head!r}")
            number, back, action = int(m.group(1)), m.group(2), m.group(3)
            if action == "Initial predicate":
                action = "Init"
            if back:
                target = steps[number - 1].state if 0 < number <= len(steps) else {}
                steps.append(TraceStep(len(steps) + 1, action, target, loop_to=number))
            else:
                steps.append(TraceStep(number, action, parser.parse_state(body)))
        return tuple(steps)

    def error_text(self, outcome: Outcome) -> str:
        if outcome is Outcome.PARSE_ERROR:
            lines = [
                ln
                for ln in self.sany_lines
                if not ln.startswith("Parsing file ")
                and not ln.startswith("Semantic processing of module ")
            ]
            text = "\n".join(lines).strip()
            return text or "\n".join(m.text for m in self.messages if m.severity == 1).strip()
        if outcome in (Outcome.ERROR, Outcome.TIMEOUT):
            errs = [
                m.text.strip() for m in self.messages if m.severity in (1, 2) and m.text.strip()
            ]
            outer = {m.text.strip() for m in self.messages}
            # a nested message's text is also inside its parent's: keep the outermost
            kept = [e for e in errs if not any(e != o and e in o for o in outer)]
            return "\n\n".join(kept)
        return ""
