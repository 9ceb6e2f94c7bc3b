"""How a command's failure reaches the user: a mistake of theirs (a name, a size, a path, a store) as one line
naming the problem, ffnlab's own bug as one line and its trace in a file. ffnlab.cli exits 2 on the first, 1 on the
second.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys

from ffnlab._util.text import shorten
from ffnlab.flags import UsageError

# failures that come from what the user asked for (a name, a size, a path, a store): one line, exit 2
USER_ERRORS = (
    UsageError,
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    UnicodeDecodeError,
    MemoryError,
    OverflowError,
    sqlite3.Error,
)
# a disk that takes no more: the user's to fix, not a bug (the OSError names the file: ffnlab._util.files)
DISK_ERRORS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
}
PATH_ERRORS = {  # a path the user gave that the file system cannot take: what is wrong, what to do
    errno.ENAMETOOLONG: ("file name too long", "use a shorter path"),
    errno.ELOOP: ("too many levels of symbolic links", "a link on the path points back into it"),
}


def user_error(e: Exception) -> str | None:
    """The one line a user error ends with; None when `e` is ffnlab's own bug."""
    if isinstance(e, OSError) and e.errno in DISK_ERRORS:
        return DISK_ERRORS[e.errno] + (f" writing {e.filename}" if e.filename else "")
    if isinstance(e, OSError) and e.errno in PATH_ERRORS:
        what, hint = PATH_ERRORS[e.errno]
        return f"{what}{f': {shorten(e.filename, 120)}' if e.filename else ''}; {hint}"
    if not isinstance(e, USER_ERRORS):
        return None
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, sqlite3.Error):
        return f"the run store cannot be used ({type(e).__name__}: {message}); check --store"
    if isinstance(e, (MemoryError, OverflowError)):
        return f"the requested sizes do not fit ({type(e).__name__}{': ' + message if str(e) else ''})"
    return message


def internal_error(e: Exception) -> int:
    """A bug: one line, and the trace where it can be read and reported; exit status 1."""
    import tempfile
    import traceback

    fd, trace = tempfile.mkstemp(prefix="ffnlab-error-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exception(e, file=f)
    first = str(e).splitlines()[0] if str(e) else ""
    print(
        f"ffnlab: internal error: {type(e).__name__}{': ' + first if first else ''} (full trace in {trace})",
        file=sys.stderr,
    )
    return 1
