"""``c128a replay``: rerun saved failure cases against a target.

Exit status: 0 when every case passes now, 1 when one still fails (a
contract violation, a crash or a hang, or a process that ended without its
verdict while a case ran), 2 when a file is malformed or a case cannot be
replayed here, 130/143 after SIGINT/SIGTERM. Every file runs, whatever the
ones before it did. No process that runs a target's code decides the exit
status: each tells its parent its verdict, and one that ends without it
(``os._exit(0)`` in the target) has failed (:mod:`c128a.cli.watched`).
Crash and hang cases run in a child process with a time limit, so that a
target that crashes or hangs again cannot take the replay down with it; so
does every case when the command line holds more than one, so that a
failure case whose target now crashes the process ends only itself. A
child runs in a session of its own: it is killed with its process group
(the target's own processes too), and a SIGINT or SIGTERM to the replay is
passed on to that group and waited for. Its time limit counts from when it
starts the case, not from its start-up (torch's import: seconds).
"""

from __future__ import annotations

import argparse
import math
import os
import select
import signal
import site
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..cases import (
    FAILS,
    PASSES,
    SERVING_LOOP,
    Case,
    Outcome,
    describe_batch,
    load_case,
    replay_case,
    replay_variant,
)
from ..checked import load_machine, load_properties
from ..failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CaseError, UsageError, failure_text
from ..interrupts import HeldSignals
from .. import options
from ..options import DEFAULT_PROPERTIES, add_to_argparse
from ..targets import BUILTIN_TARGETS, TARGET_ENV, check_mapping, held_to
from ..targets.specs import DECLARED
from . import watched
from .common import add_target_arguments, choose_device, load, padding_rows_override

ISOLATED_KINDS = ("crash", "hang")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the c128a package this process runs."""
DEFAULT_TIMEOUT_S = 300.0
STARTUP_LIMIT_S = 600.0
"""How long a replay's child may take to start its case (the interpreter,
torch, the target's import) before it is killed: ``--timeout`` counts from
the case's start, so that a slow start-up never reads as a hang."""
STOP_GRACE_S = 5.0
"""After a SIGINT or SIGTERM passed on to a child's process group: how long
it may take to end before the group is killed."""
POLL_S = 0.1


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="case file(s) to rerun")
    add_target_arguments(parser)
    add_to_argparse(parser, options.PROPERTIES_OPTION)
    add_to_argparse(parser, options.MACHINE_OPTION)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds a crash or hang case may run in its child process, "
                        "counted from when the child starts the case (its start-up may take "
                        f"up to {STARTUP_LIMIT_S:g} s more; default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument(watched.CHILD_OPTION, dest="in_process", action="store_true",
                        help=argparse.SUPPRESS)
    # A replay's child: the pipe where it tells its parent what it does and
    # its verdict (the parent's clock starts when it starts the case).
    parser.add_argument("--parent-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.epilog = (
        "Without --target (or $C128A_TARGET) each case runs against the target it names, "
        "if that is a built-in target or a c128a module: any other module the case names "
        "is imported only when given with --target. Each case is held to the padding-row "
        "variant it recorded unless --padding-rows (or $C128A_PADDING_ROWS) names one. "
        "Exit status: 0 when every case passes "
        "now, 1 when one still fails, crashes or hangs, 2 when a file is malformed or a case "
        "cannot be replayed here."
    )


def target_spec(case: Case, option: str | None) -> tuple[str, str]:
    """(spec, where it came from) for a case: ``--target``, else
    ``$C128A_TARGET``, else the case's own, which is imported only when it is a
    built-in or a c128a module: a case file alone never imports other code."""
    if option:
        return option, "--target"
    if os.environ.get(TARGET_ENV, "").strip():
        return os.environ[TARGET_ENV].strip(), f"${TARGET_ENV}"
    module = case.target.partition(":")[0]
    if case.target in BUILTIN_TARGETS or module == "c128a" or module.startswith("c128a."):
        return case.target, "the case"
    raise UsageError(
        f"the case names target {case.target!r}, which would import module {module!r}; "
        f"replay imports it only when asked: pass --target {case.target} (or set ${TARGET_ENV})"
    )


