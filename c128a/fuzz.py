"""``c128a fuzz``: run the property suite and the serving-loop machine for a time.

The parent process supervises; the work happens in worker processes
(multiprocessing's spawn context, safe with CUDA), one per GPU on CUDA (each
pinned to its GPU) or one per core on the CPU. Each worker runs rounds of
Hypothesis tests, one property at a time (round-robin), then a round of the
stateful serving-loop machine, each round with a seed derived from
``--seed``. Failures are shrunk by Hypothesis, remembered in the example
database (``--db``: a directory, or ``redis://HOST:PORT/N`` shared across
machines) and written as case files (:mod:`c128a.cases`).

Isolation: before every example a worker writes the input to its in-flight
file. A worker that dies (a CUDA fault, a signal) or runs one example past
``--example-timeout`` is killed and restarted; the parent keeps the in-flight
input as a ``crash`` or ``hang`` case. Only that worker's current example is
lost.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import queue as queue_module
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import tomllib
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cases import (
    DEFAULT_CASES_DIR,
    DEFAULT_MACHINE,
    DEFAULT_PROPERTIES,
    SERVING_LOOP,
    Case,
    atomic_write_json,
    batch_from_json,
    case_filename,
    import_object,
    new_case,
    versions,
    write_case,
)

REPORT_FORMAT = "c128a-fuzz-report/1"
DEFAULT_DB = ".hypothesis/fuzz"
PROGRESS_INTERVAL_S = 0.5
POLL_INTERVAL_S = 0.1
STARTUP_TIMEOUT_S = 600.0
CUDA_FAULT_EXIT = 3  # a worker's exit status after a CUDA fault
BLOB_PATTERN = re.compile(r"@reproduce_failure\('([^']+)', b'([^']+)'\)")


@dataclass
class FuzzConfig:
    """Everything a run needs; picklable, so spawned workers receive it whole."""

    target: str = "triton"
    device: str = "cpu"
    minutes: float | None = None
    max_examples: int | None = None
    max_tokens: int | None = None  # None: each property's default step size
    seed: int = 0
    workers: int = 1
    db: str = DEFAULT_DB
    cases_dir: str = DEFAULT_CASES_DIR
    report: str | None = None
    example_timeout: float = 300.0
    exitfirst: bool = False
    profile: str = "fuzz"
    chunk: int = 25
    only: tuple[str, ...] = ()
    stateful: bool = True
    properties: str = DEFAULT_PROPERTIES
    machine: str | None = DEFAULT_MACHINE
    gpu_count: int = 0
    max_restarts: int = 25
    live: bool | None = None  # None: a live display when stderr is a terminal


def derive_seed(seed: int, *parts: int) -> int:
    """A 32-bit seed for one worker round: reproducible from ``--seed`` alone."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def reproduce_blob(exc: BaseException) -> str | None:
    """The blob of Hypothesis's ``@reproduce_failure`` note (print_blob=True)."""
    text = "\n".join([str(exc), *getattr(exc, "__notes__", ())])
    match = BLOB_PATTERN.search(text)
    return match.group(2) if match else None


def is_cuda_fault(exc: BaseException) -> bool:
    """A CUDA error (illegal address, launch failure): the context is unusable after it."""
    return type(exc).__name__ == "AcceleratorError" or (
        isinstance(exc, RuntimeError) and "CUDA error" in str(exc)
    )


def failure_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if not str(exc).strip():
        text += "\n" + "".join(traceback.format_exception(exc, limit=-1)).rstrip()
    return text


