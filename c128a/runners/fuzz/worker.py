"""A fuzz worker: rounds of Hypothesis tests, one property at a time.

Each round runs one property through :meth:`c128a.checks.Property.test` (the
same test pytest and the kill matrix run), seeded from ``--seed``, the
worker, its restart generation and the round; then, in turn, a round of the
stateful serving-loop machine. The contract's historical steps (the
properties' ``@example`` batches) run in a worker's first round of each
property only: they are fixed inputs, and Hypothesis prints every explicit
example it runs, which made them most of a round's cost. Before every
example the worker writes the input to its in-flight file, so that the
parent keeps it if the worker dies. The rounds rotate over the properties
(and the machine), worker ``i`` starting at the ``i``-th, and a restarted
worker at the round after the one it was lost in: a target that crashes
often is still fuzzed on every property.

A round's first failing example is sent before shrinking starts, and each
smaller one as shrinking finds it (:class:`~.observe.ShrinkReports`): the
run's stop (``halt``: the deadline, a signal) ends the shrinking at the next
example, and the supervisor keeps the smallest failing example found by
then. A stop that only ends the search (``stop``: ``--exitfirst``) lets a
failure shrink to its end.

Every example's time is accounted (:class:`c128a.phases.ExampleTimer`, no
device synchronisation): Hypothesis's own draw time, and the target, oracle
and check phases the harness marks; the worker sends the seconds with its
progress, and the parent reports them folded into
:data:`c128a.phases.BUCKETS`. Examples run after a round's first failure
(shrinking) are not timed: their time counts as supervision. The process
around a worker, from its start to its end, is :mod:`.process`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

import torch
from hypothesis import seed as use_seed
from hypothesis import target as hypothesis_target
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import FlakyStrategyDefinition
from hypothesis.errors import InvalidArgument as HypothesisInvalidArgument
from hypothesis.stateful import run_state_machine_as_test

from ... import phases
from ...cases import SERVING_LOOP, Case
from ...checked import load_machine, load_properties
from ...checks import profiles
from ...failures import HarnessError, failure_text, is_cuda_fault, is_kill
from ...files import atomic_write_json
from ...gpu.pinning import share_cores
from ...hypothesis_private import drawn_seconds
from ...replay.recorded import machine_steps_of
from ...strategies.pairs import pair_labels_of
from ...strategies.reach import labels_of
from ...targets import load_target, use_device
from . import protocol
from .config import FuzzConfig, derive_seed
from .inflight import InflightFile, InflightRecord, case_from_inflight, step_key
from .observe import FailureBlob, ProgressCounter, ShrinkReports

CUDA_FAULT_EXIT = 3  # a worker's exit status after a CUDA fault
TERMINATED = threading.Event()
"""Set by SIGTERM: this worker stops after its example."""
RUN_STOP_WAIT_S = 2.0
"""How long a worker stopped by SIGTERM waits for the run's stop: a SIGTERM to
the process group reaches the parent too, which sets the stop at once."""


def open_database(spec: str | None):
    """The Hypothesis example database named by ``--db``."""
    if not spec or spec == "none":
        return None
    if spec.startswith("redis://"):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(spec))
    return DirectoryBasedExampleDatabase(spec)

NEW_PAIRS_TARGET = "pair cells not yet drawn"
"""The ``target()`` label scoring an example by the pair cells it drew first."""


class StopRequested(BaseException):
    """Raised inside a test to end a round early; Hypothesis lets it through."""


def selection(config: FuzzConfig, target) -> tuple[list, dict[str, str], object]:
    """What a run of ``config`` on ``target`` fuzzes: (the properties, in
    ``--only``'s order, that apply to the target; those that do not, each
    with why; the serving-loop machine's factory, None when it does not run)."""
    properties = load_properties(config.properties)
    names = config.only or tuple(properties)
    unknown = sorted(set(names) - set(properties) - {SERVING_LOOP})
    if unknown:  # the parent checked; a mapping that changed since is the suite's fault
        raise HarnessError(f"--only names unknown properties {', '.join(unknown)}")
    runs, not_applicable = [], {}
    for name in names:
        if name == SERVING_LOOP:
            continue
        why = properties[name].unsupported(target)
        if why is None:
            runs.append(properties[name])
        else:
            not_applicable[name] = why
    factory = None
    if config.stateful and config.machine and (not config.only or SERVING_LOOP in config.only):
        factory = load_machine(config.machine)
    return runs, not_applicable, factory


class Worker:
    def __init__(self, index, generation, config: FuzzConfig, channel, stop, inflight, budget,
                 skip_historical=frozenset(), halt=None, first_round: int = 0):
        self.index, self.generation, self.config = index, generation, config
        self.skip_historical = skip_historical  # step_key of historical steps saved as cases
        self.channel, self.stop, self.inflight, self.budget = channel, stop, Path(inflight), budget
        self.halt = halt  # set: a failure's shrinking ends too (None: never)
        self.first_round = first_round  # where in the rotation this worker starts
        self.inflight_file = InflightFile(self.inflight)
        self.device_name = use_device(config.device)
        share_cores(config.workers)  # the oracle and the checks run on the CPU
        self.device = torch.device(self.device_name)
        profiles.register_profiles()
        self.profile = settings.get_profile(config.profile)
        self.target = load_target(config.target, config.padding_rows)
        self.properties, _, factory = selection(config, self.target)
        # One machine class for every round: it captures its graphs once.
        self.machine = factory(self.target, self.device) if factory else None
        self.database = open_database(config.db)
        self.timer = phases.ExampleTimer()
        self.progress = ProgressCounter(channel, index, self.timer)
        self.historical_done: set[str] = set()  # properties whose @example steps ran
        self.pairs_drawn: dict[str, set[str]] = {}  # property -> pair labels drawn here
        self.done = False  # set by a failure under --exitfirst

    def stopping(self) -> bool:
        """No next round, and no next example unless it shrinks a failure."""
        return self.done or self.stop.is_set() or self.halted()

    def halted(self) -> bool:
        """No next example at all: a failure being shrunk stays as small as it got."""
        return TERMINATED.is_set() or (self.halt is not None and self.halt.is_set())

    def send_shrinking(self, case: Case) -> None:
        self.send(protocol.Shrinking(self.index, case))

    def terminated_alone(self) -> bool:
        """Whether this worker stopped for a SIGTERM of its own, not because
        the run is done with it (its budget, --exitfirst, the run's stop)."""
        if not TERMINATED.is_set() or self.done:
            return False
        if self.budget is not None and self.progress.total >= self.budget:
            return False
        return not self.stop.wait(RUN_STOP_WAIT_S)

    def write_inflight(self, name: str, seed: int, batch=None, examples: int | None = None,
                       historical: bool = False) -> None:
        start = time.perf_counter()
        record = self.record(name, seed, batch, examples)
        if historical:
            record = dataclasses.replace(record, historical=True)
        self.inflight_file.write(record.to_json())
        self.timer.charge("inflight", time.perf_counter() - start)

    def record(self, name: str, seed: int, batch=None, examples: int | None = None
               ) -> InflightRecord:
        """The in-flight record of an example of ``name`` in the round of ``seed``."""
        return InflightRecord(property=name, seed=seed, batch=batch, round_examples=examples,
                              profile=self.config.profile,
                              padding_rows=self.target.padding_rows)

    def timed(self, run) -> None:
        """``run()``, one example's check, charged to the example's phases."""
        self.timer.begin(drawn_seconds())
        try:
            run()
        finally:
            self.timer.end(drawn_seconds())

    def die_of_cuda_fault(self, name: str, seed: int, batch, exc: BaseException) -> None:
        """A CUDA fault poisons the context: every later example would fail too,
        and shrinking would keep a wrong input. Keep this one and exit now."""
        # No variant in the record: the supervisor's case takes the run's.
        record = dataclasses.replace(self.record(name, seed, batch), padding_rows=None,
                                     fault=failure_text(exc))
        atomic_write_json(self.inflight, record.to_json())
        self.progress.flush()
        self.channel.close()
        os._exit(CUDA_FAULT_EXIT)

    def send(self, message: protocol.Message) -> None:
        self.progress.flush()
        self.channel.put(message)
        if isinstance(message, protocol.Failure) and self.config.exitfirst:
            # No next round: the supervisor's stop could come after it found
            # a second failure.
            self.done = True

    def failure_case(self, name: str, exc: BaseException, seed: int, batch=None,
                     reproduce_blob: str | None = None) -> Case:
        return case_from_inflight(
            self.record(name, seed, batch), kind="failure", failure=failure_text(exc),
            target=self.target.spec, device=self.device_name, reproduce_blob=reproduce_blob,
        )

    def loop(self) -> None:
        rounds = [*self.properties, *([SERVING_LOOP] if self.machine else [])]
        if not rounds:
            raise HarnessError("no property selected (check --only)")
        number = self.first_round
        while not self.stopping() and (self.budget is None or self.progress.total < self.budget):
            item = rounds[number % len(rounds)]
            # The supervisor learns the round now running: a restart goes on after it.
            self.progress.round = number
            self.progress.running = item if item == SERVING_LOOP else item.name
            self.progress.flush()
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

    def cut_by_the_stop(self, exc: Exception, failed: bool) -> bool:
        """Whether ``exc`` is only the stop showing through Hypothesis: an
        example ended early by the stop, where an earlier one with the same
        start drew further, reads to Hypothesis as inconsistent data
        generation. (With a failure found, the round ends normally.)"""
        return self.stopping() and not failed and isinstance(exc, FlakyStrategyDefinition)

    def round_settings(self, examples: int, database=True):
        """Settings of one round: the run's profile and database."""
        return settings(
            parent=self.profile,
            database=self.database if database else None,
            max_examples=examples,
            report_multiple_bugs=False,
            print_blob=True,
            derandomize=False,
        )

    def steer_to_new_pairs(self, name: str, pairs) -> None:
        """Score the example by the pair cells it drew first in this worker
        (``target()``): Hypothesis's search climbs toward cells not yet
        drawn. Only the search follows it: what a choice sequence decodes
        to never reads this state (:mod:`c128a.strategies.schedule`)."""
        seen = self.pairs_drawn.setdefault(name, set())
        new = [label for label in pairs if label not in seen]
        seen.update(new)
        try:
            hypothesis_target(float(len(new)), label=NEW_PAIRS_TARGET)
        except HypothesisInvalidArgument:
            pass  # observed once per example; a nested draw did

    def property_round(self, prop, seed: int, examples: int) -> None:
        failing: list = []  # the latest failing example and what it raised
        blob = FailureBlob()
        shrinking = ShrinkReports(self.send_shrinking)
        found: list = []  # the round's first failing example was sent (a kill)
        historical = prop.name not in self.historical_done
        self.historical_done.add(prop.name)
        # Hypothesis runs the explicit examples first: until the first
        # generated step, a step that is one of them is historical.
        explicit = list(prop.examples) if historical else []

        def around(batch, run) -> None:
            if failing and self.halted():
                shrinking.flush()  # the smallest failing example found so far
                raise StopRequested
            if self.stopping() and not failing:
                raise StopRequested
            shrinking.due()
            is_historical = bool(explicit) and not failing and batch in explicit
            if not is_historical:
                explicit.clear()
            elif step_key(prop.name, batch) in self.skip_historical:
                return  # saved as a crash or hang case: it would end this worker again
            self.write_inflight(prop.name, seed, batch, historical=is_historical)
            pairs = pair_labels_of(batch, prop.reach)
            self.steer_to_new_pairs(prop.name, pairs)
            try:
                if failing:  # shrinking: supervision
                    run()
                else:
                    self.timed(run)
            except Exception as exc:
                if is_cuda_fault(exc):
                    self.die_of_cuda_fault(prop.name, seed, batch, exc)
                if not failing and is_kill(exc):
                    # Reported before shrinking starts, so that a stop, a
                    # crash or a kill during shrinking cannot lose it.
                    self.send(protocol.Found(
                        self.index, self.failure_case(prop.name, exc, seed, batch)
                    ))
                    found.append(True)
                elif found and is_kill(exc):
                    # A smaller failing example: its blob comes once it has ended.
                    shrinking.found(lambda exc=exc: self.failure_case(
                        prop.name, exc, seed, batch, reproduce_blob=blob.blob
                    ))
                failing[:] = [batch, exc]
                blob.start()
                raise
            finally:
                # Counted once it has ended (passed or failed): an example cut
                # short by a crash or a kill checked nothing.
                self.progress.count(prop.name, batch.labels, labels_of(batch, prop.reach) + pairs)

        def test(observe_from_start: bool = False):
            if observe_from_start:
                blob.start()
            return prop.test(
                self.target, self.device,
                settings=self.round_settings(examples, database=not observe_from_start),
                seed=seed, max_tokens=self.config.max_tokens, around=around,
                examples=historical,
            )()

        self.progress.running = prop.name
        try:
            test()
        except StopRequested:
            return
        except Exception as exc:
            if self.cut_by_the_stop(exc, bool(failing)):
                return
            if failing:
                batch, original = failing
            elif is_kill(exc):
                # The target's own policy raised while the step was drawn: no
                # batch reached the check. Rerun the round, observed from its
                # start and without the database, for the failing draw's blob.
                batch, original = None, exc
                blob.stop()
                try:
                    test(observe_from_start=True)
                except StopRequested:
                    pass  # the run's stop came first: the failure goes without its blob
                except Exception:  # noqa: BLE001 - the same failure, now observed
                    pass
            else:
                raise  # the strategy or a health check failed: the suite's fault
            if not is_kill(original):
                self.send(protocol.SuiteError(
                    self.index, f"{prop.name}: the suite itself failed: {failure_text(original)}"
                ))
                return
            self.send(protocol.Failure(self.index, self.failure_case(
                prop.name, original, seed, batch, reproduce_blob=blob.blob
            )))
        finally:
            blob.stop()

    def machine_case(self, exc: BaseException, seed: int, examples: int, blob: str | None,
                     steps: str) -> Case:
        case = case_from_inflight(
            self.record(SERVING_LOOP, seed, examples=examples), kind=SERVING_LOOP,
            failure=failure_text(exc), target=self.target.spec, device=self.device_name,
            reproduce_blob=blob, steps=steps,
        )
        # The engine steps the failing example built: the case replays
        # from them under any Hypothesis release.
        return dataclasses.replace(case, machine_steps=machine_steps_of(exc))

    def machine_round(self, seed: int, examples: int) -> None:
        machine = self.machine
        worker = self
        raised: list[BaseException] = []  # what the example that just ended raised

        def report_first_failure(first_blob: str | None, steps: str) -> None:
            # Sent before shrinking starts, as a property round's first
            # failure is: a stop, a crash or a kill during shrinking (a slow
            # target's can take minutes) cannot lose it. Its steps are the
            # ones Hypothesis recorded for the example, enough with its blob
            # to replay it.
            exc = raised[0] if raised else None
            if exc is None or not is_kill(exc) or is_cuda_fault(exc):
                return  # a fault of the suite, or a CUDA fault: the round's end reports it
            worker.send(protocol.Found(
                worker.index, worker.machine_case(exc, seed, examples, first_blob, steps)
            ))

        def report_later_failure(later_blob: str | None, steps: str) -> None:
            # A smaller failing example, found by shrinking.
            exc = raised[0] if raised else None
            if exc is None or not is_kill(exc) or is_cuda_fault(exc):
                return
            shrinking.found(lambda: worker.machine_case(exc, seed, examples, later_blob, steps))

        blob = FailureBlob(on_first_failure=report_first_failure,
                           on_later_failure=report_later_failure)
        shrinking = ShrinkReports(self.send_shrinking)

        def start_example(machine_self):
            if blob.failed and worker.halted():
                shrinking.flush()  # the smallest failing example found so far
                raise StopRequested
            if worker.stopping() and not blob.failed:  # a failure found shrinks to its end
                raise StopRequested
            shrinking.due()
            raised.clear()
            worker.write_inflight(SERVING_LOOP, seed, examples=examples)
            # The example's window: from here (the engine set up on the first
            # run) to its teardown; shrinking is supervision.
            if not blob.failed:
                worker.timer.begin(drawn_seconds())
            try:
                machine.__init__(machine_self)
            except BaseException as exc:
                raised.append(exc)
                worker.timer.cancel()
                raise

        def end_example(machine_self):
            # Hypothesis tears the machine down in a ``finally``: what the
            # example raised, if anything, is the exception being handled.
            failed = sys.exc_info()[1]
            if isinstance(failed, Exception):
                raised[:] = [failed]
            worker.progress.count(SERVING_LOOP)  # once it has ended, as a property's
            try:
                machine.teardown(machine_self)
            finally:
                worker.timer.end(drawn_seconds())

        counted = use_seed(seed)(type(
            machine.__name__, (machine,), {"__init__": start_example, "teardown": end_example}
        ))
        self.progress.running = SERVING_LOOP
        # The blob of a machine's failure: observe the whole round (its
        # examples are few and long, so observing costs little).
        blob.start()
        try:
            run_state_machine_as_test(counted, settings=self.round_settings(examples))
        except StopRequested:
            return
        except Exception as exc:
            if self.cut_by_the_stop(exc, blob.failed):
                return
            if is_cuda_fault(exc):
                self.die_of_cuda_fault(SERVING_LOOP, seed, None, exc)
            if not is_kill(exc):
                self.send(protocol.SuiteError(
                    self.index, f"{SERVING_LOOP}: the suite itself failed: {failure_text(exc)}"
                ))
                return
            notes = [n for n in getattr(exc, "__notes__", ()) if "reproduce_failure" not in n]
            self.send(protocol.Failure(self.index, self.machine_case(
                exc, seed, examples, blob.blob, "\n".join(notes)
            )))
        finally:
            self.timer.cancel()  # an example cut short without its teardown
            blob.stop()
