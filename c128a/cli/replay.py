"""``c128a replay``: rerun saved failure cases against a target.

Exit status: 0 when every case passes now, 1 when one still fails (a
contract violation, a crash or a hang), 2 when a file is malformed or a case
cannot be replayed here. Every file runs, whatever the ones before it did.
Crash and hang cases run in a child process with a time limit, so that a
target that crashes or hangs again cannot take the replay down with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import site
import subprocess
import sys
from pathlib import Path

from ..failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CaseError, UsageError
from ..runners.cases import (
    DEFAULT_MACHINE,
    DEFAULT_PROPERTIES,
    FAILS,
    PASSES,
    SERVING_LOOP,
    Case,
    describe_batch,
    load_case,
    replay_case,
    replay_variant,
)
from ..targets import BUILTIN_TARGETS, TARGET_ENV, held_to, import_mapping, import_object
from ..targets.specs import DECLARED
from .common import add_target_arguments, choose_device, load, padding_rows_override

ISOLATED_KINDS = ("crash", "hang")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the c128a package this process runs."""
DEFAULT_TIMEOUT_S = 300.0


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="case file(s) to rerun")
    add_target_arguments(parser)
    parser.add_argument("--properties", metavar="MODULE:ATTR", default=DEFAULT_PROPERTIES,
                        help=f"property mapping the cases name (default {DEFAULT_PROPERTIES})")
    parser.add_argument("--machine", metavar="MODULE:ATTR", default=DEFAULT_MACHINE,
                        help=f"serving-loop machine factory (default {DEFAULT_MACHINE})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds a crash or hang case may run in its child process "
                        f"(default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
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


def run(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise UsageError(f"--timeout={args.timeout} must be > 0")
    device = choose_device(args.device)
    properties = import_mapping(args.properties, "--properties", DEFAULT_PROPERTIES)
    verdicts = [replay_file(file, args, device, properties) for file in args.files]
    if EXIT_FAILED in verdicts:
        return EXIT_FAILED
    return EXIT_USAGE if EXIT_USAGE in verdicts else EXIT_OK


def replay_file(file: str, args: argparse.Namespace, device: str, properties) -> int:
    """Replay one file and print what happened: its exit status."""
    try:
        case = load_case(file)
        spec, origin = target_spec(case, args.target)
        override, override_origin = padding_rows_override(args.padding_rows)
        target, _ = load(spec, origin, args.padding_rows)
        # The variant the case recorded, unless an option names one.
        target = held_to(target, replay_variant(case, override))
    except (CaseError, UsageError) as exc:
        print(f"error: {file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if case.kind in ISOLATED_KINDS and not args.in_process:
        return replay_in_child(file, case, args, device, spec)
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
    if case.outside_contract:
        print(f"note:     the inputs break the contract's preconditions: {case.outside_contract}")
    try:
        machine = (
            import_object(args.machine, "--machine") if case.property == SERVING_LOOP else None
        )
        outcome = replay_case(case, target, device, properties=properties,
                              machine_factory=machine, padding_rows=override)
    except (CaseError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if outcome.verdict == PASSES:
        print("result:   PASSES now\n")
        return EXIT_OK
    print("result:   STILL FAILS" if outcome.verdict == FAILS else "result:   CANNOT REPLAY here")
    print("  " + outcome.report.replace("\n", "\n  ") + "\n", flush=True)
    return EXIT_FAILED if outcome.verdict == FAILS else EXIT_USAGE


def replay_in_child(file: str, case: Case, args: argparse.Namespace, device: str, spec: str):
    """A crash or hang case in its own process, under ``--timeout``: a crash
    or a timeout there means the target still fails; this process goes on."""
    # -P: the current folder stays off the child's sys.path, so a rich.py (or
    # any module the child imports) lying there is never run.
    command = [sys.executable, "-P", "-m", "c128a.cli", "replay", file, "--in-process",
               "--device", device, "--target", spec, "--properties", args.properties,
               "--machine", args.machine,
               *(["--padding-rows", args.padding_rows] if args.padding_rows else [])]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        child = subprocess.run(command, timeout=args.timeout, stdout=_child_stream(sys.stdout),
                               stderr=_child_stream(sys.stderr), env=_child_environment())
    except subprocess.TimeoutExpired as exc:
        _relay(exc.stdout, sys.stdout)
        _relay(exc.stderr, sys.stderr)
        print(f"case:     {file}\nresult:   STILL HANGS: the {case.kind} case ran past "
              f"--timeout={args.timeout:g} s in its child process, which was killed\n")
        return EXIT_FAILED
    _relay(child.stdout, sys.stdout)
    _relay(child.stderr, sys.stderr)
    if child.returncode < 0:
        try:
            name = signal.Signals(-child.returncode).name
        except ValueError:  # a signal without a name (SIGRTMIN + n)
            name = f"signal {-child.returncode}"
        print(f"case:     {file}\nresult:   STILL CRASHES: its child process died of {name}\n")
        return EXIT_FAILED
    if child.returncode not in (EXIT_OK, EXIT_FAILED, EXIT_USAGE):
        print(f"case:     {file}\nresult:   STILL CRASHES: its child process exited "
              f"{child.returncode}\n")
        return EXIT_FAILED
    return child.returncode


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
