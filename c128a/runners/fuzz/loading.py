"""The run's target, loaded once before any worker starts, in a child process.

The target's module is the user's code: its import may take seconds (a GPU
kernel's), raise, or end the process (a native library calling ``exit(0)``,
which no Python handler sees). Loaded in the ``c128a fuzz`` process itself, an
exit there ended the run with status 0 and no word. So it is loaded where its
end is seen: a child of the fork server (:func:`load_in_a_child`, as a worker
starts), which loads the target, resolves what the run fuzzes on it (the
properties that apply, the serving-loop machine, whose factory is called
there: a ``--machine`` that is not one is found before any worker starts) and
answers with a :class:`Loaded`, or a :class:`Refused` with one line. A child
that ends without answering refused too, saying how it ended.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field

from hypothesis.stateful import RuleBasedStateMachine

from ...cases import SERVING_LOOP
from ...failures import UsageError, one_line
from ...gpu.pinning import gpu_for_worker, pin_to_gpu
from ...targets import load_target, use_device
from .channel import ChannelError, ChannelReader, ChannelWriter
from .config import FuzzConfig
from .process import kill_group, start_process, take_over_the_process
from .signals import describe_signal
from .worker import selection

POLL_INTERVAL_S = 0.05


@dataclass(frozen=True)
class Loaded:
    """The target loaded: its spec and padding-row variant, how long loading
    took, the rounds the run fuzzes (property names, then the serving loop's)
    and the properties that do not apply to it, each with why."""

    spec: str
    padding_rows: str | None
    seconds: float
    rounds: tuple[str, ...] = ()
    not_applicable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refused:
    """The run cannot start: ``what`` ("target" or "machine") and why, one line."""

    what: str
    text: str


class TargetNotLoaded(UsageError):
    """The target (or the run's machine on it) did not load in the child; the
    message is one line. ``what`` is "target" or "machine"."""

    def __init__(self, what: str, text: str):
        super().__init__(text)
        self.what = what


def load_and_answer(config: FuzzConfig, channel: ChannelWriter, parent: int,
                    environ: dict[str, str]) -> None:
    """The child: load the target and what the run builds from it; answer."""
    take_over_the_process(parent, environ)
    started = time.monotonic()
    try:
        channel.put(_load(config, started))
    except UsageError as exc:
        channel.put(Refused("target", str(exc)))
    except Exception as exc:  # noqa: BLE001 - the target's or the machine's own code raised
        channel.put(Refused("target", f"target {config.target!r}: loading it raised "
                            f"{one_line(exc)}; fix the target or name another"))
    channel.close()


def _load(config: FuzzConfig, started: float) -> Loaded | Refused:
    if config.device == "cuda" and config.gpu_count:
        pin_to_gpu(gpu_for_worker(0, config.gpu_count))  # where worker 0 will run
    device = use_device(config.device)
    target = load_target(config.target, config.padding_rows)
    seconds = time.monotonic() - started
    properties, not_applicable, factory = selection(config, target)
    rounds = tuple(prop.name for prop in properties)
    if factory is not None:
        import torch

        try:
            machine = factory(target, torch.device(device))
        except Exception as exc:  # noqa: BLE001 - the factory's own code raised
            return Refused("machine", f"--machine {config.machine}: calling it with (target, "
                           f"device) raised {one_line(exc)}; a machine factory takes the target "
                           "and the device and returns a RuleBasedStateMachine class")
        if not (isinstance(machine, type) and issubclass(machine, RuleBasedStateMachine)):
            return Refused("machine", f"--machine {config.machine} returned "
                           f"{type(machine).__name__} {machine!r:.80}, not a RuleBasedStateMachine "
                           "class; a machine factory takes the target and the device and "
                           "returns one")
        rounds += (SERVING_LOOP,)
    return Loaded(target.spec, target.padding_rows, seconds, rounds, not_applicable)


def load_in_a_child(context, config: FuzzConfig, deadline: float | None, timeout: float,
                    on_start=lambda process: None) -> Loaded | None:
    """Load ``config``'s target in a child of ``context`` (the fork server),
    waiting until ``deadline`` (a ``time.monotonic()``; None: no deadline)
    and at most ``timeout`` seconds: the :class:`Loaded`, or None when the
    deadline came first. :class:`TargetNotLoaded` when the target does not
    load (or the machine is not one), the child ends without answering, or
    ``timeout`` passes. ``on_start(process)`` is called once it runs. The
    child and whatever it started are ended before this returns or raises
    (a stop signal's :class:`~.signals.RunInterrupted` included)."""
    reading, writing = context.Pipe(duplex=False)
    process = context.Process(
        target=load_and_answer, args=(config, ChannelWriter(writing), os.getpid(),
                                      dict(os.environ)),
        name="c128a-fuzz-load", daemon=True,
    )
    # Protected from the start: a stop signal at any point after the child
    # forked (RunInterrupted) must not leave it running. (It only stops on
    # SIGKILL: multiprocessing's exit would send it SIGTERM and wait for it.)
    try:
        try:
            start_process(process)
        finally:
            writing.close()
        on_start(process)
        return _wait(process, ChannelReader(reading), config, deadline, timeout)
    finally:
        if process.pid is not None:
            kill_group(process)
            process.join()
        reading.close()


def _wait(process, reader: ChannelReader, config: FuzzConfig, deadline: float | None,
          timeout: float) -> Loaded | None:
    started = time.monotonic()
    while True:
        answer = _answer(reader, config)
        if answer is None and not process.is_alive():
            process.join()
            answer = _answer(reader, config)
            if answer is None:
                raise TargetNotLoaded("target", _ended(config, process.exitcode))
        if isinstance(answer, Refused):
            raise TargetNotLoaded(answer.what, answer.text)
        if answer is not None:
            return answer
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return None
        if now - started > timeout:
            raise TargetNotLoaded("target", f"target {config.target!r} did not load within "
                                  f"{timeout:g} s; nothing was fuzzed")
        time.sleep(POLL_INTERVAL_S)


def _answer(reader: ChannelReader, config: FuzzConfig):
    try:
        answer = reader.get_nowait()
    except (queue.Empty, OSError):
        return None
    except ChannelError as exc:
        return Refused("target", f"target {config.target!r}: while it loaded, its process wrote "
                       f"to the run's channel what is not an answer ({exc})")
    if not isinstance(answer, (Loaded, Refused)):
        return Refused("target", f"target {config.target!r}: while it loaded, its process sent "
                       f"{type(answer).__name__}, not an answer")
    return answer


def _ended(config: FuzzConfig, code: int | None) -> str:
    how = describe_signal(-code) if code and code < 0 else f"exit {code}"
    return (f"target {config.target!r}: its process ended ({how}) while the target loaded, "
            "before it said whether it loaded: the target's import (or a library it loads, "
            "calling exit()) must not end the process; nothing was fuzzed")