class ReplayInterrupted(BaseException):
    """SIGINT or SIGTERM to the replay: no further file runs. A BaseException,
    so that no replay mistakes it for the failure it replays."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class ChildSignals:
    """SIGINT and SIGTERM while the replay runs: passed on to the process
    group of the child running a case, which the replay then waits for; with
    no child running, the replay stops at once."""

    def __init__(self):
        self.group: int | None = None  # the running child's process group
        self.starting = False  # a child is being started: its group is not known yet
        self.received: int | None = None
        self.held: HeldSignals | None = None

    def __enter__(self) -> "ChildSignals":
        self.held = HeldSignals(self.handle, (signal.SIGINT, signal.SIGTERM))
        return self

    def __exit__(self, *exc_info) -> None:
        self.held.restore()

    def handle(self, signum: int, frame=None) -> None:
        first = self.received is None
        if first:
            self.received = signum
        if self.group is not None:
            _signal_group(self.group, signum if first else signal.SIGKILL)
        elif not self.starting:
            raise ReplayInterrupted(signum)


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):  # the group has ended
        pass


def run(args: argparse.Namespace) -> int:
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise UsageError(
            f"--timeout={args.timeout} must be a finite number of seconds > 0 (how long a crash "
            f"or hang case may run once its child process has started it); give e.g. "
            f"--timeout {DEFAULT_TIMEOUT_S:g}, the default"
        )
    if args.in_process:
        if args.parent_fd is None:
            raise UsageError(
                f"{watched.CHILD_OPTION} is the option of a replay's own child, whose parent "
                "holds its verdict (--parent-fd); run c128a replay without it"
            )
        watched.attach(args.parent_fd)
        status = replay_files(args)
        watched.tell_parent(watched.VERDICT, status)
        return status
    # Ctrl-C reaches this process only (a child runs in a session of its own).
    with ChildSignals() as signals:
        args.signals = signals
        try:
            return replay_files(args)
        except ReplayInterrupted as stop:
            name = signal.Signals(stop.signum).name
            print(f"c128a replay: interrupted by {name}; no further file runs", file=sys.stderr)
            return 128 + stop.signum


def replay_files(args: argparse.Namespace) -> int:
    device = choose_device(args.device)
    properties = check_mapping(load_properties(args.properties), args.properties,
                               "--properties", DEFAULT_PROPERTIES)
    if args.in_process:
        # A replay's child: SIGINT passed on by the parent ends it quietly.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    # With more than one case, each runs in a child process: a target that
    # crashes the process (a segfault, an abort) on one case must not end
    # the replay before the others run. A single case runs here: nothing
    # after it can be lost, and a child's start-up (torch's import,
    # seconds) would about double its time.
    args.isolate_every_case = not args.in_process and sum(map(_loads, args.files)) > 1
    verdicts = [replay_file(file, args, device, properties) for file in args.files]
    if EXIT_FAILED in verdicts:
        return EXIT_FAILED
    return EXIT_USAGE if EXIT_USAGE in verdicts else EXIT_OK


def _loads(file: str) -> bool:
    try:
        load_case(file)
    except CaseError:
        return False
    return True


def replay_file(file: str, args: argparse.Namespace, device: str, properties) -> int:
    """Replay one file and print what happened: its exit status."""
    try:
        case = load_case(file)
        spec, origin = target_spec(case, args.target)
        override, override_origin = padding_rows_override(args.padding_rows)
    except (CaseError, UsageError) as exc:
        print(f"error: {_naming_the_file(exc, file)}", file=sys.stderr)
        return EXIT_USAGE
    if not args.in_process and (case.kind in ISOLATED_KINDS
                                or getattr(args, "isolate_every_case", False)):
        # The target is imported in the child only: its import may end the
        # process it runs in.
        timeout = args.timeout if case.kind in ISOLATED_KINDS else None
        return replay_in_child(file, case, args, device, spec, timeout)
    watched.tell_parent(watched.LOADING, file)
    try:
        target, _ = load(spec, origin, args.padding_rows)
        # The variant the case recorded, unless an option names one.
        target = held_to(target, replay_variant(case, override))
    except (CaseError, UsageError) as exc:
        print(f"error: {_naming_the_file(exc, file)}", file=sys.stderr)
        return EXIT_USAGE
    if override:
        variant_origin = override_origin
    else:
        variant_origin = "recorded in the case" if case.padding_rows else DECLARED
    print(f"case:     {file}")
    print(f"property: {case.property} ({case.kind}), recorded on {case.target}"
          f" ({case.device or '?'}), {case.created or 'undated'}")
    print(f"target:   {target.spec} (from {origin}), device {device}")
    print(f"padding:  padding_rows={target.padding_rows} ({variant_origin})")
    if case.batch is not None:
        print(f"inputs:   {describe_batch(case.batch)}")
    if case.machine_steps is not None:
        recorded = case.machine_steps
        captured = (f"captured at W={recorded.capture_width} when recorded"
                    if recorded.capture_width else "its policy gave no capture width when recorded")
        print(f"steps:    {len(recorded.steps)} recorded engine step(s)"
              f"{'' if recorded.steps else ' (it failed at capture)'}, max_model_len="
              f"{recorded.max_model_len}, {captured}")
    if case.outside_contract:
        print(f"note:     the inputs break the contract's preconditions: {case.outside_contract}")
    try:
        machine = (
            load_machine(args.machine) if case.property == SERVING_LOOP else None
        )
        watched.tell_parent(watched.STARTED, file)
        outcome = replay_target_code(case, target, device, properties=properties,
                                     machine_factory=machine, padding_rows=override)
        watched.tell_parent(watched.ENDED, file)
    except (CaseError, UsageError) as exc:
        print(f"error: {_naming_the_file(exc, file)}", file=sys.stderr)
        return EXIT_USAGE
    if outcome.verdict == PASSES:
        print("result:   PASSES now\n")
        return EXIT_OK
    print("result:   STILL FAILS" if outcome.verdict == FAILS else "result:   CANNOT REPLAY here")
    print("  " + outcome.report.replace("\n", "\n  ") + "\n", flush=True)
    return EXIT_FAILED if outcome.verdict == FAILS else EXIT_USAGE


def replay_target_code(case: Case, target, device, **options) -> Outcome:
    """:func:`~c128a.cases.replay_case`, where a target that raises
    what is not an ``Exception`` to end its run (``SystemExit`` from
    ``sys.exit``, ``GeneratorExit``, a class of its own) still fails the case,
    as a crash does: it never ends the replay with a status of its choosing.
    ``KeyboardInterrupt`` and a signal to the replay stop the replay."""
    try:
        return replay_case(case, target, device, **options)
    except (KeyboardInterrupt, ReplayInterrupted):
        raise
    except BaseException as exc:  # noqa: BLE001 - a target's way out of its run
        how = (f"raised SystemExit({exc.code!r}) (sys.exit), which would have ended the "
               "process" if isinstance(exc, SystemExit) else
               f"raised {type(exc).__name__}, which is not an Exception")
        return Outcome(FAILS, f"the target {how} instead of returning its views or raising an "
                       f"Exception: {failure_text(exc)}")


def _naming_the_file(exc: Exception, file: str) -> str:
    """``exc``'s message naming ``file`` once: a case error names its own file."""
    if isinstance(exc, CaseError) and exc.path is not None:
        return str(exc)
    return f"{file}: {exc}"


