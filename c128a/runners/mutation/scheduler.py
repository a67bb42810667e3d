"""A mutation run: the control first, then every mutant, each in a child
process with a time limit, several side by side.

The children are forked from multiprocessing's fork server, which imports
torch, Hypothesis and the suite once (:data:`CHILD_PRELOAD`; the kernels,
decorated under ``TRITON_INTERPRET`` or not, each child imports itself),
so a child starts in a fraction of a second. Each leads a process group of
its own, and is ended with it (:func:`~c128a.runners.fuzz.process.kill_group`).

The control runs each subject unmutated through every property of every
run, in the same kind of child. A subject that fails its own control ends
the run (a score against a failing kernel means nothing), and its times set
each property's limit for the mutants: ``factor`` times the control's time
for that property on that run, at least ``min_limit_s``, unless a fixed
``timeout_s`` is given. A limit applies to one property of one mutant,
from the child's message that the property starts, so a hang is found
after about the time its property takes, not after a whole mutant's.

SIGINT, SIGTERM and SIGHUP stop the run: the children are killed, and the
mutants that had not finished are reported as not run.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable

from ...failures import HarnessError, UsageError
from ..fuzz.process import kill_group
from ...gpu.pinning import usable_cores
from .child import child_main
from .known import read_known
from .mutator import Mutant, mutants_of
from .report import (
    CRASHED, ERROR, KILLED, NOT_RUN, SURVIVED, TIMED_OUT, Result, Verdict, machine,
)
from .subjects import LEFT_OUT, Subject, load_subject

CHILD_PRELOAD = ("c128a.runners.mutation.child", "c128a.runners.killmatrix", "c128a.checks",
                 "triton")
"""What the fork server imports before it forks children: nothing that
depends on the environment a child is given."""
POLL_S = 0.2
CONTROL_LIMIT_S = 3600.0  # a property of the control, unless --timeout is given
STARTUP_LIMIT_S = 300.0  # from a child's start to its first property
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class MutationConfig:
    """What to mutate and how to judge it. ``timeout_s`` fixes every
    property's limit (None: ``factor`` x the control's time, at least
    ``min_limit_s``); ``mutant_ids`` runs only those; ``sample`` runs that
    many, drawn with ``seed``; ``max_examples`` overrides the ci profile's."""

    subjects: tuple[str, ...]
    known: Path | None  # None: no mutant is known to survive
    device: str = "cpu"
    workers: int = 0  # 0: one per usable core
    timeout_s: float | None = None
    factor: float = 5.0
    min_limit_s: float = 60.0
    max_examples: int | None = None
    mutant_ids: tuple[str, ...] = ()
    sample: int | None = None
    seed: int = 0
    say: Callable[[str], None] = print


@dataclass
class _Job:
    subject: Subject
    mutant: Mutant | None  # None: the control
    source: Path
    log: Path

    @property
    def name(self) -> str:
        return f"control {self.subject.name}" if self.mutant is None else self.mutant.id


@dataclass
class _Slot:
    job: _Job
    process: object
    conn: object
    started: float
    deadline: float | None
    current: tuple[str, str] | None = None
    ends: list[tuple] = field(default_factory=list)  # ("end", ...) messages
    finished: str | None = None  # the child's last word ("" all well, else why not)
    closed: bool = False


