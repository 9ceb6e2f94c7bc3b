"""Writing files so that nothing is ever half-written: one helper for every output ffnlab writes."""

from __future__ import annotations

import os
from pathlib import Path


def check_writable(path: str | os.PathLike) -> Path:
    """`path` as a Path; ValueError in one line when it names a folder or its folder is missing."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give a file name")
    if not path.absolute().parent.is_dir():
        raise ValueError(f"cannot write {path}: the folder {path.absolute().parent} does not exist")
    return path


def write_atomic(path: str | os.PathLike, content: bytes | str) -> Path:
    """Write through a temporary file of this process beside `path`, then rename: readers and
    concurrent writers only ever see whole files, and a failure (a full disk, a kill) leaves no
    temporary file behind but for a kill -9 mid-write."""
    path = check_writable(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(content, str):
            tmp.write_text(content, encoding="utf-8")
        else:
            tmp.write_bytes(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