def open_database(spec: str | None):
    """The Hypothesis example database named by ``--db``."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    if not spec or spec == "none":
        return None
    if spec.startswith("redis://"):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(spec))
    return DirectoryBasedExampleDatabase(spec)


# ---------------------------------------------------------------- worker side


class _StopRequested(BaseException):
    """Raised inside a test to end a round early; Hypothesis lets it through."""


class _Progress:
    """Counts examples and labels; sends them to the parent every so often."""

    def __init__(self, channel, index: int):
        self.channel, self.index = channel, index
        self.examples = 0  # since the last flush
        self.total = 0
        self.labels: Counter[str] = Counter()
        self.per_property: Counter[str] = Counter()
        self.sent_at = time.monotonic()
        self.running = ""

    def count(self, name: str, labels=()) -> None:
        self.examples += 1
        self.total += 1
        self.per_property[name] += 1
        self.labels.update(labels)
        if time.monotonic() - self.sent_at >= PROGRESS_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        self.channel.put(
            ("progress", self.index, {
                "examples": self.examples,
                "labels": dict(self.labels),
                "per_property": dict(self.per_property),
                "running": self.running,
            })
        )
        self.examples = 0
        self.labels.clear()
        self.per_property.clear()
        self.sent_at = time.monotonic()


class _Worker:
    def __init__(self, index, generation, config, channel, stop, inflight, budget):
        import torch
        from hypothesis import settings

        from . import profiles
        from .device import use_device
        from .targets import load_target

        self.index, self.generation, self.config = index, generation, config
        self.channel, self.stop, self.inflight, self.budget = channel, stop, Path(inflight), budget
        self.device_name = use_device(config.device)
        if self.device_name == "cpu" and config.workers > 1:
            torch.set_num_threads(1)  # one worker per core
        self.device = torch.device(self.device_name)
        profiles.register_profiles()
        self.profile = settings.get_profile(config.profile)
        self.target = load_target(config.target)
        properties = import_object(config.properties)
        names = config.only or tuple(properties)
        unknown = sorted(set(names) - set(properties) - {SERVING_LOOP})
        if unknown:
            raise ValueError(
                f"--only names unknown properties {', '.join(unknown)}; known: "
                f"{', '.join([*properties, SERVING_LOOP])}"
            )
        self.properties = [properties[name] for name in names if name != SERVING_LOOP]
        self.machine_factory = None
        if config.stateful and config.machine and (not config.only or SERVING_LOOP in config.only):
            self.machine_factory = import_object(config.machine)
        self.database = open_database(config.db)
        self.progress = _Progress(channel, index)

    def write_inflight(self, name: str, seed: int, batch=None) -> None:
        atomic_write_json(
            self.inflight,
            {"property": name, "seed": seed, "batch": batch.to_json() if batch else None},
        )

    def die_of_cuda_fault(self, name: str, seed: int, batch, exc: BaseException) -> None:
        """A CUDA fault poisons the context: every later example would fail too,
        and shrinking would keep a wrong input. Keep this one and exit now."""
        record = {"property": name, "seed": seed, "batch": batch.to_json() if batch else None,
                  "fault": failure_text(exc)}
        atomic_write_json(self.inflight, record)
        self.progress.flush()
        self.channel.close()
        self.channel.join_thread()
        os._exit(CUDA_FAULT_EXIT)

    def send_case(self, case: Case) -> None:
        self.progress.flush()
        self.channel.put(("failure", self.index, case.to_json()))

    def loop(self) -> None:
        rounds = [*self.properties, *([SERVING_LOOP] if self.machine_factory else [])]
        if not rounds:
            raise ValueError("no property selected (check --only)")
        number = 0
        while not self.stop.is_set() and (
            self.budget is None or self.progress.total < self.budget
        ):
            item = rounds[number % len(rounds)]
            seed = derive_seed(self.config.seed, self.index, self.generation, number)
            examples = self.config.chunk
            if self.budget is not None:
                examples = min(examples, self.budget - self.progress.total)
            if item == SERVING_LOOP:
                # A machine example is a whole step sequence: fewer per round.
                self.machine_round(seed, max(1, examples // 5))
            else:
                self.property_round(item, seed, examples)
            self.progress.flush()
            number += 1

    def strategy_of(self, prop):
        """The property's strategy, at --max-tokens when given."""
        if self.config.max_tokens is None:
            return prop.strategy(self.target)
        return prop.strategy(self.target, max_tokens=self.config.max_tokens)

    def round_settings(self, examples: int):
        """Settings of one round: the run's profile and database, seeded by the round."""
        from hypothesis import settings

        return settings(
            parent=self.profile,
            database=self.database,
            max_examples=examples,
            report_multiple_bugs=False,
            print_blob=True,
            derandomize=False,
        )

    def property_round(self, prop, seed: int, examples: int) -> None:
        from hypothesis import given
        from hypothesis import seed as use_seed

        failing: list = []

        def fuzz_example(batch):
            if self.stop.is_set() and not failing:
                raise _StopRequested
            self.write_inflight(prop.name, seed, batch)
            self.progress.count(prop.name, getattr(batch, "labels", ()))
            try:
                prop.check(self.target, batch, self.device)
            except Exception as exc:
                if is_cuda_fault(exc):
                    self.die_of_cuda_fault(prop.name, seed, batch, exc)
                failing[:] = [batch, exc]
                raise

        # Keyed by property name, so that every worker, run and machine sharing
        # the database replays the failures of that property.
        fuzz_example._hypothesis_internal_add_digest = f"c128a-fuzz:{prop.name}".encode()
        # settings() outside seed(): @seed alone switches the database off.
        test = self.round_settings(examples)(
            use_seed(seed)(given(self.strategy_of(prop))(fuzz_example))
        )
        self.progress.running = prop.name
        try:
            test()
        except _StopRequested:
            return
        except Exception as exc:
            if not failing:
                raise  # the strategy or a health check failed: not a finding
            batch, original = failing
            self.send_case(
                new_case(
                    property=prop.name,
                    target=self.target.spec,
                    kind="failure",
                    failure=failure_text(original),
                    batch=batch,
                    device=self.device_name,
                    seed=seed,
                    reproduce_blob=reproduce_blob(exc),
                )
            )

    def machine_round(self, seed: int, examples: int) -> None:
        from hypothesis import seed as use_seed
        from hypothesis.stateful import run_state_machine_as_test

        machine = self.machine_factory(self.target, self.device)
        worker = self

        def start_example(machine_self):
            worker.write_inflight(SERVING_LOOP, seed)
            worker.progress.count(SERVING_LOOP)
            machine.__init__(machine_self)

        counted = use_seed(seed)(type(machine.__name__, (machine,), {"__init__": start_example}))
        self.progress.running = SERVING_LOOP
        try:
            run_state_machine_as_test(
                counted,
                settings=self.round_settings(examples),
            )
        except Exception as exc:
            if is_cuda_fault(exc):
                self.die_of_cuda_fault(SERVING_LOOP, seed, None, exc)
            notes = [n for n in getattr(exc, "__notes__", ()) if "reproduce_failure" not in n]
            self.send_case(
                new_case(
                    property=SERVING_LOOP,
                    target=self.target.spec,
                    kind=SERVING_LOOP,
                    failure=failure_text(exc),
                    device=self.device_name,
                    seed=seed,
                    reproduce_blob=reproduce_blob(exc),
                    steps="\n".join(notes),
                )
            )