class MutationRun:
    """One run: select the mutants, run the controls, run the mutants, judge."""

    def __init__(self, config: MutationConfig):
        self.config = config
        self.specs: dict[str, str] = {}  # subject name -> how a child finds it again
        self.subjects: list[Subject] = []
        for spec in dict.fromkeys(config.subjects):
            subject = load_subject(spec)
            if subject.name in self.specs:
                raise UsageError(f"--subject {spec!r}: another subject is named "
                                 f"{subject.name!r} already ({self.specs[subject.name]!r})")
            self.specs[subject.name] = spec
            self.subjects.append(subject)
        self.known = read_known(config.known) if config.known is not None else {}
        self.workers = config.workers or usable_cores()
        self.stopping: str | None = None
        self.limits: dict[tuple[str, str, str], float] = {}
        self.control: dict[str, dict[str, dict[str, float]]] = {}
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(CHILD_PRELOAD))
        # Read once: the control and every mutant come from the same text.
        self.sources = {subject.name: subject.path().read_text() for subject in self.subjects}
        self.all_mutants = {subject.name: mutants_of(self.sources[subject.name], subject.name,
                                                     subject.decorators)
                            for subject in self.subjects}
        self.selected = self._select()

    # -- which mutants

    def _select(self) -> list[Mutant]:
        everything = [m for mutants in self.all_mutants.values() for m in mutants]
        by_id = {m.id: m for m in everything}
        if self.config.mutant_ids:
            unknown = [i for i in self.config.mutant_ids if i not in by_id]
            if unknown:
                raise UsageError(f"--mutant {', '.join(unknown)}: no such mutant of "
                                 f"{', '.join(s.name for s in self.subjects)}; --list names them")
            chosen = [by_id[i] for i in dict.fromkeys(self.config.mutant_ids)]
        else:
            chosen = everything
        sample = self.config.sample
        if sample is not None:
            if sample < 1:
                raise UsageError(f"--sample={sample} must be >= 1")
            picked = set(random.Random(self.config.seed).sample(range(len(chosen)),
                                                                min(sample, len(chosen))))
            chosen = [m for i, m in enumerate(chosen) if i in picked]
        return chosen

    def selection(self) -> str:
        total = sum(len(m) for m in self.all_mutants.values())
        if self.config.mutant_ids:
            return f"{len(self.selected)} named by --mutant, of {total}"
        if self.config.sample is not None:
            return f"a sample of {len(self.selected)} of {total} (--seed {self.config.seed})"
        return f"all {total}"

    # -- the run

    def run(self) -> tuple[Verdict, dict]:
        started = time.monotonic()
        results = {m.id: Result(m) for m in self.selected}
        workdir = Path(tempfile.mkdtemp(prefix="c128a-mutate-"))
        previous = self._handle_signals()
        try:
            by_subject = {s.name: s for s in self.subjects}
            controls = [self._job(workdir, s, None) for s in self.subjects]
            self._pool(controls, self._control_done)
            if not self.stopping:
                jobs = [self._job(workdir, by_subject[m.subject], m) for m in self.selected]
                count = len(jobs)
                done = [0]

                def mutant_done(job: _Job, result: Result, slot: _Slot) -> None:
                    done[0] += 1
                    results[job.mutant.id] = result
                    self.config.say(progress_line(done[0], count, result))

                self._pool(jobs, mutant_done)
        finally:
            self._restore_signals(previous)
            shutil.rmtree(workdir, ignore_errors=True)
        verdict = Verdict(
            list(results.values()), self.known,
            {m.id for mutants in self.all_mutants.values() for m in mutants},
            subjects=set(self.all_mutants),
            interrupted=f"interrupted by {self.stopping}" if self.stopping else "",
        )
        return verdict, self._header(time.monotonic() - started)

    def _job(self, workdir: Path, subject: Subject, mutant: Mutant | None) -> _Job:
        stem = f"{subject.name}-control" if mutant is None else mutant.id
        source = workdir / f"{stem}.py"
        source.write_text(self.sources[subject.name] if mutant is None else mutant.source)
        return _Job(subject, mutant, source, workdir / f"{stem}.log")

    def _header(self, wall_s: float) -> dict:
        from importlib.metadata import version

        config = self.config
        limit = (f"{config.timeout_s:g} s a property" if config.timeout_s else
                 f"{config.factor:g} x the control's time for the property, at least "
                 f"{config.min_limit_s:g} s")
        return {
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(),
            "device": config.device,
            "versions": {"python": sys.version.split()[0], "torch": version("torch"),
                         "triton": version("triton")},
            "subjects": [s.name for s in self.subjects],
            "selection": self.selection(),
            "workers": self.workers,
            "max_examples": config.max_examples or "the ci profile's",
            "time_limit": limit,
            "runs": {s.name: [{"target": r.label, "properties": list(r.properties)}
                              for r in s.runs] for s in self.subjects},
            "properties_left_out": LEFT_OUT,
            "control_s": self.control,
            "wall_s": wall_s,
        }

    # -- the controls

    def _control_done(self, job: _Job, result: Result, slot: _Slot) -> None:
        subject = job.subject
        times = self.control.setdefault(subject.name, {})
        failures = []
        for _, run, name, status, seconds, message in slot.ends:
            times.setdefault(run, {})[name] = round(seconds, 2)
            if status not in (SURVIVED, "n/a"):
                failures.append(f"{name} on {run}: {status} ({message})")
            self.limits[(subject.name, run, name)] = (
                self.config.timeout_s or max(self.config.factor * seconds,
                                             self.config.min_limit_s))
        if result.status != SURVIVED or failures:
            why = "; ".join(failures) or f"{result.status}: {result.detail}"
            raise HarnessError(
                f"the unmutated {subject.name} ({subject.module}) fails its own control: {why}; "
                "a mutation score needs a subject that passes every property it is judged by"
            )
        self.config.say(f"control {subject.name}: every property passed in "
                        f"{sum(sum(r.values()) for r in times.values()):.0f} s")

    # -- the pool

    def _limit(self, job: _Job, run: str, name: str) -> float:
        if job.mutant is None:
            return self.config.timeout_s or CONTROL_LIMIT_S
        return self.limits.get((job.subject.name, run, name),
                               self.config.timeout_s or CONTROL_LIMIT_S)

    def _start(self, job: _Job) -> _Slot:
        receiver, sender = self.context.Pipe(duplex=False)
        threads = max(usable_cores() // self.workers, 1)
        process = self.context.Process(
            target=child_main, name=f"c128a-mutate {job.name}",
            args=(sender, dict(os.environ), os.getpid(), self.specs[job.subject.name],
                  None if job.mutant is None else job.mutant.id, str(job.source), str(job.log),
                  self.config.device, self.config.max_examples, threads),
        )
        process.start()
        sender.close()
        now = time.monotonic()
        return _Slot(job, process, receiver, now, now + STARTUP_LIMIT_S)

    def _pool(self, jobs: list[_Job], done) -> None:
        pending = collections.deque(jobs)
        slots: list[_Slot] = []
        try:
            while (pending or slots) and not self.stopping:
                while pending and len(slots) < self.workers:
                    slots.append(self._start(pending.popleft()))
                waitables = [s.process.sentinel for s in slots]
                waitables += [s.conn for s in slots if not s.closed]
                wait(waitables, timeout=POLL_S)
                for slot in list(slots):
                    result = self._check(slot)
                    if result is not None:
                        slots.remove(slot)
                        done(slot.job, result, slot)
        finally:
            for slot in slots:
                kill_group(slot.process)
                slot.process.join()

    def _drain(self, slot: _Slot) -> None:
        while not slot.closed:
            try:
                if not slot.conn.poll():
                    return
                message = slot.conn.recv()
            except (EOFError, OSError):
                slot.closed = True
                return
            if message[0] == "start":
                slot.current = (message[1], message[2])
                slot.deadline = time.monotonic() + self._limit(slot.job, *slot.current)
            elif message[0] == "end":
                slot.ends.append(message)
                slot.current, slot.deadline = None, None
            elif message[0] == "finished":
                slot.finished = message[1]

    def _check(self, slot: _Slot) -> Result | None:
        """The slot's result once its child is done (or overdue), else None."""
        self._drain(slot)
        now = time.monotonic()
        if slot.process.is_alive():
            if slot.deadline is None or now <= slot.deadline:
                return None
            kill_group(slot.process)
            slot.process.join()
            result = self._result(slot)
            if slot.current is None:
                result.status, result.detail = TIMED_OUT, (
                    f"no property started within {STARTUP_LIMIT_S:g} s")
            else:
                run, name = slot.current
                result.status, result.run, result.property = TIMED_OUT, run, name
                result.detail = f"limit {self._limit(slot.job, run, name):.0f} s"
            return result
        slot.process.join()
        self._drain(slot)
        return self._result(slot)

    def _result(self, slot: _Slot) -> Result:
        job = slot.job
        result = Result(job.mutant, seconds=time.monotonic() - slot.started)
        for _, run, name, status, seconds, message in slot.ends:
            result.properties.append((run, name, status, round(seconds, 2)))
            if status == ERROR:
                result.errors.append(f"{name} on {run}: {message}")
            if status == KILLED:
                result.status, result.run, result.property = KILLED, run, name
                result.detail = message
        if result.status == KILLED:
            return result
        if slot.finished is None:
            code = slot.process.exitcode
            how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"exit status {code}")
            running = f" during {slot.current[1]} on {slot.current[0]}" if slot.current else ""
            result.status = CRASHED
            result.detail = f"process ended ({how}){running}; {last_line(job.log)}"
        elif slot.finished:  # the child could not judge it
            result.status, result.detail = ERROR, slot.finished
            result.errors.append(slot.finished)
        else:
            result.status = ERROR if result.errors else SURVIVED
        return result

    # -- signals

    def _handle_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def stop(signum, frame) -> None:
            self.stopping = signal.Signals(signum).name

        return {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}

    def _restore_signals(self, previous: dict) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def last_line(log: Path) -> str:
    """The last non-empty line a child wrote (why it died, where it says)."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return f"last output: {lines[-1].strip()[:200]}" if lines else "no output"


def progress_line(done: int, count: int, result: Result) -> str:
    mutant = result.mutant
    width = len(str(count))
    by = (f" by {result.property} on {result.run}" if result.status == KILLED else
          f" in {result.property} on {result.run}" if result.status == TIMED_OUT and result.run
          else "")
    return (f"[{done:{width}d}/{count}] {mutant.id} {result.status}{by} "
            f"({result.seconds:.1f} s)  {mutant.describe()}")


__all__ = ["MutationConfig", "MutationRun", "NOT_RUN"]
