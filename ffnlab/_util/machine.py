"""What machine this is: CPU flags, whether bf16 runs in hardware, and the environment a result records."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
from typing import Any

import torch

# ffnlab's own source tree: the revision a run records is this one's, never the working directory's
FFNLAB_ROOT = pathlib.Path(__file__).resolve().parents[2]


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty where it cannot tell)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
        flags = next(line for line in text.splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return frozenset()
    return frozenset(flags.split(":", 1)[-1].split())


def cpu_has_amx() -> bool:
    """True on an x86 CPU with AMX-bf16 tiles."""
    return "amx_bf16" in cpu_flags()


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) below which its bf16 matmuls are emulated whatever the CPU has
ONEDNN_ISAS_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)


def bf16_native(device: str = "cpu") -> bool:
    """Whether bf16 matmuls run in hardware here: a CUDA GPU with bf16, or a CPU with AMX-bf16 or
    AVX512_BF16 that oneDNN is allowed to use (on an AVX2-only CPU, or with ONEDNN_MAX_CPU_ISA=AVX2,
    PyTorch emulates them; benchmarks/README.md has the cost)."""
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ONEDNN_ISAS_WITHOUT_BF16:
        return False
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def machine_memory(device: str) -> int:
    """Bytes of memory a run can use at most: the GPU's, or this machine's physical RAM."""
    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(need: int, device: str, what: str, advice: str) -> None:
    """ValueError, before anything is allocated, when `need` bytes are more than `machine_memory`:
    `what` says which sizes need them, `advice` what to change."""
    have = machine_memory(device)
    if need > have:
        raise ValueError(
            f"{what} need at least {need / 2**30:,.1f} GiB, more than the {have / 2**30:,.1f} GiB here; {advice}"
        )


def check_threads(threads: int) -> int:
    """`threads`; ValueError in one line unless it is between 1 and this machine's logical CPUs (os.cpu_count()).
    More OpenMP threads than CPUs only take turns on them, spinning while they wait for each other, and far more
    (100,000) cannot be started at all: the OpenMP runtime ends the process ("Out of memory")."""
    cpus = os.cpu_count() or 1
    if not 1 <= threads <= cpus:
        raise ValueError(f"threads must be between 1 and {cpus}, the logical CPUs of this machine, got {threads}")
    return threads


def cpu_model() -> str | None:
    """The CPU's model name ('AMD EPYC', 'Intel(R) Xeon(R) ...'), None where it cannot tell."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _git(*args: str) -> str | None:
    """`git ARGS` in ffnlab's own checkout (None if it is not one, or without git, or after 5 s).

    NOTE: never in the cwd: a repository's config can name commands that git runs (core.fsmonitor
    on every status), so reading the user's directory would execute whatever it says. Here too
    fsmonitor and hooks are switched off and no optional locks are taken.
    """
    if not (FFNLAB_ROOT / ".git").exists():
        return None
    cmd = ["git", "--no-optional-locks", "-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}",
           "-C", str(FFNLAB_ROOT), *args]  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version() -> str | None:
    try:
        return importlib.metadata.version("ffnlab")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _environment() -> str:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else None
    git_rev = _git("rev-parse", "HEAD")
    dirty = None if git_rev is None else bool(_git("status", "--porcelain", "--untracked-files=no"))
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": device, "gpu": gpu,
           "cpu": cpu_model(), "isa": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
           "platform": platform.platform(), "ffnlab": _version(), "git_rev": git_rev, "git_dirty": dirty}  # fmt: skip
    return json.dumps(env, sort_keys=True)


def environment() -> dict[str, Any]:
    """Where a result was measured: torch/CUDA versions, device, GPU, CPU model and the ISA torch's
    kernels use, Python, platform, ffnlab's version and git revision.

    git_rev is the commit of ffnlab's own source tree when it runs from a git checkout (None when
    installed from a package, without git, or after a 5 s timeout); git_dirty says whether its
    tracked files differ from it. Never read from the current directory. Computed once per process;
    callers get a copy.
    """
    env: dict[str, Any] = json.loads(_environment())
    return env
