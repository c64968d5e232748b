"""Verifying a SqliteStore file without writing any of the store's files.

Private module of :mod:`toolledger`: ``toolledger verify-store PATH`` runs
:func:`verify_file`, which copies the file and its ``-wal`` and runs
:meth:`~toolledger._core.sqlite_store.SqliteStore.verify` on the copy.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .sqlite_store import SqliteStore
from .stores import StoreCorrupt, StoreError, UnsupportedSchema

__all__ = ["FileCheck", "verify_file"]

_SIDE_FILES: Final = ("-wal", "-journal")  # hold committed (or to-be-undone) pages


@dataclass(frozen=True, slots=True)
class FileCheck:
    """What :func:`verify_file` checked: a store that passed.

    ``sessions``: how many sessions it holds; ``side_files``: the ``-wal`` or
    ``-journal`` files found beside it (name, size in bytes), whose
    transactions the check included.
    """

    path: Path
    sessions: int
    side_files: tuple[tuple[str, int], ...]


def _stats(path: Path) -> dict[str, tuple[int, int, int]]:
    """(inode, size, mtime_ns) of the store file and each of its side files present."""
    found = {}
    for suffix in ("", *_SIDE_FILES, "-shm"):
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(f"{path}{suffix}")
            found[suffix] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return found


def verify_file(path: str | os.PathLike[str]) -> FileCheck:
    """Check the whole store at ``path`` (:meth:`SqliteStore.verify`) without writing its files.

    Opening a store with SQLite is not read-only: if the last writer was
    killed, its ``-wal`` file still holds committed transactions, and the
    first connection folds them into the file and deletes ``-wal`` and
    ``-shm``; even a ``mode=ro`` connection rebuilds the ``-shm`` index, and
    ``immutable=1`` ignores the ``-wal``, i.e. checks a state that lacks the
    last commits.  So the file and its ``-wal`` (or ``-journal``) are
    *copied* into a private temporary directory, byte for byte, and the copy
    is opened and verified: exactly what a restarted engine would see, while
    the store's own files (database, ``-wal``, ``-shm``) are only read.  If
    any of them changed while it was copied (a process is writing the
    store), nothing is checked and :class:`~toolledger._core.stores.StoreError`
    says so.  Raises :class:`~toolledger._core.stores.StoreCorrupt` /
    :class:`~toolledger._core.stores.UnsupportedSchema` for a damaged or foreign
    file, naming ``path`` (never the copy).
    """
    import filecmp
    import shutil
    import tempfile

    original = Path(os.fspath(path))
    if not original.is_file():
        raise StoreError(f"{original} is not a file: give the path of a store's database file")
    before = _stats(original)
    with tempfile.TemporaryDirectory(prefix="toolledger-verify-") as tmp:
        copy = Path(tmp) / "store.db"
        side: list[tuple[str, int]] = []
        try:
            shutil.copyfile(original, copy)
            for suffix in _SIDE_FILES:
                if suffix in before:
                    shutil.copyfile(f"{original}{suffix}", f"{copy}{suffix}")
                    side.append((f"{original.name}{suffix}", before[suffix][1]))
        except OSError as exc:
            raise StoreError(
                f"cannot copy {original} to check it ({exc}); nothing was checked and the "
                "store was not touched: free space in the temporary directory (TMPDIR)"
            ) from exc
        # A write while copying would leave a torn copy.  Compare every copied
        # byte with the store again (a write to a part already copied shows),
        # and which side files exist (the -shm index is not copied: SQLite
        # rebuilds it from the -wal, and readers may rewrite it).
        after = _stats(original)
        moved = sorted(
            f"{original.name}{k}"
            for k in before.keys() | after.keys()
            if k != "-shm"
            and (
                before.get(k) != after.get(k)
                or not filecmp.cmp(f"{original}{k}", f"{copy}{k}", shallow=False)
            )
        )
        if moved:
            raise StoreError(
                f"{original} changed while it was copied to be checked ({', '.join(moved)}): "
                "a process is writing the store. Nothing was checked and nothing was written; "
                "check it again when no engine writes it, or check a backup of it"
            )
        try:
            with SqliteStore(copy) as store:
                store.verify()
                sessions = len(store.sessions())
        except (StoreCorrupt, UnsupportedSchema) as exc:
            exc.path = str(original)
            exc.args = (str(exc).replace(str(copy), str(original)),)
            raise
        except StoreError as exc:
            raise StoreError(str(exc).replace(str(copy), str(original))) from exc
    return FileCheck(original, sessions, tuple(side))
