"""``c128a sanitize``: builds under ``compute-sanitizer`` (GPU only).

Each tool (``memcheck``: accesses outside allocations; ``initcheck``: reads
of memory nothing wrote, such as block-table entries the contract does not
let the kernel read) runs over its own child process, which builds the
historical steps and ``--examples`` steps drawn with ``--seed``, each at its
width and at full width, and compares every build with the oracle. Each
finding is saved as a case (property ``sanitizer_memcheck`` or
``sanitizer_initcheck``, the sanitizer's report attached) that ``c128a
replay`` reruns under the same tool. See :mod:`c128a.gpu.compute_sanitizer`.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from ..cases import new_case, write_case
from ..failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from ..gpu import compute_sanitizer
from .. import options
from ..options import add_to_argparse
from ..step import Batch
from .common import add_padding_rows_argument, load, padding_rows_override

PROGRESS_EVERY = 20  # builds between progress lines
FULL_REPORTS = 2  # findings whose whole report is printed; the others give their headline


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_to_argparse(parser, options.TARGET_OPTION)
    add_padding_rows_argument(parser)
    parser.add_argument("--tool", choices=(*compute_sanitizer.TOOLS, "all"), default="all",
                        help="memcheck (accesses outside allocations), initcheck (reads of "
                        "memory nothing wrote: table entries past n(t)), or all (default)")
    parser.add_argument("--examples", type=int, default=30, metavar="N",
                        help="steps drawn from the strategies, besides the historical ones "
                        "(default 30)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the drawn steps (default 0: the same steps every run)")
    parser.add_argument("--no-historical", action="store_true",
                        help="leave out the contract's historical steps")
    add_to_argparse(parser, options.CASES_DIR_OPTION)
    parser.add_argument("--sanitizer", default=None, metavar="PATH",
                        help=f"the compute-sanitizer binary (default ${compute_sanitizer.SANITIZER_ENV}, "
                        "PATH, then CUDA's install folder)")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                        help="seconds one tool's child may run (default 1800)")


def run(args: argparse.Namespace) -> int:
    if args.examples < 0:
        raise UsageError(f"--examples={args.examples} must be >= 0")
    if not 0 < args.timeout < float("inf"):
        raise UsageError(f"--timeout={args.timeout} must be a finite number > 0")
    try:
        program = compute_sanitizer.find_sanitizer(args.sanitizer)
    except compute_sanitizer.SanitizerUnavailable as exc:
        raise UsageError(str(exc)) from None
    import torch

    if not torch.cuda.is_available():
        raise UsageError("needs a GPU: compute-sanitizer checks CUDA kernels "
                         "(torch.cuda.is_available() is False)")
    # The target is loaded here only to check its spec and learn its variant;
    # the builds run in the children (this process starts no CUDA context).
    from ..targets import use_device

    use_device("cpu")
    target, origin = load(args.target, padding_rows=args.padding_rows)
    override, _ = padding_rows_override(args.padding_rows)
    tools = compute_sanitizer.TOOLS if args.tool == "all" else (args.tool,)
    print(f"c128a sanitize: target {target.spec} (from {origin}), padding_rows="
          f"{target.padding_rows}, tools {', '.join(tools)}, {program}")
    print(f"  steps: {'the historical ones and ' if not args.no_historical else ''}"
          f"{args.examples} drawn with seed {args.seed}, each at its width and at full width")
    status = EXIT_OK
    for tool in tools:
        status = max(status, _run_tool(tool, target, override, program, args))
    return status


def _run_tool(tool: str, target, override, program: str, args) -> int:
    started = time.monotonic()
    builds = 0

    def progress(line: str) -> None:
        nonlocal builds
        if line.startswith(f"{compute_sanitizer.MARKER} step "):
            builds += 1
            if builds % PROGRESS_EVERY == 0:
                print(f"  {tool}: {builds} builds, {time.monotonic() - started:.0f} s", flush=True)

    try:
        run = compute_sanitizer.run_sanitizer(
            tool, target.spec, padding_rows=override, examples=args.examples, seed=args.seed,
            historical=not args.no_historical, sanitizer=program, timeout=args.timeout,
            progress=progress,
        )
    except compute_sanitizer.SanitizerUnavailable as exc:
        raise UsageError(str(exc)) from None
    seconds = time.monotonic() - started
    for error in run.errors:
        print(f"  {tool}: error: {error}")
    if not run.findings:
        verdict = "clean" if not run.errors else "did not finish"
        print(f"{tool}: {verdict}: {run.steps} builds in {seconds:.0f} s "
              f"({run.summary or 'no summary'})")
        return EXIT_OK if not run.errors else EXIT_USAGE
    print(f"{tool}: FOUND {len(run.findings)} in {run.steps} builds ({seconds:.0f} s, "
          f"{run.summary or 'no summary'})")
    if not run.finished:
        # An access outside an allocation ends the kernel with a launch failure,
        # which poisons the CUDA context: the child cannot build further.
        print(f"  {tool}: the child stopped after build {run.steps - 1}: the error ended its "
              "CUDA context, so later steps were not built")
    for number, finding in enumerate(run.findings):
        path, new = _save(finding, target, args)
        print(f"  {finding.name} at W={finding.width}: {finding.headline}")
        print(f"    case: {path}{'' if new else ' (already saved)'}")
        if number < FULL_REPORTS:
            print("    " + finding.report.replace("\n", "\n    "))
    if len(run.findings) > FULL_REPORTS:
        print(f"  (the reports of the other {len(run.findings) - FULL_REPORTS} are in their cases)")
    return EXIT_FAILED


def _save(finding: compute_sanitizer.Finding, target, args):
    batch = dataclasses.replace(Batch.from_json(finding.batch), width=finding.width)
    case = new_case(
        property=compute_sanitizer.PROPERTY_PREFIX + finding.tool,
        target=target.spec,
        kind="failure",
        failure=f"{finding.kind}: {finding.headline}",
        batch=batch,
        device="cuda",
        seed=args.seed,
        padding_rows=target.padding_rows,
        sanitizer_report=finding.report,
    )
    try:
        return write_case(case, args.cases_dir)
    except OSError as exc:
        print(f"    could not write the case to {args.cases_dir}: {exc}")
        return None, False