def worker_main(index, generation, config, channel, stop, inflight, budget, gpu) -> None:
    """A worker process: pin, choose the device, load everything, run rounds."""
    try:
        if gpu is not None:
            from .gpus import pin_to_gpu

            pin_to_gpu(gpu)
        worker = _Worker(index, generation, config, channel, stop, inflight, budget)
        channel.put(("ready", index, None))
        worker.loop()
        worker.progress.flush()
    except Exception as exc:
        channel.put(("fatal", index, f"{failure_text(exc)}\n{traceback.format_exc(limit=-4)}"))
    else:
        channel.put(("done", index, None))


# ---------------------------------------------------------------- parent side


@dataclass
class WorkerStats:
    index: int
    gpu: int | None = None
    examples: int = 0
    failures: int = 0
    crashes: int = 0
    hangs: int = 0
    restarts: int = 0
    running: str = ""
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    state: str = "starting"

    def rate(self, now: float) -> float:
        elapsed = (self.finished or now) - self.started
        return self.examples / elapsed if elapsed > 0 else 0.0


@dataclass
class _Slot:
    process: Any = None
    channel: Any = None
    generation: int = 0
    spawned: float = 0.0
    activity: float = 0.0
    ready: bool = False
    finished: bool = False


class Supervisor:
    """Spawns, watches and restarts workers; collects progress and cases."""

    def __init__(self, config: FuzzConfig, console=None):
        import multiprocessing

        from rich.console import Console

        self.config = config
        self.context = multiprocessing.get_context("spawn")
        self.console = console or Console(stderr=True)
        self.stop = self.context.Event()
        self.run_dir = Path(tempfile.mkdtemp(prefix="c128a-fuzz-"))
        self.slots = [_Slot() for _ in range(config.workers)]
        self.stats = [WorkerStats(i) for i in range(config.workers)]
        self.labels: Counter[str] = Counter()
        self.per_property: Counter[str] = Counter()
        self.cases: list[dict[str, Any]] = []
        self.seen_failures: set[str] = set()
        self.fatal: str | None = None
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.deadline = self.started + config.minutes * 60 if config.minutes else None
        self.stopping_since: float | None = None
        shares = None
        if config.max_examples is not None:
            shares = [
                config.max_examples // config.workers
                + (1 if i < config.max_examples % config.workers else 0)
                for i in range(config.workers)
            ]
        self.budgets = shares

    # -- workers

    def inflight_path(self, index: int) -> Path:
        return self.run_dir / f"worker-{index}.json"

    def spawn(self, index: int) -> None:
        slot, stats = self.slots[index], self.stats[index]
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
            from .gpus import gpu_for_worker

            gpu = gpu_for_worker(index, self.config.gpu_count)
        stats.gpu = gpu
        slot.channel = self.context.Queue()
        slot.process = self.context.Process(
            target=worker_main,
            args=(index, slot.generation, self.config, slot.channel, self.stop,
                  str(self.inflight_path(index)), budget, gpu),
            name=f"c128a-fuzz-{index}",
            daemon=True,
        )
        slot.process.start()
        slot.spawned = slot.activity = time.monotonic()
        slot.ready = False
        stats.state = "starting"

    def restart(self, index: int) -> None:
        slot, stats = self.slots[index], self.stats[index]
        if slot.channel is not None:
            slot.channel.close()
            slot.channel.cancel_join_thread()
        if stats.restarts >= self.config.max_restarts or self.stop.is_set():
            slot.finished = True
            stats.state = "gave up" if not self.stop.is_set() else "stopped"
            return
        stats.restarts += 1
        slot.generation += 1
        self.spawn(index)

    def lost_input_case(self, index: int, kind: str, message: str) -> None:
        """Keep what the worker was running when it died or hung as a case."""
        path = self.inflight_path(index)
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            record = None
        if record is None:
            self.cases.append({"path": None, "property": None, "kind": kind, "new": False,
                               "failure": message + " (before its first example)"})
            return
        batch = batch_from_json(record["batch"]) if record.get("batch") else None
        if record.get("fault"):
            message += f": {record['fault']}"
        case = new_case(
            property=record["property"],
            target=self.config.target,
            kind=kind,
            failure=message,
            batch=batch,
            device=self.config.device,
            seed=record.get("seed"),
            steps=None if batch else "the serving-loop example running when the worker was lost",
        )
        self.record_case(case)

    def record_case(self, case: Case) -> None:
        path, new = write_case(case, self.config.cases_dir)
        self.cases.append({"path": str(path), "property": case.property, "kind": case.kind,
                           "new": new, "failure": case.failure.splitlines()[0][:300]})
        if self.config.exitfirst:
            self.request_stop()

    def request_stop(self) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            self.stop.set()

    def drain(self, index: int) -> None:
        from .cases import case_from_json

        slot, stats = self.slots[index], self.stats[index]
        while slot.channel is not None:
            try:
                kind, _, payload = slot.channel.get_nowait()
            except (queue_module.Empty, OSError, ValueError, EOFError):
                return
            slot.activity = time.monotonic()
            if kind == "ready":
                slot.ready, stats.state = True, "running"
            elif kind == "progress":
                stats.examples += payload["examples"]
                stats.running = payload["running"]
                self.labels.update(payload["labels"])
                self.per_property.update(payload["per_property"])
            elif kind == "failure":
                # Later rounds replay a saved failure from the database: count it once.
                case = case_from_json(payload)
                if case_filename(case) not in self.seen_failures:
                    self.seen_failures.add(case_filename(case))
                    stats.failures += 1
                    self.record_case(case)
            elif kind == "fatal":
                self.fatal = f"worker {index}: {payload}"
                self.request_stop()
            elif kind == "done":
                slot.finished, stats.state, stats.finished = True, "done", time.monotonic()

    def check(self, index: int, now: float) -> None:
        slot, stats = self.slots[index], self.stats[index]
        if slot.finished or slot.process is None:
            return
        process = slot.process
        if not process.is_alive():
            process.join()
            self.drain(index)
            if slot.finished or self.fatal:
                slot.finished = True
                return
            if self.stopping_since is not None and process.exitcode == 0:
                slot.finished, stats.state = True, "stopped"
                return
            code = process.exitcode
            how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit {code}"
            if code == CUDA_FAULT_EXIT:
                how = "CUDA fault"
            if not slot.ready:
                # Dying before its first example is a setup problem: restarting repeats it.
                self.fatal = f"worker {index} died during start-up ({how})"
                slot.finished, stats.state = True, "failed to start"
                self.request_stop()
                return
            stats.crashes += 1
            self.lost_input_case(index, "crash", f"worker {index} died ({how}) running this input")
            self.restart(index)
            return
        try:
            inflight_time = self.inflight_path(index).stat().st_mtime
            activity = max(slot.activity, time.monotonic() - (time.time() - inflight_time))
        except OSError:
            activity = slot.activity
        limit = self.config.example_timeout if slot.ready else STARTUP_TIMEOUT_S
        if now - activity > limit:
            process.kill()
            process.join()
            stats.hangs += 1
            self.lost_input_case(
                index, "hang",
                f"worker {index} ran one example for more than {limit:g} s "
                "(--example-timeout) and was killed",
            )
            self.restart(index)

    # -- the run

    def run(self) -> dict[str, Any]:
        from rich.live import Live

        for index in range(self.config.workers):
            self.spawn(index)
        live = self.config.live if self.config.live is not None else self.console.is_terminal
        last_log = time.monotonic()
        display = Live(self.render(), console=self.console, refresh_per_second=4) if live else None
        try:
            if display:
                display.start()
            while True:
                now = time.monotonic()
                for index in range(self.config.workers):
                    self.drain(index)
                    self.check(index, now)
                if self.deadline is not None and now >= self.deadline:
                    self.request_stop()
                if all(slot.finished for slot in self.slots):
                    break
                grace = max(30.0, self.config.example_timeout)
                if self.stopping_since is not None and now - self.stopping_since > grace:
                    for index, slot in enumerate(self.slots):
                        if not slot.finished and slot.process is not None:
                            slot.process.kill()
                            slot.process.join()
                            slot.finished, self.stats[index].state = True, "killed at stop"
                    break
                if display:
                    display.update(self.render())
                elif now - last_log >= 60:
                    self.console.print(self.status_line(now), markup=False)
                    last_log = now
                time.sleep(POLL_INTERVAL_S)
        finally:
            self.stop.set()
            for slot in self.slots:
                if slot.process is not None and slot.process.is_alive():
                    slot.process.join(timeout=5)
                    if slot.process.is_alive():
                        slot.process.kill()
            if display:
                display.update(self.render())
                display.stop()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return self.report()

    # -- output

    def remaining(self, now: float) -> str:
        if self.deadline is None:
            return "-"
        return _duration(max(0.0, self.deadline - now))

    def render(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        table = Table(title=f"c128a fuzz: {self.config.target} on {self.config.device}",
                      title_justify="left")
        for column in ("worker", "state", "running", "examples", "ex/s", "failures",
                       "restarts", "elapsed", "remaining"):
            table.add_column(column, justify="right" if column in ("examples", "ex/s") else "left")
        for stats in self.stats:
            where = f"{stats.index}" + (f" (GPU {stats.gpu})" if stats.gpu is not None else "")
            table.add_row(
                where, stats.state, stats.running, str(stats.examples), f"{stats.rate(now):.1f}",
                str(stats.failures + stats.crashes + stats.hangs), str(stats.restarts),
                _duration(now - self.started), self.remaining(now),
            )
        coverage = ", ".join(f"{label}: {count}" for label, count in sorted(self.labels.items()))
        return Group(table, Text(f"coverage: {coverage or '-'}"))

    def status_line(self, now: float) -> str:
        parts = [
            f"w{s.index} {s.state} {s.examples} ex {s.rate(now):.1f}/s "
            f"{s.failures + s.crashes + s.hangs} fail"
            for s in self.stats
        ]
        return f"[{_duration(now - self.started)} / {self.remaining(now)} left] " + "; ".join(parts)

    def report(self) -> dict[str, Any]:
        now = time.monotonic()
        elapsed = now - self.started
        examples = sum(s.examples for s in self.stats)
        failures = sum(s.failures for s in self.stats)
        crashes = sum(s.crashes for s in self.stats)
        hangs = sum(s.hangs for s in self.stats)
        found = failures + crashes + hangs
        status = "aborted" if self.fatal else ("failures" if found else "clean")
        return {
            "format": REPORT_FORMAT,
            "target": self.config.target,
            "device": self.config.device,
            "seed": self.config.seed,
            "profile": self.config.profile,
            "workers": self.config.workers,
            "minutes": self.config.minutes,
            "max_examples": self.config.max_examples,
            "max_tokens": self.config.max_tokens,
            "database": self.config.db,
            "cases_dir": self.config.cases_dir,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started_wall)),
            "elapsed_s": round(elapsed, 3),
            "status": status,
            "exit_status": 2 if self.fatal else (1 if found else 0),
            "error": self.fatal,
            "totals": {
                "examples": examples,
                "examples_per_s": round(examples / elapsed, 3) if elapsed else 0.0,
                "failures": failures,
                "crashes": crashes,
                "hangs": hangs,
                "restarts": sum(s.restarts for s in self.stats),
                "new_cases": sum(1 for c in self.cases if c["new"]),
            },
            "per_worker": [
                {
                    "worker": s.index,
                    "gpu": s.gpu,
                    "examples": s.examples,
                    "examples_per_s": round(s.rate(now), 3),
                    "failures": s.failures,
                    "crashes": s.crashes,
                    "hangs": s.hangs,
                    "restarts": s.restarts,
                    "state": s.state,
                }
                for s in self.stats
            ],
            "per_property": dict(sorted(self.per_property.items())),
            "coverage": dict(sorted(self.labels.items())),
            "cases": self.cases,
            "versions": versions(),
        }


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def summary_table(report: dict[str, Any]):
    from rich.table import Table

    steps = f", steps of up to {report['max_tokens']} tokens" if report.get("max_tokens") else ""
    table = Table(title=f"c128a fuzz summary: {report['target']} on {report['device']}, "
                  f"seed {report['seed']}{steps}, {report['elapsed_s']:.0f} s, {report['status']}",
                  title_justify="left")
    for column in ("worker", "examples", "ex/s", "failures", "crashes", "hangs", "restarts"):
        table.add_column(column, justify="right")
    for row in report["per_worker"]:
        table.add_row(str(row["worker"]), str(row["examples"]), f"{row['examples_per_s']:.1f}",
                      str(row["failures"]), str(row["crashes"]), str(row["hangs"]),
                      str(row["restarts"]))
    totals = report["totals"]
    table.add_row("all", str(totals["examples"]), f"{totals['examples_per_s']:.1f}",
                  str(totals["failures"]), str(totals["crashes"]), str(totals["hangs"]),
                  str(totals["restarts"]), style="bold")
    return table


