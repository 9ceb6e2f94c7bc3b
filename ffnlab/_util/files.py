"""Writing files so that nothing is ever half-written: one helper for every output ffnlab writes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def check_writable(path: str | os.PathLike) -> Path:
    """`path` as a Path; ValueError in one line when it names a folder or its folder is missing or
    read-only (checked before the work whose result it will hold, not after)."""
    path = Path(path)
    folder = path.absolute().parent
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give a file name")
    if not folder.is_dir():
        raise ValueError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {path}: the folder {folder} is not writable")
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path of this process beside `path` to write to; renamed onto `path` when the block
    ends, deleted when it raises. Readers and concurrent writers only ever see whole files, and a
    failure (a full disk, a kill) leaves no temporary file behind but for a kill -9 mid-write.

        with atomic_path(out) as tmp:
            torch.save(state, tmp)
    """
    path = check_writable(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, content: bytes | str) -> Path:
    """Write `content` to `path` through `atomic_path`: never half-written."""
    with atomic_path(path) as tmp:
        if isinstance(content, str):
            tmp.write_text(content, encoding="utf-8")
        else:
            tmp.write_bytes(content)
    return Path(path)
