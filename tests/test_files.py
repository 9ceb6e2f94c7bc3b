import errno
import os
import stat
import threading

import pytest

from ffnlab._util.files import atomic_folder, atomic_path, check_writable, write_atomic


def test_atomic_path_renames_onto_the_target_only_when_the_block_succeeds(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # nothing is visible before the rename
    assert target.read_bytes() == b"new"
    with pytest.raises(RuntimeError), atomic_path(str(target)) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.bin"]


def test_atomic_path_checks_the_target_first(tmp_path):
    with pytest.raises(ValueError, match="is a folder"), atomic_path(tmp_path):
        pass
    with pytest.raises(ValueError, match="does not exist"), atomic_path(tmp_path / "missing" / "out.json"):
        pass


def test_a_read_only_folder_is_named_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as root (CI containers) chmod would not do
    with pytest.raises(ValueError, match=f"cannot write .*out.json: the folder {tmp_path} is not writable"):
        write_atomic(tmp_path / "out.json", "{}")  # was '[Errno 13] Permission denied: .out.json.PID.tmp'
    assert os.listdir(tmp_path) == []


def test_write_atomic_writes_text_and_bytes(tmp_path):
    assert write_atomic(tmp_path / "a.txt", "héllo") == tmp_path / "a.txt"
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.bin"]


def device_node(path):
    """A character device like /dev/null at `path`; the test is skipped where it cannot be made."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")
    return path


def test_a_device_is_refused_and_stays_a_device(tmp_path):
    node = device_node(tmp_path / "null")
    with pytest.raises(
        ValueError, match=f"cannot write {node}: it is a character device; an output goes to a regular file"
    ):
        write_atomic(node, "a,b\n")  # was renamed over: the device became a 4-byte file
    assert stat.S_ISCHR(os.stat(node).st_mode) and os.listdir(tmp_path) == ["null"]


def test_a_fifo_is_written_through(tmp_path, monkeypatch):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with monkeypatch.context() as m, pytest.raises(ValueError, match=f"cannot write {fifo}: it is not writable"):
        m.setattr(os, "access", lambda path, mode: False)  # as root (CI containers) chmod would not do
        check_writable(fifo)  # now, not when the result is ready
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    write_atomic(fifo, "a,b\n")
    reader.join(timeout=10)
    assert received == ["a,b\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_the_terminal_this_process_runs_in_is_written_through(tmp_path):
    try:
        leader, follower = os.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here ({e})")
    stdin = os.dup(0)
    os.dup2(follower, 0)  # this process now runs in that terminal
    try:
        write_atomic(os.ttyname(follower), "a,b\n")
    finally:
        os.dup2(stdin, 0)
        os.close(stdin)
    assert os.read(leader, 100).replace(b"\r\n", b"\n") == b"a,b\n"
    os.close(leader)
    os.close(follower)


def test_a_symlink_is_written_through_to_its_file(tmp_path):
    (tmp_path / "real.csv").write_text("old")
    (tmp_path / "link.csv").symlink_to(tmp_path / "real.csv")
    write_atomic(tmp_path / "link.csv", "new")
    assert (tmp_path / "link.csv").is_symlink() and (tmp_path / "real.csv").read_text() == "new"


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="needs Linux's /proc")
def test_a_folder_that_takes_no_new_file_is_named_with_the_target():
    with pytest.raises(ValueError, match=r"cannot write /proc/version: no file can be created in /proc"):
        check_writable("/proc/version")  # every permission check passes there; the write named '.version.PID.tmp'


def test_a_full_disk_names_the_target_and_leaves_nothing(tmp_path):
    full = pytest.raises(OSError, match=f"No space left on device: '{tmp_path / 'out.csv'}'")
    with full, atomic_path(tmp_path / "out.csv") as tmp:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")  # as a write on a full disk: no file name
    assert os.listdir(tmp_path) == []


def test_atomic_folder_moves_a_new_folder_into_place_whole(tmp_path):
    out = tmp_path / "a" / "report"
    with pytest.raises(OSError), atomic_folder(out) as tmp:
        (tmp / "figures").mkdir()
        (tmp / "figures" / "loss.png").write_bytes(b"png")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert os.listdir(tmp_path) == []  # neither the folder nor its missing parent
    with atomic_folder(out) as tmp:
        (tmp / "figures").mkdir()
        (tmp / "figures" / "loss.png").write_bytes(b"png")
        (tmp / "page.html").write_text("page")
    assert (out / "figures" / "loss.png").read_bytes() == b"png" and (out / "page.html").read_text() == "page"
    assert os.listdir(tmp_path / "a") == ["report"]


def test_atomic_folder_replaces_files_of_an_existing_folder_and_keeps_the_rest(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "page.html").write_text("old")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OSError, match=f"'{tmp_path / 'page.html'}'"), atomic_folder(tmp_path) as tmp:
        (tmp / "page.html").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "page.html"))
    assert (tmp_path / "page.html").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["figures", "notes.txt", "page.html"]
    with atomic_folder(tmp_path) as tmp:
        (tmp / "figures").mkdir()
        (tmp / "figures" / "loss.png").write_bytes(b"png")
        (tmp / "page.html").write_text("new")
    assert (tmp_path / "page.html").read_text() == "new" and (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["figures", "notes.txt", "page.html"]


def test_atomic_folder_removes_the_temporary_folders_of_processes_that_are_gone(tmp_path):
    """A kill -9 mid-report left .report.<pid>.tmp/ beside the store, and later reports never removed it; now the
    next one removes those whose process is gone, and leaves a running process's, and anything else, alone."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = int(gone.stdout), os.getppid()
    for place in (tmp_path, tmp_path / "report"):  # beside the new folder, and inside the existing one
        for pid in (dead, alive):
            (place / f".report.{pid}.tmp" / "figures").mkdir(parents=True)
        (place / f".report.{dead}.tmp" / "figures" / "loss.png").write_bytes(b"half")
        (place / f".other.{dead}.tmp").mkdir()  # another folder's
        (place / f".report.{dead + 1}x.tmp").mkdir()  # no pid
        with atomic_folder(tmp_path / "report") as tmp:
            (tmp / "page.html").write_text("page")
        left = sorted(os.listdir(place))
        assert f".report.{dead}.tmp" not in left and f".report.{alive}.tmp" in left
        assert f".other.{dead}.tmp" in left and f".report.{dead + 1}x.tmp" in left


def test_an_output_folder_with_a_device_or_fifo_inside_is_refused_before_any_work(tmp_path):
    """The rule for output paths was checked on the folder only: a report renamed its pages and figures over a
    device or a FIFO found inside it."""
    from ffnlab._util.files import check_output_folder

    out = tmp_path / "report"
    (out / "figures").mkdir(parents=True)
    assert check_output_folder(out, "the report") == out and check_output_folder(tmp_path / "new" / "r", "it")
    os.mkfifo(out / "figures" / "val_loss.png")
    with pytest.raises(ValueError, match=r"^cannot write the report to .*report: .*val_loss.png is a FIFO; an output"):
        check_output_folder(out, "the report")
    os.unlink(out / "figures" / "val_loss.png")
    (out / "report.html").symlink_to("/dev/null")
    with pytest.raises(ValueError, match=r"report.html is a character device"):
        check_output_folder(out, "the report")
    with pytest.raises(ValueError, match=r"it is a character device; give a folder"):
        check_output_folder("/dev/null", "the report")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"file is not a writable folder"):
        check_output_folder(tmp_path / "file" / "report", "the report")


def test_atomic_folder_never_renames_over_what_is_not_a_regular_file(tmp_path):
    """A device or FIFO that appeared after the check is refused, not replaced, and the rest stays as it was."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "page.html")
    refused = pytest.raises(ValueError, match="page.html: it is a FIFO; an output folder holds regular files only")
    with refused, atomic_folder(out) as tmp:
        (tmp / "page.html").write_text("new")
    assert stat.S_ISFIFO(os.lstat(out / "page.html").st_mode) and os.listdir(tmp_path) == ["out"]


def test_free_space_is_checked_before_the_work(tmp_path, monkeypatch):
    import shutil

    from ffnlab._util.files import check_free_space

    check_free_space(tmp_path / "new" / "folder", 1, "the weights")
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10 << 20))
    with pytest.raises(ValueError, match=r"the weights to .*folder: it needs about 20 MiB and .* has 10 MiB free"):
        check_free_space(tmp_path / "new" / "folder", 20 << 20, "the weights")
