"""Pinning worker processes to GPUs, decided on the CPU side.

A process sees the GPUs listed in ``CUDA_VISIBLE_DEVICES``; pinning narrows
that list to one physical GPU before the process creates its CUDA context.
Nothing here creates a CUDA context, so the parent of a pool of workers (the
fuzz runner, pytest-xdist's controller) can count and assign GPUs and stay
CUDA-free.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import MutableMapping

import torch

from ..failures import GpuPinningError

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def visible_ids(env: MutableMapping[str, str] | None = None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (ids or UUIDs), or None when unset.

    An empty value hides every GPU and gives ``[]``.
    """
    env = os.environ if env is None else env
    value = env.get(VISIBLE_ENV)
    if value is None:
        return None
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def _nvidia_smi_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listing = subprocess.run(
            [smi, "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def visible_gpu_count(env: MutableMapping[str, str] | None = None) -> int:
    """How many GPUs this process may use, without creating a CUDA context.

    ``torch.cuda.device_count()`` asks NVML and honours ``CUDA_VISIBLE_DEVICES``
    without initialising CUDA; ``nvidia-smi -L`` (capped by the visible list)
    is the fallback when torch has no CUDA build.
    """
    env = os.environ if env is None else env
    listed = visible_ids(env)
    if listed == []:
        return 0
    count = torch.cuda.device_count() if torch.backends.cuda.is_built() else 0
    if count == 0:
        count = _nvidia_smi_count()
        if listed is not None:
            count = min(count, len(listed))
    return count


def gpu_for_worker(worker_index: int, gpu_count: int) -> int:
    """The visible-GPU index worker ``worker_index`` runs on: round-robin."""
    if not isinstance(worker_index, int) or worker_index < 0:
        raise GpuPinningError(f"worker_index={worker_index!r} must be an int >= 0")
    if not isinstance(gpu_count, int) or gpu_count < 1:
        raise GpuPinningError(
            f"gpu_count={gpu_count!r} must be an int >= 1; with no GPU, do not pin workers"
        )
    return worker_index % gpu_count


def cuda_initialized() -> bool:
    """Whether this process already created its CUDA context (then pinning is too late)."""
    return bool(torch.cuda.is_initialized())


def pin_to_gpu(index: int, env: MutableMapping[str, str] = os.environ) -> str:
    """Make visible GPU ``index`` the only GPU this process (and its children) sees.

    ``index`` counts the GPUs visible now: when ``CUDA_VISIBLE_DEVICES`` is
    already a list, the entry at ``index`` is kept (so ``"4,5,6"`` pinned at
    1 becomes ``"5"``). Returns the value set. Must run before CUDA
    initialises: afterwards the variable no longer has any effect, so this
    raises :class:`GpuPinningError` instead of pinning silently in name only.
    """
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise GpuPinningError(f"index={index!r} must be an int >= 0")
    if env is os.environ and cuda_initialized():
        raise GpuPinningError(
            f"cannot pin to GPU {index}: CUDA is already initialised in this process, so "
            f"{VISIBLE_ENV} no longer applies; pin before the first CUDA call "
            "(at the start of the worker process)"
        )
    listed = visible_ids(env)
    if listed is None:
        physical = str(index)
    else:
        if index >= len(listed):
            raise GpuPinningError(
                f"index={index} is out of range: {VISIBLE_ENV}={env[VISIBLE_ENV]!r} makes "
                f"{len(listed)} GPU(s) visible"
            )
        physical = listed[index]
    env[VISIBLE_ENV] = physical
    return physical


WORKERS_PER_GPU_ENV = "C128A_WORKERS_PER_GPU"
WORKER_GPU_MEMORY_GIB = 4
"""What one worker may hold on its GPU: a CUDA context, 1M-context buffers,
Triton's and the caching allocator's memory."""


def usable_cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def share_cores(processes: int) -> int:
    """Give this process, one of ``processes`` running side by side, its share
    of the host's cores for torch's CPU work (the oracle, the comparisons):
    ``usable_cores() // processes`` threads, at least one. Left alone, each
    process starts a thread per core and they contend for the cores. Returns
    the thread count set."""
    import torch

    threads = max(usable_cores() // max(processes, 1), 1)
    torch.set_num_threads(threads)
    return threads


def freeze_startup_heap() -> None:
    """Collect garbage once, then exclude what survived (torch, Triton,
    Hypothesis, the suite: everything a worker loaded at start-up) from every
    later collection. A CUDA graph capture collects garbage first
    (:class:`c128a.kernels.consumer_kernel.GraphConsumer`); over the whole heap that
    took far longer than over what came after start-up (docs/measurements.md,
    "Measurements behind the code's choices"). What is frozen lives as long
    as the process anyway; call :func:`thaw_heap` before the process ends, so that its finalisation
    frees those objects too (Triton's bindings report leaks otherwise)."""
    import gc

    gc.collect()
    gc.freeze()


def thaw_heap() -> None:
    """Undo :func:`freeze_startup_heap`."""
    import gc

    gc.unfreeze()


def _smallest_gpu_memory_gib() -> float | None:
    """The smallest visible GPU's memory, from ``nvidia-smi`` (no CUDA context)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        listing = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        sizes = [float(line) / 1024 for line in listing.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(sizes) if sizes else None


def workers_per_gpu(gpu_count: int, env: MutableMapping[str, str] | None = None) -> int:
    """How many worker processes share each GPU by default: ``$C128A_WORKERS_PER_GPU``,
    else about one per CPU core (the suite's examples are bound by the CPU:
    drawing, the oracle, comparisons), capped by what fits in GPU memory
    (:data:`WORKER_GPU_MEMORY_GIB` each)."""
    env = os.environ if env is None else env
    given = env.get(WORKERS_PER_GPU_ENV)
    if given:
        try:
            value = int(given)
        except ValueError:
            value = 0
        if value < 1:
            raise GpuPinningError(f"${WORKERS_PER_GPU_ENV}={given!r} must be an integer >= 1")
        return value
    if gpu_count < 1:
        raise GpuPinningError(f"gpu_count={gpu_count!r} must be >= 1")
    by_cores = max(usable_cores() // gpu_count, 1)
    memory = _smallest_gpu_memory_gib()
    by_memory = max(int(memory // WORKER_GPU_MEMORY_GIB), 1) if memory else by_cores
    return min(by_cores, by_memory)