def replay_in_child(file: str, case: Case, args: argparse.Namespace, device: str, spec: str,
                    timeout: float | None) -> int:
    """A case in its own process, under ``timeout`` (None: none) from when the
    child starts the case: a crash or a timeout there means the target still
    fails; this process goes on."""
    # -P: the current folder stays off the child's sys.path, so a rich.py (or
    # any module the child imports) lying there is never run.
    command = [sys.executable, "-P", "-m", "c128a.cli", "replay", file, "--in-process",
               "--device", device, "--target", spec, "--properties", args.properties,
               "--machine", args.machine,
               *(["--padding-rows", args.padding_rows] if args.padding_rows else [])]
    ended = run_child(command, timeout, getattr(args, "signals", None))
    if ended.interrupted is not None:
        raise ReplayInterrupted(ended.interrupted)
    if ended.killed_for == "case":
        print(f"case:     {file}\nresult:   STILL HANGS: the {case.kind} case ran past "
              f"--timeout={args.timeout:g} s in its child process, which was killed with its "
              "process group\n")
        return EXIT_FAILED
    if ended.killed_for == "start-up":
        print(f"case:     {file}\nresult:   CANNOT REPLAY here: its child process did not "
              f"start the case within {STARTUP_LIMIT_S:g} s (the interpreter, the imports, the "
              "target's load) and was killed with its process group\n")
        return EXIT_USAGE
    judged = watched.judge(ended.returncode, ended.marks, failed=EXIT_FAILED,
                           unreplayable=EXIT_USAGE, process="its child process")
    if judged.line is None:  # its verdict, told
        return judged.status
    if judged.status == EXIT_USAGE:
        result = f"CANNOT REPLAY here: {judged.line}"
    elif ended.returncode < 0 and ended.marks.verdict is None:
        result = f"STILL CRASHES: its child process {watched.status_name(ended.returncode)}"
    else:
        result = f"STILL CRASHES: {judged.line}"
    print(f"case:     {file}\nresult:   {result}\n")
    return judged.status


@dataclass
class ChildEnd:
    returncode: int
    killed_for: str | None = None  # "case": past the timeout; "start-up": past STARTUP_LIMIT_S
    interrupted: int | None = None  # the signal passed on to the child's group
    marks: watched.Marks = field(default_factory=watched.Marks)  # what the child told


