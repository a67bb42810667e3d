"""What the supervisor keeps of a worker it loses: the input the worker
was running, as a ``crash`` or ``hang`` case, how the worker died, and the
smallest failing example its shrinking had found.

An object of a run's :class:`~.supervisor.Supervisor`, as its
:class:`~.handlers.MessageHandlers` are: it holds the smallest failing
example each shrinking worker has sent and the historical steps saved,
reads a worker's in-flight file (:mod:`.inflight`) and records in the
run's case book and errors. A
historical step (a property's ``@example``, run in each worker's first
round of it) on which a worker died or hung is saved once, and the
restarted worker skips it: else every restart died on the same step.
"""

from __future__ import annotations

import signal
from typing import Any

from .inflight import InflightRecord, case_from_inflight, read_inflight, step_key
from .process import WORKER_INTERRUPTED_EXIT
from .signals import describe_signal
from .worker import CUDA_FAULT_EXIT


class LostWorkers:
    """A run's handling of workers that died, hung or were cut short
    (``run``: its :class:`~.supervisor.Supervisor`)."""

    def __init__(self, run):
        self.run = run
        self.best: dict[int, Any] = {}  # worker -> the smallest failing example it has sent
        self.historical_saved: set[str] = set()  # step_key of historical steps saved as cases

    def hold(self, index: int, case) -> None:
        """Worker ``index``'s smallest failing example so far, as it shrinks:
        held, not saved (its first failing example is saved already)."""
        self.best[index] = case

    def drop_held(self, index: int) -> None:
        """Worker ``index`` sent a new first example or its shrunk one: what
        was held of its shrinking is over."""
        self.best.pop(index, None)

    def inflight_record(self, index: int) -> InflightRecord | None:
        return read_inflight(self.run.inflight_path(index))

    def lost_input_case(self, index: int, kind: str, message: str) -> None:
        """Keep what the worker was running when it died or hung as a case."""
        record = self.inflight_record(index)
        self.cut_short(index, f"the worker was lost ({kind})")
        if record is None:
            why = ("its in-flight input went with the run's temporary folder, deleted during "
                   "the run" if self.run.run_dir_lost else "before its first example")
            self.run.book.lost(kind, f"{message} ({why})")
            return
        if record.batch_problem:
            self.run.errors.append(f"worker {index}'s in-flight input is malformed: "
                               f"{record.batch_problem}")
        if record.historical and record.batch is not None:
            # Restarted workers skip it: each would die on it again.
            self.historical_saved.add(step_key(record.property, record.batch))
        self.run.book.record(case_from_inflight(
            record, kind=kind, failure=message, target=self.run.config.target,
            device=self.run.config.device, padding_rows=self.run.config.padding_rows,
            steps=None if record.batch else "the serving-loop example running when the worker "
            "was lost",
        ))

    def cut_short(self, index: int, why: str) -> None:
        """A worker ended while it shrank a failure: the smallest failing
        example it sent (:class:`~.protocol.Shrinking`) replaces the first
        one, saying the shrinking was cut short; with none, the first one
        stays, and the last input the worker tried goes in the report with it."""
        best = self.best.pop(index, None)
        if best is not None:
            self.keep_best_so_far(index, best, why)
        elif self.run.book.has_unshrunk(index):
            record = self.inflight_record(index)
            self.run.book.cut_short(index, why, last_tried=record.batch_json if record else None)

    def keep_best_so_far(self, index: int, best, why: str) -> None:
        """``best`` replaces worker ``index``'s first failing example as the
        shrunk case would, and its report entry says it is not the end of
        the shrinking."""
        _, first = self.run.book.pending.get(index, (None, None))
        entries = len(self.run.book.entries)
        self.run.stats[index].failures += self.run.book.shrunk(index, best)
        if first is not None and any(entry is first for entry in self.run.book.entries):
            entry = first  # replaced in place
        elif len(self.run.book.entries) > entries:
            entry = self.run.book.entries[-1]
        else:
            return  # a failure this run had found already
        entry["shrunk"] = False
        entry["note"] = (f"shrinking was cut short ({why}); the case is the smallest failing "
                         "example found by then")

    def died_of_cuda_fault(self, index: int) -> bool:
        """Whether worker ``index``'s exit with :data:`CUDA_FAULT_EXIT` was its
        own, after a CUDA fault: the worker writes the fault into its in-flight
        record before it exits. A target may exit with the same status
        (``sys.exit(3)``, on any device): that is a crash like any other exit.
        (Not the device alone: the worker knows a CUDA fault by its message,
        which a target on the CPU can raise too, and which the tests plant.)"""
        record = self.inflight_record(index)
        return bool(record and record.fault)

    def how_it_died(self, index: int, code: int | None) -> str:
        """Worker ``index``'s end by exit status ``code``, in words."""
        how = describe_signal(-code) if code and code < 0 else f"exit {code}"
        if code == 0:
            how += (" without saying it was done: the code it ran ended the process (os._exit, "
                    "sys.exit, a native library calling exit())")
        elif code == CUDA_FAULT_EXIT and self.died_of_cuda_fault(index):
            how = "CUDA fault"
        elif code == WORKER_INTERRUPTED_EXIT:
            how = f"KeyboardInterrupt raised by the code it ran, exit {code}"
        elif code == -signal.SIGKILL:  # the runner's own kills (a hang, the stop) end no crash
            how += (", not sent by the runner: the code it ran, another process, or the "
                    "system's out-of-memory killer (see dmesg)")
        return how
