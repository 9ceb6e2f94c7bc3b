"""Child Python processes ffnlab starts (a sweep's workers, a run's ranks): what they import, and that they
never outlive the process that started them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def safe_child_pythons() -> Iterator[None]:
    """Child Pythons started in the block (spawned workers, multiprocessing's resource tracker, a local Ray's
    workers, torchrun's ranks) import nothing from the working directory. NOTE: a child started as `python -c`
    has the working directory first on sys.path, so a `random.py` or `multiprocessing/` lying there would run in
    every worker; PYTHONSAFEPATH (Python 3.11's -P) leaves it out. The resource tracker's warning of the
    semaphores a killed sweep leaves (it removes them itself) is kept off the user's terminal too."""
    saved = {name: os.environ.get(name) for name in ("PYTHONSAFEPATH", "PYTHONWARNINGS")}
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [saved["PYTHONWARNINGS"], TRACKER_WARNING]))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


TRACKER_WARNING = "ignore:resource_tracker:UserWarning"  # "resource_tracker: There appear to be 2 leaked ..."


def die_with_parent(parent: int) -> None:
    """Linux SIGKILLs this process when its parent (pid `parent`) dies (prctl PR_SET_PDEATHSIG; elsewhere a
    no-op). NOTE: a parent killed while this process was starting (importing torch takes a second) is gone
    before the request, so the process exits now rather than wait for work that never comes."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
