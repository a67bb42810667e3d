"""One mutant (or the unmutated control) judged in a process of its own.

A mutant may hang (a loop that never ends) or take the interpreter down
with it (a store through a wild pointer), so each runs in a child that the
parent can kill. The child says what it does on a pipe, one message at a
time, and the parent enforces each property's time limit from them:

- ``("start", run, property)`` as a property starts;
- ``("end", run, property, status, seconds, message)`` as it ends, with
  status ``killed``, ``survived``, ``error`` (a fault of the suite, never a
  kill) or ``n/a`` (the property cannot be checked on this target);
- ``("finished", reason)`` when it is done: after the first kill (the
  control goes on), after every run, or, with a reason, when the mutant
  could not be loaded.

Its standard output and error go to a log file, whose tail the parent
shows for a child that died.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

from ...failures import failure_text

LOAD_FAILED = "the mutant module could not be loaded"
DEVICE_FAULT_EXIT = 3
"""The exit status of a child whose mutant faulted on the GPU: for a mutant a
CUDA fault (:func:`~c128a.failures.is_cuda_fault`) is a crash of its kernel,
as a segfault is on the CPU, not a fault of the suite."""


def child_main(conn, environ: dict, parent_pid: int, subject_spec: str, mutant_id: str | None,
               source_path: str, log_path: str, device: str, max_examples: int | None,
               threads: int) -> None:
    """The child process: take the parent's environment, watch the parent,
    load the mutant as a target and run its subject's runs."""
    os.setsid()  # first: the parent kills the whole group, whatever the mutant started
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.clear()
    os.environ.update(environ)
    from ..fuzz.process import watch_parent

    watch_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the run on Ctrl-C
    try:
        _judge(conn, subject_spec, mutant_id, Path(source_path), device, max_examples, threads)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        conn.close()


def _judge(conn, subject_spec, mutant_id, source_path, device, max_examples, threads) -> None:
    from ...targets import use_device

    device = use_device(device)  # Triton's interpreter on before the kernels are imported
    import torch

    torch.set_num_threads(threads)
    from ...checks import PROPERTIES
    from ..killmatrix import ci_settings, run_property
    from .subjects import load_module, load_subject, mutant_module_name, run_target

    subject = load_subject(subject_spec)
    try:
        module = load_module(mutant_module_name(subject, mutant_id), source_path)
    except Exception as exc:  # noqa: BLE001 - whatever the mutated module raised
        conn.send(("finished", f"{LOAD_FAILED}: {failure_text(exc)}"))
        return
    control = mutant_id is None
    run_settings = ci_settings(max_examples)
    for run in subject.runs:
        try:
            target = run_target(run, module)
        except Exception as exc:  # noqa: BLE001 - the target could not be made
            conn.send(("finished", f"target {run.label!r} could not be loaded: {failure_text(exc)}"))
            return
        for name in run.properties:
            conn.send(("start", run.label, name))
            started = time.perf_counter()
            try:
                outcome = run_property(PROPERTIES[name], target, torch.device(device), run_settings)
            except Exception as exc:  # noqa: BLE001 - run_property lets a BaseException-free fault through
                conn.send(("end", run.label, name, "error", time.perf_counter() - started,
                           "".join(traceback.format_exception_only(exc)).strip()))
                continue
            status = ("killed" if outcome.killed else "n/a" if outcome.unsupported
                      else "error" if outcome.errored else "survived")
            if outcome.cuda_fault and not control:
                # The context is gone: end as a crash, with why on the log's last line.
                print(f"the mutant's kernel faulted on the device during {name} on "
                      f"{run.label}: {outcome.message}", file=sys.stderr, flush=True)
                os._exit(DEVICE_FAULT_EXIT)
            conn.send(("end", run.label, name, status, time.perf_counter() - started,
                       outcome.message))
            if outcome.killed and not control:
                conn.send(("finished", ""))
                return
    conn.send(("finished", ""))
