"""Worker processes of a sweep: what they import, and that they never outlive the sweep."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FFNLAB = Path(sys.executable).parent / "ffnlab"  # the console script, as a user runs it
SMOKE = ["compare", "--preset", "smoke", "--variants", "relu,gelu", "--seeds", "1", "--no-stats", "--quiet"]


def plant_modules(folder: Path, marker: Path) -> None:
    """Module files in `folder` that would write `marker` if any process imported them from there."""
    payload = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("random.py", "json.py", "torch.py", "multiprocessing/__init__.py", "ffnlab/__init__.py"):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(payload)


@pytest.mark.slow
def test_compare_with_worker_processes_imports_nothing_from_the_working_directory(tmp_path):
    """Spawned workers and the resource tracker start as `python -c`, which puts the working directory first on
    sys.path: a `multiprocessing/__init__.py` there ran in each of them (3 times for --jobs 2)."""
    marker = tmp_path / "imported.txt"
    plant_modules(tmp_path, marker)
    argv = [FFNLAB, *SMOKE, "--steps", 4, "--jobs", 2, "--store", tmp_path / "runs" / "s.db", "--no-report"]
    (tmp_path / "runs").mkdir()
    done = subprocess.run(list(map(str, argv)), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), marker.read_text()


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from Linux's /proc")
def test_kill_9_while_workers_start_leaves_no_worker_or_tracker_behind(tmp_path):
    """A sweep killed while its workers were still importing (before they asked to die with it) left them and
    the resource tracker waiting on a pipe for ever, and the tracker then warned of leaked semaphores."""
    argv = [FFNLAB, *SMOKE, "--steps", 2000, "--jobs", 2, "--store", tmp_path / "s.db", "--no-report"]
    proc = subprocess.Popen(list(map(str, argv)), cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while len(started := children(proc.pid)) < 3:  # the resource tracker and both workers, still starting
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30
    while left := [pid for pid in started if alive(pid)]:
        if time.time() > deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"{len(left)} of the sweep's child processes outlived it")
        time.sleep(0.1)
    assert "leaked semaphore" not in proc.stderr.read()  # the tracker removes them; its warning was noise


def test_a_workers_ffnlab_warnings_are_one_line_as_the_clis_are():
    """A sweep's worker warned in Python's two-line format (file:line, then the source line)."""
    code = (
        "import os, warnings\n"
        "from ffnlab.run.checkpoint import CheckpointWarning\n"
        "from ffnlab.study.execute import start_worker\n"
        "start_worker(os.getppid())\n"
        "warnings.warn('discarding the unreadable checkpoint in ck', CheckpointWarning)\n"
        "warnings.warn('a library warns', UserWarning)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = done.stderr.splitlines()
    assert done.returncode == 0 and lines[0] == "ffnlab: warning: discarding the unreadable checkpoint in ck"
    assert "UserWarning: a library warns" in lines[1]  # another library's keeps Python's format
