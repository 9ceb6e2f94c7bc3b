"""Where and in what precision a run trains: the device and precision `auto` resolves to, whether fp16
autocast exists there, and whether the built-in model fits this machine's memory at all."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import platform
import sys
import warnings
from pathlib import Path

import torch

from ffnlab._util.machine import bf16_native, check_memory, cpu_flags
from ffnlab.core.model import ModelConfig, model_param_count
from ffnlab.run.config import PRECISIONS, Precision, TrainConfig


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' where CUDA is available, else 'cpu'; ValueError for 'cuda' without CUDA."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available; valid here: cpu, auto")
    return device


@functools.cache
def fp16_autocast(device: str) -> bool:
    """Whether torch autocasts to float16 on `device` ('cpu' or 'cuda'): a matmul under
    torch.autocast(device, float16) comes out fp16 (where it cannot, torch warns and leaves autocast off)."""
    if device == "cuda" and not torch.cuda.is_available():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device, dtype=torch.float16):
                out = torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)
    except (RuntimeError, ValueError):
        return False
    return out.dtype == torch.float16


def resolve_precision(precision: Precision, device: str) -> Precision:
    """'auto' -> 'bf16' where bf16 matmuls are native (`bf16_native`: a CUDA GPU with bf16, a CPU with
    AMX or AVX512_BF16), else 'fp32'. A 'cuda' or 'auto' device on a machine without CUDA stays
    'auto': the machine that runs it decides. 'fp16' stays 'fp16' where torch has fp16 autocast for
    the device (`fp16_autocast`); ValueError naming the valid precisions where it has not.

    Measured speed and loss per machine class: benchmarks/README.md, "Precision auto".
    """
    if precision == "fp16":
        here = "cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"  # where it would run here
        decided_elsewhere = device == "cuda" and here == "cpu"  # as for 'auto': the machine that runs it
        if not decided_elsewhere and not fp16_autocast(here):
            valid = ", ".join(p for p in PRECISIONS if p != "fp16")
            raise ValueError(
                f"precision 'fp16' needs fp16 autocast, which torch {torch.__version__} lacks on {here}; valid here: {valid}"
            )
    if precision != "auto":
        return precision
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return "bf16" if bf16_native("cpu") else "fp32"
    if not torch.cuda.is_available():
        return "auto"
    return "bf16" if bf16_native("cuda") else "fp32"


def check_fits(cfg: TrainConfig, mcfg: ModelConfig, device: str) -> None:
    """ValueError, before anything is allocated, when the built-in model cannot train on this machine:
    sizes that overflow, or more memory than it has for fp32 weights, gradients and AdamW's two
    moments (16 bytes a parameter) plus a floor on the activations backward keeps (ten fp32
    (batch, context, d_model) tensors a layer; with 'block' checkpointing one a layer, and ten of the
    layer that runs again)."""
    n_params = model_param_count(mcfg)  # by arithmetic: a deep model is not built layer by layer to be refused
    activation = 4 * cfg.batch_size * mcfg.context * mcfg.d_model  # one fp32 (batch, context, d_model) tensor
    kept = mcfg.n_layers + 10 if mcfg.activation_checkpointing == "block" else 10 * mcfg.n_layers
    need = 16 * n_params + kept * activation
    check_memory(
        need,
        device,
        f"{mcfg.n_layers} layers of d_model {mcfg.d_model} ({n_params:,} parameters) at batch "
        f"{cfg.batch_size} x context {mcfg.context}",
        "use a smaller --d-model, --layers or --batch-size",
    )


# glibc's mallopt parameters (malloc.h), and the values `hold_freed_heap` gives them
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_KEPT = 1 << 30  # freed bytes at the heap's top that glibc keeps instead of giving back
MMAP_FROM = 32 << 20  # blocks from this size on are mapped on their own (glibc's largest automatic threshold)
# the user's own settings of them (and of the two that, set, also stop the thresholds moving), which win
HEAP_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
HEAP_TUNABLES = ("trim_threshold", "mmap_threshold", "top_pad", "mmap_max")


def hold_freed_heap() -> bool:
    """Keep the memory a training step frees in the process's heap (glibc: at most 1 GiB), for the next step.

    glibc gives the top of its heap back to the OS once more than a threshold is free there, and the threshold
    moves with the sizes allocated. On the AMX Xeon about one fresh process in five of nanoGPT's recipe with
    `--compile` gave back and faulted in again ~14 MB every step (3,500 page faults a step), which made its step
    30% slower (benchmarks/README.md, issue #26). Fixing both thresholds stops it: blocks under 32 MiB come from
    the heap, as glibc's own moving threshold lets them at most, and up to 1 GiB freed stays there. True when set;
    False off glibc, or where the user set glibc's thresholds (HEAP_ENV, or HEAP_TUNABLES in GLIBC_TUNABLES),
    which are left as they are.
    """
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(k in os.environ for k in HEAP_ENV) or any(f"glibc.malloc.{t}" in tunables for t in HEAP_TUNABLES):
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # NOTE: setting one threshold also stops glibc moving the other: both are set, the mmap one first
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_FROM)) and bool(mallopt(M_TRIM_THRESHOLD, HEAP_KEPT))


def skip_known_vec_isa_probes() -> None:
    """Let torch.compile skip the vector-ISA probes that already passed on this machine.

    In every process, Inductor dry-compiles a kernel for each vector ISA the CPU offers and loads each build
    in a child Python: ten children, about 1 s of a `--compile` run's start on the AMX Xeon. Once they have
    all passed here (the same torch, C++ compiler and CPU flags: a marker file in Inductor's cache folder),
    later processes set Inductor's `cpp.vec_isa_ok`, which skips the base probes (the bf16, VNNI and AMX
    ones still run). The first process sets it too, after its probes, so that all compile alike and share
    Inductor's caches. Where a probe failed, or TORCHINDUCTOR_VEC_ISA_OK decides, nothing changes."""
    try:
        from torch._inductor import config
        from torch._inductor import cpu_vec_isa as isa
        from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # another torch's layout: it probes as before
        return
    if config.cpp.vec_isa_ok is not None or platform.machine() not in ("x86_64", "AMD64"):
        return
    try:
        compiler = get_cpp_compiler()
        setup = [torch.__version__, torch.__file__, compiler, get_compiler_version_info(compiler), sorted(cpu_flags())]
        marker = Path(cache_dir()) / f"ffnlab-vec-isa-{hashlib.sha256(json.dumps(setup).encode()).hexdigest()[:16]}"
        known = marker.exists()
    except (RuntimeError, OSError):  # no C++ compiler (torch.compile says so at the first step), no cache folder
        return
    if not known:
        offered = isa.x86_isa_checker()  # the ISAs the CPU says it has, and which of them the probes pass:
        candidates = [str(i) for i in isa.supported_vec_isa_list if all(f in offered for f in str(i).split())]
        if not candidates or [str(i) for i in isa.valid_vec_isa_list()] != candidates:
            return
        with contextlib.suppress(OSError):  # unwritten, the next process probes again
            marker.touch()
    config.cpp.vec_isa_ok = True
