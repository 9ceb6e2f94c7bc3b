"""SIGTERM and Ctrl-C end a command within seconds, even while library code holds the main thread."""

import signal
import subprocess
import sys
import textwrap
import threading
import time

from ffnlab._util.signals import stop_within

HELD = "import hashlib; hashlib.pbkdf2_hmac('sha256', b'x', b'y', 2**31 - 1)"  # minutes in C, no signal check
PYTHON_LOOP = "while True: pass"


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
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_signal_while_c_code_holds_the_main_thread_ends_the_process_after_the_grace():
    proc = start(HELD)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    err = proc.stderr.read()
    assert "ffnlab: stopped at once (still running 1 s after SIGTERM)" in err and "unwound" not in err


def test_a_second_signal_ends_the_process_at_once():
    proc = start(HELD, grace=600)
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