def run_fuzz(config: FuzzConfig, console=None) -> dict[str, Any]:
    """Run the fuzzer with ``config``; the report (also written to ``config.report``)."""
    from rich.console import Console

    console = console or Console(stderr=True)
    supervisor = Supervisor(config, console)
    report = supervisor.run()
    console.print(summary_table(report))
    if report["coverage"]:
        console.print(
            "coverage: " + ", ".join(f"{k}: {v}" for k, v in report["coverage"].items()),
            markup=False,
        )
    for case in report["cases"]:
        if case["path"]:
            note = "new" if case["new"] else "already saved"
            console.print(f"{case['kind']} case ({note}): {case['path']}\n  {case['failure']}",
                          markup=False)
        else:
            console.print(f"{case['kind']}: {case['failure']}", markup=False)
    if report["error"]:
        console.print(f"run aborted: {report['error']}", markup=False)
    if config.report:
        atomic_write_json(Path(config.report), report)
    return report


# ---------------------------------------------------------------- command line

DEFAULTS: dict[str, Any] = {
    "target": None,
    "device": None,
    "minutes": None,
    "max_examples": None,
    "max_tokens": None,
    "seed": None,
    "workers": None,
    "db": DEFAULT_DB,
    "cases_dir": DEFAULT_CASES_DIR,
    "report": None,
    "example_timeout": 300.0,
    "exitfirst": False,
    "profile": "fuzz",
    "chunk": 25,
    "only": None,
    "stateful": True,
    "properties": DEFAULT_PROPERTIES,
    "machine": DEFAULT_MACHINE,
    "live": None,
}
_CONFIG_TYPES: dict[str, type | tuple[type, ...]] = {
    "target": str, "device": str, "minutes": (int, float), "max_examples": int,
    "max_tokens": int, "seed": int,
    "workers": int, "db": str, "cases_dir": str, "report": str,
    "example_timeout": (int, float), "exitfirst": bool, "profile": str, "chunk": int,
    "only": (str, list), "stateful": bool, "properties": str, "machine": str,
}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from .cli import add_target_arguments

    add_target_arguments(parser)
    parser.add_argument(
        "--config", metavar="FILE",
        help="TOML file with a [fuzz] table of these options; the command line wins",
    )
    parser.add_argument("--minutes", type=float, metavar="M",
                        help="run for M minutes (fractions allowed); the default without "
                        "--max-examples is 1")
    parser.add_argument("--max-examples", type=int, metavar="N",
                        help="stop after N examples in all (shared among the workers)")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help="draw engine steps of up to N tokens (more requests, longer "
                        "prefill chunks; default: each property's own size, 32 for most)")
    parser.add_argument("--seed", type=int,
                        help="seed of the whole run (default: random, reported)")
    parser.add_argument(
        "--workers", type=int, metavar="K",
        help="worker processes (default: one per GPU on CUDA, one per core on the CPU)",
    )
    parser.add_argument("--db", metavar="PATH|redis://HOST:PORT/N",
                        help=f"Hypothesis example database (default {DEFAULT_DB}; 'none' for none)")
    parser.add_argument("--cases-dir", metavar="DIR",
                        help=f"where failure cases are written (default {DEFAULT_CASES_DIR})")
    parser.add_argument("--report", metavar="FILE", help="write the JSON report here")
    parser.add_argument("--example-timeout", type=float, metavar="S",
                        help="kill and restart a worker whose example runs longer (default 300)")
    parser.add_argument("-x", "--exitfirst", action="store_true", default=None,
                        help="stop at the first failure")
    parser.add_argument("--profile",
                        help="Hypothesis profile the rounds derive from (default fuzz)")
    parser.add_argument("--chunk", type=int, metavar="N",
                        help="examples per Hypothesis round before the next property (default 25)")
    parser.add_argument("--only", metavar="NAMES",
                        help="comma-separated properties to run (serving_loop: the machine)")
    parser.add_argument("--no-stateful", dest="stateful", action="store_false", default=None,
                        help="skip the serving-loop machine")
    parser.add_argument("--properties", metavar="MODULE:ATTR",
                        help=f"property mapping to fuzz (default {DEFAULT_PROPERTIES})")
    parser.add_argument("--machine", metavar="MODULE:ATTR",
                        help=f"serving-loop machine factory (default {DEFAULT_MACHINE})")
    parser.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                        help="live status display (default: when stderr is a terminal)")


