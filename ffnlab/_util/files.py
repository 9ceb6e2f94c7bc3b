"""Writing files so that nothing is ever half-written: one helper for every output ffnlab writes.

The rule for an output path: a new or regular file is written whole to a temporary file beside it,
which is then renamed onto it (onto the file a symlink points to, not onto the link). An existing FIFO,
or the terminal this process runs in (`--csv /dev/stdout`), is written into once the content is whole.
Any other existing path that is not a regular file (a folder, a device such as /dev/null, a socket) is
refused before any work, so a rename never replaces it. A folder of outputs (the report) is written
whole in a temporary folder and moved into place (`atomic_folder`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

MiB = 1 << 20
KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _stat(path: Path) -> os.stat_result | None:
    """os.stat(path), following links; None when nothing is there."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:  # a symlink loop, a name too long
        raise ValueError(f"cannot write {path}: {e.strerror}") from None


def _kind(st: os.stat_result) -> str:
    """What a file that is not a regular one is, in words ("a FIFO", "a character device")."""
    return "a FIFO" if stat.S_ISFIFO(st.st_mode) else KINDS.get(stat.S_IFMT(st.st_mode), "a special file")


def _is_own_terminal(st: os.stat_result) -> bool:
    """Whether the character device `st` is the terminal of this process's stdin, stdout or stderr.
    NOTE: judged without opening the device: opening an unknown one can act (a watchdog starts its timer)."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd) and os.fstat(fd).st_rdev == st.st_rdev:
                return True
    return False


def writes_through(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is an existing FIFO or this process's terminal, which an output is written into
    directly rather than replaced."""
    st = _stat(Path(path))
    return st is not None and (stat.S_ISFIFO(st.st_mode) or (stat.S_ISCHR(st.st_mode) and _is_own_terminal(st)))


def check_writable(path: str | os.PathLike[str]) -> Path:
    """`path` as a Path; ValueError in one line naming it unless an output can be written there by the
    module's rule (checked before the work whose result it will hold, not after): it must not be a
    folder, a device or another non-regular file unless it writes through, and a file must be creatable
    in its folder (tried, not guessed: /proc passes every permission check yet takes no new file)."""
    path = Path(path)
    st = _stat(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} is a folder; give a file name")
    if writes_through(path):
        if not os.access(path, os.W_OK):
            raise ValueError(f"cannot write {path}: it is not writable")
        return path
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"cannot write {path}: it is {_kind(st)}; an output goes to a regular file, a FIFO or this terminal"
        )
    folder = Path(os.path.realpath(path)).parent
    if not folder.is_dir():
        raise ValueError(f"cannot write {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {path}: the folder {folder} is not writable")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ffnlab-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"cannot write {path}: no file can be created in {folder} ({e.strerror})") from None
    return path


