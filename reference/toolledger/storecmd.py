"""``toolledger verify-store``: check a whole SqliteStore file without writing it.

A store operator's command, kept apart from the maintainer's ``toolledger
check`` (``cli.py``): it reads a private copy of the database and its -wal
and checks every SQLite page, every row's checksum and every session
(:func:`toolledger._core.sqlite_verify.verify_file`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure_verify_store(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        help="the SqliteStore file to check; none of its files (database, -wal, -shm) is "
        "written: a private copy of the file and its -wal is checked",
    )
    p.epilog = (
        "exit status: 0 the store passed; 1 it is damaged or not a toolledger store; "
        "2 it was not checked (no such file, it changed while being copied, no space for "
        "the copy)"
    )


def cmd_verify_store(args: argparse.Namespace) -> int:
    from ._core.sqlite_verify import verify_file
    from ._core.stores import StoreCorrupt, StoreError, UnsupportedSchema

    path = Path(args.path)
    if not path.is_file():
        print(f"toolledger verify-store: {path} is not a file: give the path of a store",
              file=sys.stderr)
        return 2
    try:
        report = verify_file(path)
    except (StoreCorrupt, UnsupportedSchema) as e:
        print(f"toolledger verify-store: {e}", file=sys.stderr)
        return 1
    except StoreError as e:
        print(f"toolledger verify-store: {e}", file=sys.stderr)
        return 2
    print(f"{path}: ok ({report.sessions} sessions; every page, row checksum and record "
          "checked, on a private copy: the store's files were only read)")
    for name, size in report.side_files:
        if size:
            print(f"note: {name} ({size} bytes) is present: the last process that wrote the "
                  "store did not close it (killed?) or still has it open. The check included "
                  f"the transactions committed in it; a backup must copy {name} together "
                  f"with {path.name} (see docs/operating.md, Backups).")
    return 0