def usage_error(message: str) -> SystemExit:
    """Print ``message`` and give the exit (status 2: 1 means failures were found)."""
    print(f"c128a fuzz: {message}", file=sys.stderr)
    return SystemExit(2)


def load_config_file(path: str) -> dict[str, Any]:
    """The ``[fuzz]`` table of a TOML file, checked key by key."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise usage_error(f"--config {path}: cannot read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise usage_error(f"--config {path}: not TOML: {exc}") from exc
    table = data.get("fuzz", {})
    values = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        expected = _CONFIG_TYPES.get(name)
        if expected is None:
            raise usage_error(f"--config {path}: unknown key fuzz.{key}; "
                             f"known: {', '.join(sorted(_CONFIG_TYPES))}")
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            raise usage_error(f"--config {path}: fuzz.{key}={value!r} has the "
                             "wrong type")
        values[name] = value
    return values


def resolve_options(args: argparse.Namespace) -> dict[str, Any]:
    """Each option from the command line, else the config file, else its default."""
    from_file = load_config_file(args.config) if getattr(args, "config", None) else {}
    options = {}
    for name, default in DEFAULTS.items():
        value = getattr(args, name, None)
        options[name] = value if value is not None else from_file.get(name, default)
    return options


def default_workers(device: str) -> tuple[int, int]:
    """(workers, GPUs): one per visible GPU on CUDA, one per usable core on the CPU."""
    if device == "cuda":
        from .gpus import visible_gpu_count

        gpus = visible_gpu_count()
        return max(gpus, 1), gpus
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(cores, 1), 0


def config_from_args(args: argparse.Namespace) -> FuzzConfig:
    from .cli import prepare

    options = resolve_options(args)
    args.target, args.device = options["target"], options["device"]
    device, target, _ = prepare(args)
    workers, gpus = default_workers(device)
    if options["workers"] is not None:
        if options["workers"] < 1:
            raise usage_error(f"--workers={options['workers']} must be >= 1")
        workers = options["workers"]
    for name in ("minutes", "example_timeout"):
        if options[name] is not None and not (options[name] > 0 and math.isfinite(options[name])):
            raise usage_error(f"--{name.replace('_', '-')}={options[name]} must be > 0")
    for name in ("max_examples", "chunk", "max_tokens"):
        if options[name] is not None and options[name] < 1:
            raise usage_error(f"--{name.replace('_', '-')}={options[name]} must be >= 1")
    from .profiles import PROFILES

    if options["profile"] not in PROFILES:
        raise usage_error(f"--profile={options['profile']!r} is not one of "
                         f"{', '.join(PROFILES)} (c128a/profiles.py)")
    if str(options["db"]).startswith("redis://"):
        try:
            import redis  # noqa: F401
        except ImportError as exc:
            raise usage_error(f"--db {options['db']} needs the redis client: "
                             "pip install -e '.[redis]'") from exc
    minutes = options["minutes"]
    if minutes is None and options["max_examples"] is None:
        minutes = 1.0
    only = options["only"]
    if isinstance(only, str):
        only = [name.strip() for name in only.split(",") if name.strip()]
    seed = options["seed"] if options["seed"] is not None else random.SystemRandom().getrandbits(32)
    return FuzzConfig(
        target=target.spec,
        device=device,
        minutes=minutes,
        max_examples=options["max_examples"],
        max_tokens=options["max_tokens"],
        seed=seed,
        workers=workers,
        db=options["db"],
        cases_dir=options["cases_dir"],
        report=options["report"],
        example_timeout=float(options["example_timeout"]),
        exitfirst=bool(options["exitfirst"]),
        profile=options["profile"],
        chunk=options["chunk"],
        only=tuple(only or ()),
        stateful=bool(options["stateful"]),
        properties=options["properties"],
        machine=options["machine"] or None,
        gpu_count=gpus,
        live=options["live"],
    )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    return int(run_fuzz(config)["exit_status"])