def _name_target(e: OSError, tmp: Path, target: Path) -> None:
    """Make `e` name `target` where it named `tmp` (or a file in it) or no file: an error names what the
    user asked for, never a temporary name (a full disk raises without a file name)."""
    name = str(tmp) if e.filename is None else str(e.filename)
    if e.errno is not None and (name == str(tmp) or name.startswith(str(tmp) + os.sep)):
        e.filename = str(target) + name[len(str(tmp)) :]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path of this process to write `path`'s content to; when the block ends it is renamed
    onto `path` (or copied into it where `path` writes through), and it is deleted when the block raises.
    Readers and concurrent writers only ever see whole files, and a failure (a full disk, a kill) leaves
    no temporary file behind but for a kill -9 mid-write. An OSError names `path`, not the temporary file.

        with atomic_path(out) as tmp:
            torch.save(state, tmp)
    """
    path = check_writable(path)
    through = writes_through(path)
    target = Path(os.path.realpath(path))
    if through:  # the temporary file cannot live beside /dev/pts/0
        fd, name = tempfile.mkstemp(prefix="ffnlab-", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
    else:
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if through:
            with open(tmp, "rb") as source, open(path, "wb") as sink:
                shutil.copyfileobj(source, sink)
        else:
            os.replace(tmp, target)
    except OSError as e:
        _name_target(e, tmp, path)
        raise
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike[str], content: bytes | str) -> Path:
    """Write `content` to `path` through `atomic_path`: never half-written."""
    with atomic_path(path) as tmp:
        if isinstance(content, str):
            tmp.write_text(content, encoding="utf-8")
        else:
            tmp.write_bytes(content)
    return Path(path)


def check_output_folder(folder: str | os.PathLike[str], what: str) -> Path:
    """`folder` as a Path; ValueError in one line naming it unless a folder of outputs (`what`: "the report")
    can be written there by `atomic_folder`, checked before the work whose results it will hold: a new folder
    whose nearest existing parent is a writable folder, or an existing writable folder in which nothing (at
    any depth) is a device, FIFO or socket, which a file written there would replace or block on."""
    folder = Path(folder)
    existing = folder.absolute()
    while not os.path.lexists(existing):
        existing = existing.parent
    if existing != folder.absolute() and (not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK)):
        raise ValueError(f"cannot write {what} to {folder}: {existing} is not a writable folder")
    if existing == folder.absolute():
        st = _stat(folder)
        if st is None or not stat.S_ISDIR(st.st_mode):
            kind = "a link to nothing" if st is None else "a file" if stat.S_ISREG(st.st_mode) else _kind(st)
            raise ValueError(f"cannot write {what} to {folder}: it is {kind}; give a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"cannot write {what} to {folder}: the folder is not writable")
        for root, dirs, names in os.walk(folder):
            for name in [*dirs, *names]:
                st = _stat(Path(root, name))
                if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                    raise ValueError(
                        f"cannot write {what} to {folder}: {Path(root, name)} is {_kind(st)}; "
                        "an output folder holds regular files only"
                    )
    return folder


def check_free_space(path: str | os.PathLike[str], needed: int, what: str) -> None:
    """ValueError in one line unless the file system `path` will be written on (that of its nearest existing
    folder) has `needed` bytes free: checked before the work whose result needs them, not after."""
    home = Path(path).absolute()
    while not home.is_dir():
        home = home.parent
    free = shutil.disk_usage(home).free
    if free < needed:
        raise ValueError(
            f"cannot write {what} to {path}: it needs about {needed / MiB:,.0f} MiB and {home} has "
            f"{free / MiB:,.0f} MiB free"
        )


@contextlib.contextmanager
def atomic_folder(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary folder of this process to write `folder`'s files into, moved into place when the block
    ends and deleted when it raises, so a failure (a full disk) leaves `folder` as it was. A new `folder`
    is the temporary one renamed (its missing parents made only then); into an existing one each file is
    renamed onto its place, files of subfolders before those beside them (a page after its figures), and
    other files there stay. An OSError names the file in `folder`, not in the temporary folder."""
    folder = Path(folder).absolute()
    # the nearest existing folder (`folder` or the one its parent would be made in): writable (check it first) and
    # on `folder`'s file system; a temporary folder that a kill -9 left is in one of the two
    home, *beside = [place for place in (folder, *folder.parents) if place.is_dir()][:2]
    for place in (home, *beside):
        _remove_stale(place, folder.name)
    tmp = home / f".{folder.name}.{os.getpid()}.tmp"
    try:
        tmp.mkdir()
        yield tmp
        if not folder.exists():
            folder.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, folder)
        else:
            for root, _, names in os.walk(tmp, topdown=False):  # bottom-up: subfolders first
                for name in names:
                    source = Path(root, name)
                    dest = folder / source.relative_to(tmp)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    st = _stat(dest)
                    if st is not None and not stat.S_ISREG(st.st_mode):  # a rename would replace a device
                        raise ValueError(
                            f"cannot write {dest}: it is {_kind(st)}; an output folder holds regular files only"
                        )
                    os.replace(source, dest)
    except OSError as e:
        _name_target(e, tmp, folder)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale(place: Path, name: str) -> None:
    """The temporary folders `atomic_folder` made in `place` for a folder `name` whose process is gone (a kill -9
    ended it before it could remove them): never one whose process still runs, which may be writing it."""
    prefix = f".{name}."
    try:
        entries = list(place.iterdir())
    except OSError:  # a folder that can be written but not listed: nothing is tidied
        return
    for entry in entries:
        pid = entry.name.removeprefix(prefix).removesuffix(".tmp")
        ours = entry.name == f"{prefix}{pid}.tmp" and pid.isdigit()
        if ours and _gone(int(pid)) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def _gone(pid: int) -> bool:
    """Whether no process `pid` runs: a signal 0 finds none."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # another user's process (PermissionError), or no pid a system has
        return False
    return False
