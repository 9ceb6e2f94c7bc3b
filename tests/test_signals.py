"""SIGTERM and Ctrl-C end a command within seconds, even while library code holds the main thread."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ffnlab._util.signals import stop_within

# minutes in C, no signal check; "held" is printed 0.2 s after the call starts, by a thread: a signal sent at
# "ready" could come before the call, and unwind at once (the first signal test then passes by luck; a second
# signal finds the restored default handler while Python finalises, and kills it with -15)
HELD = (
    "import hashlib, threading; threading.Timer(0.2, print, ('held',), {'flush': True}).start(); "
    "hashlib.pbkdf2_hmac('sha256', b'x', b'y', 2**31 - 1)"
)


def start_held(grace: float) -> subprocess.Popen:
    """`start(HELD)`, once the call holds the main thread."""
    proc = start(HELD, grace)
    assert proc.stdout.readline() == "held\n"
    return proc


PYTHON_LOOP = "while True: pass"


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_child_left():
    """A test that fails before its child ends kills it: a `while True` child would spin for ever."""
    yield
    while STARTED:
        STARTED.pop().kill()


def start(body: str, grace: float = 1.0) -> subprocess.Popen:
    """A Python running `body` under stop_within(grace), once it has said it is ready."""
    code = textwrap.dedent(f"""
        import sys
        from ffnlab._util.signals import stop_within
        with stop_within(grace={grace}):
            try:
                print("ready", flush=True)
                {body}
            finally:
                print("unwound", file=sys.stderr, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(proc)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_signal_while_c_code_holds_the_main_thread_ends_the_process_after_the_grace():
    proc = start_held(grace=1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    err = proc.stderr.read()
    assert "ffnlab: stopped at once (still running 1 s after SIGTERM)" in err and "unwound" not in err


def test_a_second_signal_ends_the_process_at_once():
    proc = start_held(grace=600)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # a second SIGTERM still pending with the first would be one signal
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    assert "stopped at once (a second signal)" in proc.stderr.read()


def test_a_signal_in_python_code_unwinds_as_before():
    """The first signal still unwinds (finally blocks remove temporary files); the watchdog never fires."""
    # an uncaught KeyboardInterrupt ends Python by SIGINT again, so its parent sees it
    for sig, status in ((signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)):
        proc = start(PYTHON_LOOP, grace=5)
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == status
        err = proc.stderr.read()
        assert "unwound" in err and "stopped at once" not in err


def test_the_block_leaves_no_thread_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM), threading.active_count()
    with stop_within():
        assert signal.getsignal(signal.SIGTERM) is not before[0] and threading.active_count() == before[1] + 1
    assert (signal.getsignal(signal.SIGTERM), threading.active_count()) == before
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left set (set_wakeup_fd returns the old one)


def catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM (Linux /proc: the SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(status.split("SigCgt:")[1].split()[0], 16)
    return bool(mask >> (signal.SIGTERM - 1) & 1)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads process state from Linux's /proc")
def test_the_commands_that_read_fifos_and_dev_zero_end_within_10_s_of_sigterm(tmp_path):
    """The findings' FIFO and /dev/zero cases blocked for ever or grew without end, ignoring SIGTERM: each now
    ends (refused, or stopped) within 10 s of a SIGTERM sent once it is running."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    ffnlab = [sys.executable, "-c", "import sys; from ffnlab.cli import main; sys.exit(main())"]
    commands = [
        ["train", "--hf-config", fifo],
        ["advise", "--pretrained", fifo],
        ["export", "--model", zero],
        ["train", "--task", "tokens", "--data", fifo],
        ["train", "--data", zero, "--steps", 2],
    ]
    procs = [subprocess.Popen([*ffnlab, *map(str, argv)], stderr=subprocess.PIPE, text=True) for argv in commands]
    for proc in procs:  # once each runs the command (its SIGTERM handler set), or has already refused its input
        while proc.poll() is None and not catches_sigterm(proc.pid):
            time.sleep(0.05)
    time.sleep(1)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for argv, proc in zip(commands, procs):
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"ffnlab {' '.join(map(str, argv))} still ran 10 s after SIGTERM")
        # refused (2), stopped (143), or ended by the signal itself after the command had returned
        assert code in (2, 128 + signal.SIGTERM, -signal.SIGTERM), (argv, proc.stderr.read())