def run_child(command: list[str], timeout: float | None,
              signals: ChildSignals | None = None) -> ChildEnd:
    """Run a replay's child in a session of its own and wait for it: its
    ``timeout`` counts from when it tells, on the pipe named by
    ``--parent-fd``, that it started the case (:mod:`c128a.cli.watched`'s
    marks, its verdict among them, come back in :attr:`ChildEnd.marks`); its
    start-up may take :data:`STARTUP_LIMIT_S`. Past
    either, or ``STOP_GRACE_S`` after a signal passed on to it, its whole
    process group is killed, and so is whatever of the group outlives it:
    nothing of a replay's child survives the replay."""
    sys.stdout.flush()
    sys.stderr.flush()
    marks_read, marks_write = os.pipe()
    if signals is not None:
        signals.starting = True  # a signal now is passed on once the child runs
    try:
        child = subprocess.Popen(
            [*command, "--parent-fd", str(marks_write)], pass_fds=(marks_write,),
            stdout=_child_stream(sys.stdout), stderr=_child_stream(sys.stderr),
            env=_child_environment(), start_new_session=True,
        )
    except BaseException:
        os.close(marks_read)
        if signals is not None:
            signals.starting = False
        raise
    finally:
        os.close(marks_write)
    if signals is not None:
        signals.group, signals.starting = child.pid, False
        if signals.received is not None:
            _signal_group(child.pid, signals.received)
    relays = [_Relay(pipe, handle) for pipe, handle in ((child.stdout, sys.stdout),
                                                        (child.stderr, sys.stderr)) if pipe]
    ended = ChildEnd(returncode=0)
    try:
        startup_deadline = time.monotonic() + STARTUP_LIMIT_S
        started_at: float | None = None
        stop_deadline: float | None = None
        while child.poll() is None:
            now = time.monotonic()
            if signals is not None and signals.received is not None:
                stop_deadline = stop_deadline or now + STOP_GRACE_S
                if now > stop_deadline:
                    _signal_group(child.pid, signal.SIGKILL)
            if started_at is None:
                readable, _, _ = select.select([marks_read], [], [], POLL_S)
                if readable:
                    data = os.read(marks_read, 1 << 16)
                    ended.marks.feed(data)
                    if ended.marks.started or not data:  # the case, or the end of the pipe
                        started_at = time.monotonic()
                elif now > startup_deadline and ended.killed_for is None:
                    ended.killed_for = "start-up"
                    _signal_group(child.pid, signal.SIGKILL)
            elif timeout is not None and now - started_at > timeout and not ended.killed_for:
                ended.killed_for = "case"
                _signal_group(child.pid, signal.SIGKILL)
            else:
                try:
                    child.wait(POLL_S)
                except subprocess.TimeoutExpired:
                    pass
    finally:
        _signal_group(child.pid, signal.SIGKILL)  # the target's own processes, if any are left
        child.wait()
        if signals is not None:
            signals.group = None
        ended.marks.read_available(marks_read)
        os.close(marks_read)
        for relay in relays:
            relay.finish()
    ended.returncode = child.returncode
    if signals is not None:
        ended.interrupted = signals.received
    return ended


class _Relay:
    """A child's output read from its pipe as it comes (so that it never
    blocks on a full pipe), written to ``handle`` once the child ends."""

    def __init__(self, pipe, handle):
        self.pipe, self.handle, self.chunks = pipe, handle, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for chunk in iter(lambda: self.pipe.read1(1 << 16), b""):
            self.chunks.append(chunk)

    def finish(self) -> None:
        # A process that left the child's group (its own session) may hold
        # the pipe open: what came so far is relayed, the rest is not waited for.
        self.thread.join(STOP_GRACE_S)
        _relay(b"".join(self.chunks), self.handle)


def _child_environment() -> dict[str, str]:
    """This process's environment for a replay's child, with the folder this
    c128a is imported from first on PYTHONPATH unless the child finds it
    there or in site-packages anyway: a checkout run as ``python -m
    c128a.cli`` from its own folder was found through the current folder,
    which -P leaves out."""
    environment = dict(os.environ)
    # An empty entry (PYTHONPATH=":/x") would put the current folder back.
    entries = [entry for entry in environment.get("PYTHONPATH", "").split(os.pathsep) if entry]
    found = {Path(entry).resolve() for entry in entries}
    found |= {Path(folder).resolve() for folder in (*site.getsitepackages(),
                                                    site.getusersitepackages())}
    if PACKAGE_ROOT not in found:
        entries.insert(0, str(PACKAGE_ROOT))
    if entries:
        environment["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        environment.pop("PYTHONPATH", None)
    return environment


def _child_stream(handle):
    """Where the child writes: straight to ``handle``'s file, as it goes; or,
    when ``handle`` has no file descriptor (sys.stdout replaced, as by
    ``contextlib.redirect_stdout`` or pytest's capsys), a pipe relayed
    through ``handle`` once the child ends."""
    try:
        handle.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.PIPE
    return handle


def _relay(output: bytes | None, handle) -> None:
    if output:
        handle.write(output.decode(errors="replace"))
        handle.flush()
