"""``make notebooks-html``: the committed notebooks as HTML for reviewers who do not run Jupyter.

Each notebook is rendered as it was executed and committed (nothing is re-run), with the
code cells' inputs left out: a reviewer reads the text, the tables and the figures, and
every number in them was computed and asserted when the notebook ran (``make test``
re-executes them). A rendering that would publish a machine path (a temp directory in a
tool's output, a file outside the repository) is refused: the path is named and nothing
is written for that notebook.

Usage: ``python -m toolledger.notebook.html [--out DIR] NOTEBOOK.ipynb ...``
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

DEFAULT_OUT: Final = Path("build") / "notebooks-html"

#: An absolute path on a Unix machine, as it would leak from a temp dir or a home dir.
#: Preceded by a character that cannot precede a path (so ``https://x/tmp/`` and
#: ``a/tmp/b`` are not matches).
ABSOLUTE_PATH: Final = re.compile(
    r"(?<![\w.:/~-])(?:file://)?/(?:work|tmp|home|root|usr|var|opt|etc|mnt|srv|private|Users)"
    r"/[^\s\"'<>)]*"
)

#: Markers of a code cell's input in nbconvert's lab and classic templates.
INPUT_MARKERS: Final = ('class="jp-InputArea-editor', 'class="jp-CodeMirrorEditor',
                        'class="input_area', 'class="highlight hl-')


class RenderError(ValueError):
    """A notebook could not be rendered, or its rendering would leak a machine path."""


def absolute_paths(text: str) -> list[str]:
    """Every absolute machine path in ``text``, in order of appearance, without repeats."""
    return list(dict.fromkeys(m.group(0) for m in ABSOLUTE_PATH.finditer(text)))


def has_input_cells(html_text: str) -> bool:
    """Whether an nbconvert HTML page shows any code cell's input."""
    return any(marker in html_text for marker in INPUT_MARKERS)


def render(notebook: Path, *, no_input: bool = True) -> str:
    """The HTML page of ``notebook`` (nbconvert's lab template; inputs left out by default)."""
    import nbformat  # dev extra: the package itself stays stdlib-only
    from nbconvert import HTMLExporter

    try:
        node = nbformat.read(notebook, as_version=4)
    except (OSError, ValueError) as exc:
        raise RenderError(f"{notebook}: cannot read it as a notebook: {exc}") from exc
    # nbconvert ships py.typed but leaves its constructors unannotated.
    exporter = HTMLExporter(  # type: ignore[no-untyped-call]
        exclude_input=no_input, exclude_input_prompt=no_input, exclude_output_prompt=no_input)
    body: str
    body, _resources = exporter.from_notebook_node(node)
    return body


def write_html(notebooks: Sequence[Path], out_dir: Path) -> list[Path]:
    """Render every notebook into ``out_dir/<stem>.html``; refuse any that names a machine path.

    All notebooks are rendered and checked before any file is written, so a refusal leaves
    no partial set behind.
    """
    pages: list[tuple[Path, str]] = []
    for nb in notebooks:
        page = render(nb)
        leaked = absolute_paths(page)
        if leaked:
            raise RenderError(
                f"{nb}: the rendering would publish machine paths {leaked[:3]}; remove them "
                "from the notebook's cells and outputs (print paths relative to the "
                "repository) and re-execute it")
        if has_input_cells(page):
            raise RenderError(f"{nb}: code inputs are still in the no-input rendering")
        pages.append((out_dir / f"{nb.stem}.html", page))
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, page in pages:
        path.write_text(page, encoding="utf-8")
    return [path for path, _ in pages]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolledger.notebook.html",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebooks to render")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output directory (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    missing = [str(nb) for nb in args.notebooks if not nb.is_file()]
    if missing:
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        written = write_html(args.notebooks, args.out)
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
