"""Reading the user's files so that no read blocks or grows without bound: one helper for every input.

The rule for an input path: it must be a regular file, or a symlink to one. A FIFO may block for ever,
a device (/dev/zero, /dev/urandom) never ends, a socket is no file: each is refused by its kind before
it is opened, in one line that names the path and what ffnlab read it as. A file is read in chunks
(a signal handler runs between them, so Ctrl-C and SIGTERM stop a long read) up to a size limit that
fits its kind; a larger one is refused, not read. Data files, which may be gigabytes, take no limit
but the kind rule.
"""

from __future__ import annotations

import codecs
import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path

MiB = 1 << 20
# size limits by kind: far above any real file of the kind, far below what exhausts memory
JSON_LIMIT = 64 * MiB  # config.json, latest.json, deploy.json, protocol.json, a TOML config
TOKENIZER_LIMIT = 512 * MiB  # tokenizer.json: the largest public vocabularies are ~20 MB
CHUNK = 4 * MiB

KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (a named pipe), which may block for ever",
    stat.S_IFCHR: "a character device, which may never end",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def kind_problem(path: str | os.PathLike[str]) -> str | None:
    """What keeps `path` from being read as a file ("is a FIFO ..."), judged from its kind without opening
    it (opening a device can act); None for a regular file or a symlink to one. FileNotFoundError where
    nothing is there; a dangling symlink is a problem of its own, not a missing file."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        raise FileNotFoundError(f"{path} does not exist") from None
    except OSError as e:  # a link loop, a name too long, a component that is a file
        return f"cannot be read ({e.strerror})"
    if stat.S_ISREG(st.st_mode):
        return None
    link = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return f"is {KINDS.get(stat.S_IFMT(st.st_mode), 'not a regular file')}{link}"


def check_readable(path: str | os.PathLike[str], what: str, limit: int | None = None) -> Path:
    """`path` as a Path; ValueError in one line ("the config file x.json is a FIFO ...; give a regular
    file") unless it is a regular file or a link to one, of at most `limit` bytes where one is given (for a
    file that a library opens itself). `what` names what it was read as."""
    path = Path(path)
    problem = kind_problem(path)
    if problem is not None:
        raise ValueError(f"{what} {path} {problem}; give a regular file")
    if limit is not None and path.stat().st_size > limit:
        raise too_large(path, what, limit)
    return path


def too_large(path: Path, what: str, limit: int) -> ValueError:
    """The error for a file of more than `limit` bytes."""
    return ValueError(f"{what} {path} is larger than {limit // MiB} MiB, more than such a file holds")


def read_chunks(path: str | os.PathLike[str], what: str, limit: int | None = None) -> Iterator[bytes]:
    """The content of the regular file `path` (`check_readable`) in chunks of at most CHUNK bytes, for a file
    read as it streams (a corpus of gigabytes); ValueError naming it when it holds more than `limit` bytes (it
    is not read past the limit; None: no limit, for data) or a read fails (an I/O error, a permission)."""
    path = check_readable(path, what)
    try:
        # NOTE: O_NONBLOCK so that a path swapped for a FIFO after the check cannot block the open; fstat
        # then judges the file actually opened
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb", buffering=0) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{what} {path} is not a regular file; give a regular file")
            size = 0
            while chunk := f.read(CHUNK if limit is None else min(CHUNK, limit + 1 - size)):
                size += len(chunk)
                if limit is not None and size > limit:
                    raise too_large(path, what, limit)
                yield chunk
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be read ({e.strerror or e})") from None


def read_bytes(path: str | os.PathLike[str], what: str, limit: int | None) -> bytes:
    """The content of the regular file `path` (`read_chunks`, whose errors it raises), whole."""
    return b"".join(read_chunks(path, what, limit))


def text_chunks(path: str | os.PathLike[str], what: str) -> Iterator[str]:
    """The UTF-8 text of the data file `path` as it streams (`read_chunks`, no size limit), a chunk at a time;
    ValueError naming the file and the offset of the first byte that is not UTF-8, as `read_text` does."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # of the next chunk's first byte in the file
    for chunk in itertools.chain(read_chunks(path, what), [b""]):  # b"": the end, where a cut character fails
        pending = len(decoder.getstate()[0])  # bytes of a character the previous chunk cut
        try:
            text = decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as e:
            at = offset - pending + e.start
            raise ValueError(f"{what} {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at {at})") from None
        offset += len(chunk)
        if text:
            yield text


def read_text(path: str | os.PathLike[str], what: str, limit: int | None = JSON_LIMIT) -> str:
    """`read_bytes` decoded as UTF-8; ValueError naming the file where it is not UTF-8."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {data[e.start]:#04x} at {e.start})") from None
