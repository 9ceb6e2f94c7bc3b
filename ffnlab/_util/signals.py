"""Stopping on SIGTERM and Ctrl-C within seconds, even while library code holds the main thread.

Python runs a signal handler in the main thread between two bytecodes, so a signal that arrives while a
C extension works (a tokenizer's trainer, a long tensor op, a blocking read) waits until that call returns:
minutes, or never. `stop_within` arms a watchdog thread that hears each signal at once (through
`signal.set_wakeup_fd`, written by the C-level handler): the first SIGTERM or SIGINT unwinds the command as
before (`finally` blocks remove temporary files), and if the process is still there `grace` seconds later,
or a second signal comes, it exits at once. Finished work is never lost that way: every result is written
whole before it is recorded (ffnlab._util.files), and a run resumes from its checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACE_S = 5.0  # the unwinding a first signal starts; a scheduler's `kill` waits ~10 s before SIGKILL


def exit_on_term(signum: int, frame: object) -> None:
    """SIGTERM (a scheduler's stop, `kill`) unwinds like Ctrl-C, with the shell's exit status for it."""
    sys.exit(128 + signum)


@contextlib.contextmanager
def stop_within(grace: float = GRACE_S) -> Iterator[None]:
    """SIGTERM raises SystemExit(143) and Ctrl-C KeyboardInterrupt in the main thread, as Python's own
    handlers do; a watchdog ends the process (status 128 + the signal) when that has not happened within
    `grace` seconds of the first, or at a second signal. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, exit_on_term)
    receiver, sender = socket.socketpair()
    sender.setblocking(False)
    old_fd = signal.set_wakeup_fd(sender.fileno(), warn_on_full_buffer=False)
    heard = threading.Event()
    watchdog = threading.Thread(target=watch, args=(receiver, grace, heard), name="ffnlab-stop", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, previous)
        if not heard.is_set():  # a stopping process keeps its watchdog until the interpreter has exited
            sender.close()
            watchdog.join()
            receiver.close()


def watch(receiver: socket.socket, grace: float, heard: threading.Event) -> None:
    """The watchdog: waits for signal numbers on `receiver`; after the first stop signal, exits the
    process if it is still there `grace` seconds later or at the next one. Returns when `receiver` closes."""
    stops: list[int] = []
    while len(stops) < 2:
        receiver.settimeout(grace if stops else None)
        try:
            data = receiver.recv(64)
        except TimeoutError:
            break
        except OSError:
            return
        if data == b"":
            return  # the command finished: `stop_within` closed the other end
        stops += [s for s in data if s in STOP_SIGNALS]
        if stops:
            heard.set()
    why = "a second signal" if len(stops) > 1 else f"still running {grace:g} s after {signal.Signals(stops[0]).name}"
    print(f"ffnlab: stopped at once ({why})", file=sys.stderr, flush=True)
    os._exit(128 + stops[0])
