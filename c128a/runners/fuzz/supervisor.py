"""The parent of a fuzz run: spawns, watches and restarts workers.

The work happens in worker processes: about one per core, on CUDA shared
among the GPUs (each pinned to its GPU). They are forked from
multiprocessing's fork server, which imports torch, Hypothesis and the suite
once (:data:`WORKER_PRELOAD`) and never touches CUDA, so each worker (and
each restart) starts in a fraction of a second without inheriting a CUDA
context; spawning imported all of it again in every worker. A worker takes
the parent's environment as it is at its start, as a spawned one would.
Before the workers, the target is loaded once in a child of the fork server
(:mod:`.loading`): never in this process, where a target's exit at import
ended the run without a word. A worker that dies (a CUDA fault, a signal,
an exit without saying it is done) or runs one example past
``--example-timeout`` is killed and restarted where its rotation was; the
parent keeps its in-flight input as a ``crash`` or ``hang`` case. A worker's
first failing example is saved before it shrinks, and the smaller ones it
finds are held as they come, so a stop or a kill loses nothing found. A
worker is ended with its whole process group and every process below it,
and the run ends every process its workers orphaned (:mod:`.strays`): what
a target started never outlives the run.

The run's deadline counts from its start (``started``: the command's, before
the target loads), and the run ends by it plus :data:`STOP_GRACE_S` (and the
time to write the report): at the deadline the workers end their example,
stop shrinking (the smallest failing example found so far is kept), and any
still running after the grace is killed.

Each worker's wall time (from its first spawn to its end, restarts included)
is split into :data:`c128a.phases.BUCKETS`: the seconds its examples spent
drawing, in the target, the oracle and the checks, as the worker measured
them, and supervision, the rest (the report's ``time_split``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import queue as queue_module
import shutil
import signal
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from ...failures import UsageError
from ...gpu.pinning import gpu_for_worker
from ...interrupts import HeldSignals
from .casebook import CaseBook, fallback_folders
from .channel import ChannelError, ChannelReader, ChannelWriter
from .config import FuzzConfig, check_paths
from .ending import end_interrupted, end_run, say
from .handlers import MessageHandlers
from .loading import Loaded, TargetNotLoaded, load_in_a_child
from .losses import LostWorkers
from .process import kill_group, run_worker, start_process
from .report import WorkerStats, build_report, render, status_line
from .rundir import make_run_dir, remade, remove_stale_run_dirs
from .signals import STOP_SIGNALS, RunInterrupted, RunSignals, describe_signal
from .strays import Strays, parent_table

WORKER_PRELOAD = ("c128a.runners.fuzz.process", "c128a.replay", "triton")
"""What the fork server imports before it forks workers: nothing that depends
on the environment a worker is given (the kernels, decorated under
``TRITON_INTERPRET`` or not, are imported by each worker)."""
POLL_INTERVAL_S = 0.1
STARTUP_TIMEOUT_S = 600.0
STOP_GRACE_S = 5.0
"""At the run's stop (its deadline, SIGINT, SIGTERM, SIGHUP): time for each
worker to end its example, shrinking or not; then it is killed. The run ends
by ``--minutes`` plus this and the time its report takes."""
SIGNAL_GRACE_S = STOP_GRACE_S
SHRINK_GRACE_S = 30.0
"""After a stop that only ends the search (``--exitfirst``, a fatal error):
time for a worker to finish shrinking (its example may take up to
``--example-timeout``), within the deadline; then the run stops."""
RETRY_CASES_S = 10.0  # how often the cases folder is tried again for the cases it refused


@dataclass
class _Slot:
    process: Any = None
    channel: Any = None
    generation: int = 0
    spawned: float = 0.0
    activity: float = 0.0
    ready: bool = False
    finished: bool = False
    broken: bool = False  # its channel held what is not a message
    round: int = 0  # the round of its rotation it runs (its progress says), or starts at


class Supervisor:
    """Spawns, watches and restarts workers and runs the event loop; their
    messages go to its :class:`~.handlers.MessageHandlers` (``messages``),
    cases to a :class:`~.casebook.CaseBook` (``book``), the workers it loses
    to its :class:`~.losses.LostWorkers` (``losses``).

    A stop asks the workers to end after their example: ``--exitfirst``
    lets a failure being shrunk finish (:data:`SHRINK_GRACE_S`, within the
    deadline); the deadline, SIGINT, SIGTERM and SIGHUP halt the shrinking
    too, wait :data:`STOP_GRACE_S`, then kill the ones still running. Nothing
    found is lost on the way: a worker reports its first failing example
    before it starts shrinking, and that case is saved at once; the smaller
    ones it finds are held as they come, and the smallest replaces it when
    the shrinking is cut short (the shrunk one, when it ends); a worker's
    in-flight input is kept as a crash or hang case when it dies or stops
    answering. ``started`` (a ``time.monotonic()``) is when the run started,
    the deadline's origin: by default now.
    """

    def __init__(self, config: FuzzConfig, console=None, started: float | None = None):
        self.config = config
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(list(WORKER_PRELOAD))
        self.console = console or Console(stderr=True)
        # The resource tracker, multiprocessing's helper process for the
        # semaphores, starts here with SIGHUP blocked for good (it blocks
        # SIGINT and SIGTERM itself): a hangup reaches the process group, and
        # a tracker killed by it is relaunched empty, printing a traceback a
        # semaphore.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            resource_tracker.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        self.stop = self.context.Event()  # no next example, but a failure shrinks to its end
        self.halt = self.context.Event()  # no next example at all
        remove_stale_run_dirs()
        self.run_dir = make_run_dir()
        self.run_dir_lost = False  # deleted during the run, and made again
        # Worker i starts at the i-th round of the rotation: a short run
        # reaches as many properties at once as it has workers.
        self.slots = [_Slot(round=index) for index in range(config.workers)]
        self.stats = [WorkerStats(i) for i in range(config.workers)]
        self.labels: Counter[str] = Counter()
        self.reach: Counter[str] = Counter()  # "dimension: bucket" -> examples
        self.per_property: Counter[str] = Counter()
        self.book = CaseBook(config.cases_dir, on_record=self.case_recorded,
                             fallbacks=fallback_folders(config.report), say=self.say)
        self.errors: list[str] = []  # faults of the suite itself, reported by workers
        self.fatal: str | None = None
        self.interrupted: int | None = None  # the signal that stopped the run
        self.report_problem: str | None = None  # why the report file could not be written
        now = time.monotonic()
        self.started = now if started is None else started
        self.started_wall = time.time() - (now - self.started)
        self.deadline = self.started + config.minutes * 60 if config.minutes else None
        self.stopping_since: float | None = None
        self.grace = max(SHRINK_GRACE_S, config.example_timeout)
        self.halting_since: float | None = None
        self.halt_grace = float("inf")  # set by request_halt
        self.stopped_by: str | None = None  # what stopped the run, in words
        self.loaded: Loaded | None = None  # the target, loaded before the workers
        self.loaded_after = 0.0  # seconds from the run's start to the target loaded
        self.not_started: str | None = None  # why no worker was started
        self.ran = False  # the rounds began (workers were started)
        self.strays = Strays()  # the processes the run's workers orphan
        self.fork_server_noted = False
        self.messages = MessageHandlers(self)
        self.losses = LostWorkers(self)
        self.budgets = None if config.max_examples is None else [
            config.max_examples // config.workers
            + (1 if i < config.max_examples % config.workers else 0)
            for i in range(config.workers)
        ]

    # -- workers

    def inflight_path(self, index: int) -> Path:
        return self.run_dir / f"worker-{index}.json"

    def keep_run_dir(self) -> None:
        """Make the run's temporary folder again if something deleted it (a
        temporary-file cleaner, a hand): a worker that starts opens its
        in-flight file there, and without the folder it could not run."""
        if remade(self.run_dir) and not self.run_dir_lost:
            self.run_dir_lost = True
            self.say(f"the run's temporary folder {self.run_dir} was deleted; made again (the "
                     "in-flight input of a worker already running is lost until it restarts)")

    def say(self, text: str, case=None) -> None:
        say(self.console, text, case)

    def case_recorded(self) -> None:
        """A case is on the disk (the case book says): with ``--exitfirst``,
        the run stops."""
        if self.config.exitfirst:
            self.request_stop("--exitfirst")

    def spawn(self, index: int) -> None:
        slot, stats = self.slots[index], self.stats[index]
        self.keep_run_dir()
        self.inflight_path(index).unlink(missing_ok=True)
        budget = None
        if self.budgets is not None:
            budget = max(0, self.budgets[index] - stats.examples)
            if budget == 0:
                slot.finished = True
                stats.state = "done"
                return
        gpu = None
        if self.config.device == "cuda" and self.config.gpu_count:
            gpu = gpu_for_worker(index, self.config.gpu_count)
        stats.gpu = gpu
        reading, writing = self.context.Pipe(duplex=False)
        slot.channel = ChannelReader(reading)
        slot.process = self.context.Process(
            target=run_worker,
            args=(index, slot.generation, self.config, ChannelWriter(writing), self.stop,
                  self.halt, str(self.inflight_path(index)), budget, gpu, os.getpid(),
                  dict(os.environ), frozenset(self.losses.historical_saved), slot.round),
            name=f"c128a-fuzz-{index}",
            daemon=True,
        )
        try:
            start_process(slot.process)
        finally:
            writing.close()  # the worker has its copy: the channel ends when the worker does
        self.note_fork_server(slot.process)
        slot.spawned = slot.activity = time.monotonic()
        slot.ready = False
        stats.state = "starting"

    def restart(self, index: int) -> None:
        slot, stats = self.slots[index], self.stats[index]
        if slot.channel is not None:
            slot.channel.close()
        if stats.restarts >= self.config.max_restarts or self.stop.is_set():
            slot.finished = True
            stats.state = "gave up" if not self.stop.is_set() else "stopped"
            return
        stats.restarts += 1
        slot.generation += 1
        slot.round += 1  # the round it was lost in is over: on with the rotation
        self.spawn(index)

    def note_fork_server(self, process) -> None:
        """The fork server (the parent of ``process``, which it forked; the
        first start started it) is this process's child: never a stray."""
        if not self.fork_server_noted:
            self.fork_server_noted = True
            self.strays.keep_children_now()
            if (server := parent_table().get(process.pid)) is not None:
                self.strays.kept.add(server)

    def sweep_strays(self) -> None:
        """End what the run's ended workers orphaned (:mod:`.strays`)."""
        self.strays.sweep()

    def request_stop(self, why: str | None = None) -> None:
        """No next example, but a failure being shrunk shrinks on: after
        ``--exitfirst`` or a fatal error."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            self.stopped_by = self.stopped_by or why
            self.stop.set()

    def request_halt(self, why: str, grace: float | None = None) -> None:
        """No next example at all: the deadline or a signal. The workers end
        their example and send the smallest failing example they have; those
        still running after ``grace`` (:data:`STOP_GRACE_S`) are killed, and
        those still starting at once: they have nothing to finish."""
        self.request_stop(why)
        self.halt_grace = min(self.halt_grace, STOP_GRACE_S if grace is None else grace)
        if self.halting_since is None:
            self.halting_since = time.monotonic()
            self.stopped_by = why
            self.halt.set()

    def interrupt(self, signum: int, frame=None) -> None:
        """SIGINT, SIGTERM or SIGHUP: stop like the deadline does, with a short grace;
        a second signal stops at once."""
        if self.interrupted is not None:
            self.halt_grace = 0.0
            return
        self.interrupted = signum
        self.request_halt(describe_signal(signum).removeprefix("signal "), SIGNAL_GRACE_S)

    def drain(self, index: int) -> None:
        """Handle what worker ``index`` sent, each message by its handler."""
        slot = self.slots[index]
        while slot.channel is not None and not slot.broken:
            try:
                message = slot.channel.get_nowait()
            except (queue_module.Empty, OSError):
                return
            except ChannelError as exc:
                self.channel_broken(index, str(exc))
                return
            slot.activity = time.monotonic()
            self.messages.handle(index, message)

    def channel_broken(self, index: int, problem: str) -> None:
        """Worker ``index``'s channel holds what is not a message: an error of
        the suite. Nothing past it can be read, so the worker ends (its
        whole process group), and is not restarted."""
        slot, stats = self.slots[index], self.stats[index]
        slot.broken = True
        self.errors.append(f"worker {index}'s channel is broken: {problem}; the worker was "
                           "stopped, its messages cannot be read past it")
        if slot.process is not None:
            kill_group(slot.process)
        slot.finished, stats.state = True, "channel broken"

    def check(self, index: int, now: float) -> None:
        slot, stats = self.slots[index], self.stats[index]
        if slot.finished or slot.process is None:
            return
        process = slot.process
        if not process.is_alive():
            process.join()
            kill_group(process)  # what the worker's code started and left running
            self.sweep_strays()
            self.drain(index)
            unfinished = getattr(slot.channel, "unfinished_frame", lambda: None)()
            if unfinished and process.exitcode is not None and process.exitcode >= 0:
                # It exited by itself, mid-frame: not a crash (a signal's cut is one).
                self.channel_broken(index, unfinished)
            if slot.finished or self.fatal:
                slot.finished = True
                return
            # Ended without saying it was done (its Done sets it finished),
            # exit 0 included: the code it ran ended it (os._exit, a native
            # library's exit()), whether the run is stopping or not.
            how = self.losses.how_it_died(index, process.exitcode)
            if not slot.ready:
                # Dying before its first example is a setup problem: restarting repeats it.
                self.fatal = f"worker {index} died during start-up ({how})"
                slot.finished, stats.state = True, "failed to start"
                self.request_halt("a worker's fatal error")
                return
            stats.crashes += 1
            self.losses.lost_input_case(index, "crash",
                                        f"worker {index} died ({how}) running this input")
            self.restart(index)
            return
        try:
            inflight_time = self.inflight_path(index).stat().st_mtime
            activity = max(slot.activity, time.monotonic() - (time.time() - inflight_time))
        except OSError:
            activity = slot.activity
        limit = self.config.example_timeout if slot.ready else STARTUP_TIMEOUT_S
        if now - activity > limit:
            kill_group(process)
            process.join()
            self.sweep_strays()
            stats.hangs += 1
            self.losses.lost_input_case(
                index, "hang",
                f"worker {index} ran one example for more than {limit:g} s "
                "(--example-timeout) and was killed",
            )
            self.restart(index)

    def kill_the_rest(self, starting_only: bool = False) -> None:
        """The grace period is over: end the workers still running, keeping
        what each was doing (``starting_only``: those not ready yet, which
        have nothing to finish)."""
        killed = False
        for index, slot in enumerate(self.slots):
            if slot.finished or slot.process is None or (starting_only and slot.ready):
                continue
            kill_group(slot.process)
            slot.process.join()
            self.drain(index)
            self.losses.cut_short(index, "the worker was killed at the stop")
            slot.finished = killed = True
            self.stats[index].state = "killed at stop" if slot.ready else "stopped while starting"
        if killed:
            self.sweep_strays()

    # -- before the workers

    def load_target(self, origin: str | None = None) -> None:
        """Load the target once, in a child (:mod:`.loading`), before any
        worker starts; the run's configuration takes its spec and variant.
        A target that does not load is a :class:`~c128a.failures.UsageError`
        (naming ``origin``, where its spec came from, when given); one still
        loading at the deadline leaves the run with no worker to start
        (:attr:`not_started`), said in its report."""
        try:
            loaded = load_in_a_child(self.context, self.config, self.deadline,
                                     STARTUP_TIMEOUT_S, on_start=self.note_fork_server)
        except TargetNotLoaded as exc:
            if exc.what == "target" and origin:
                raise UsageError(f"{exc} (target from {origin})") from exc
            raise
        finally:
            self.sweep_strays()
        if loaded is None:
            self.not_started = (
                f"the target was still loading when the deadline came, "
                f"{time.monotonic() - self.started:.1f} s after the run started (--minutes "
                f"{self.config.minutes:g}): no worker was started"
            )
            self.stopped_by = "the deadline"
            return
        if not loaded.rounds:
            raise UsageError(
                "nothing to fuzz: no property selected applies to target "
                f"{loaded.spec!r} (" + "; ".join(f"{name}: {why}" for name, why
                                                 in loaded.not_applicable.items())
                + ") and the serving loop is off; choose others with --only"
            )
        self.loaded, self.loaded_after = loaded, time.monotonic() - self.started
        self.config = dataclasses.replace(self.config, target=loaded.spec,
                                          padding_rows=loaded.padding_rows)

    # -- the run

    def run(self, signals: RunSignals | None = None) -> dict[str, Any]:
        """The rounds, to the last worker's end; the report. A stop signal
        meanwhile goes to :meth:`interrupt`, through ``signals`` when given."""
        held = None
        if signals is not None:
            signals.delegate = self.interrupt
        else:
            held = HeldSignals(self.interrupt, STOP_SIGNALS)
        live = self.config.live if self.config.live is not None else self.console.is_terminal
        last_log = last_retry = time.monotonic()
        display = Live(render(self), console=self.console, refresh_per_second=4) if live else None
        self.ran = True
        try:
            for index in range(self.config.workers):
                if self.not_started:
                    self.slots[index].finished, self.stats[index].state = True, "not started"
                else:
                    self.spawn(index)
            if display:
                display.start()
            while True:
                now = time.monotonic()
                self.keep_run_dir()
                for index in range(self.config.workers):
                    self.drain(index)
                    self.check(index, now)
                if self.deadline is not None and now >= self.deadline:
                    self.request_halt("the deadline")
                if all(slot.finished for slot in self.slots):
                    break
                if self.stopping_since is not None and now - self.stopping_since > self.grace:
                    self.request_halt("the shrinking's grace after the stop")
                if self.halting_since is not None:
                    if now - self.halting_since > self.halt_grace:
                        self.kill_the_rest()
                        break
                    self.kill_the_rest(starting_only=True)
                if self.book.unwritten and now - last_retry >= RETRY_CASES_S:
                    self.book.retry_unwritten()
                    last_retry = now
                if display:
                    display.update(render(self))
                elif now - last_log >= 60:
                    self.console.print(status_line(self, now), markup=False)
                    last_log = now
                time.sleep(POLL_INTERVAL_S)
        finally:
            self.stop.set()
            self.halt.set()
            for index, slot in enumerate(self.slots):
                if slot.process is not None and slot.process.is_alive():
                    # Read while waiting: a worker blocks on a full channel.
                    ends = time.monotonic() + SIGNAL_GRACE_S
                    while slot.process.is_alive() and time.monotonic() < ends:
                        self.drain(index)
                        slot.process.join(POLL_INTERVAL_S)
                    if slot.process.is_alive():
                        kill_group(slot.process)
                        slot.process.join()
                    self.drain(index)
                    self.losses.cut_short(index, "the run ended")
                if slot.process is not None:
                    kill_group(slot.process)
            self.sweep_strays()
            if display:
                display.update(render(self))
                display.stop()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.book.retry_unwritten()
            if held is not None:
                held.restore()
            if signals is not None:
                signals.delegate = None
        return self.report()

    def report(self) -> dict[str, Any]:
        return build_report(self)

    # -- what did not run, for the report

    @property
    def target_load_s(self) -> float | None:
        return round(self.loaded.seconds, 3) if self.loaded else None

    def not_applicable(self) -> dict[str, str]:
        return dict(self.loaded.not_applicable) if self.loaded else {}

    def not_run(self) -> dict[str, str]:
        """Each round the run selected that got no example, with why."""
        if self.loaded is None:
            return {}
        missing = [name for name in self.loaded.rounds if not self.per_property.get(name)]
        if not missing:
            return {}
        if self.config.max_examples is not None and self.stopped_by is None:
            ended = f"--max-examples {self.config.max_examples} was spent"
        else:
            ended = f"{self.stopped_by or 'the stop'} came"
        why = (f"no example: {ended} before the rotation reached it (rounds of --chunk "
               f"{self.config.chunk} examples, one property at a time; give the run more time "
               "or examples, a smaller --chunk, or choose with --only)")
        return dict.fromkeys(missing, why)

    def nothing_checked(self) -> str | None:
        """Why no example ran; None when one did."""
        if sum(stats.examples for stats in self.stats):
            return None
        if self.not_started:
            return self.not_started
        load = (f"the target had loaded {self.loaded_after:.1f} s after the run started (its "
                f"import {self.loaded.seconds:.1f} s of it, in a child process); then "
                if self.loaded else "")
        ended = self.halting_since or self.stopping_since or time.monotonic()
        stop = (f"{self.stopped_by or 'the stop'} came {ended - self.started:.1f} s after the "
                "run started" + (f" (--minutes {self.config.minutes:g})"
                                 if self.config.minutes else ""))
        starting = [index for index, slot in enumerate(self.slots)
                    if slot.process is not None and not slot.ready]
        if starting and len(starting) == len(self.slots):
            waited = max(0.0, ended - min(self.slots[i].spawned for i in starting))
            return (f"no worker was ready before the run stopped: {load}the workers were still "
                    f"starting (importing torch, the kernels and the target) {waited:.1f} s "
                    f"after their start, when {stop}")
        return (f"the workers started, but the run stopped before any example ended: "
                f"{load}{stop}")


def run_fuzz(config: FuzzConfig, console=None, signals: RunSignals | None = None,
             started: float | None = None, target_origin: str | None = None
             ) -> dict[str, Any]:
    """Run the fuzzer with ``config``; the report (also written to
    ``config.report``, and summed up on the console). Every path is checked
    first, then the target is loaded (in a child): a
    :class:`~c128a.failures.UsageError` before any worker starts (naming
    ``target_origin``, where the target's spec came from, when given).
    ``started`` (a ``time.monotonic()``, by default now) is when the run
    started: its deadline counts from there. ``signals`` (held by the
    caller since its own start-up, else held here) handle SIGINT, SIGTERM
    and SIGHUP in every phase (:mod:`.signals`): one before any worker
    starts raises :class:`~.signals.RunInterrupted` out of here, with
    nothing to report."""
    console = console or Console(stderr=True)
    with contextlib.nullcontext(signals) if signals else RunSignals() as signals:
        check_paths(config)
        supervisor = Supervisor(config, console, started=started)
        supervisor.strays.adopt()
        try:
            supervisor.load_target(target_origin)
            supervisor.run(signals)
            return end_run(supervisor, supervisor.config, console, signals)
        except RunInterrupted as stop:
            if not supervisor.ran:  # while the target loaded: nothing ran, no report
                raise
            # between the rounds' end and the report
            return end_interrupted(supervisor, supervisor.config, console, signals, stop)
        finally:
            shutil.rmtree(supervisor.run_dir, ignore_errors=True)
            supervisor.strays.release()
