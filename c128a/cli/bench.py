"""``c128a bench``: time the project's kernel against the baseline and, with
``--vllm-release``, a vLLM release's kernel (GPU; do_bench and CUDA-graph
clocks), or measure how fast one property runs (``--throughput``, CPU or GPU)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from ..failures import EXIT_FAILED, EXIT_OK, ContractViolation, UsageError, failure_text
from ..files import atomic_write_json, output_file_problem
from ..runners.throughput import print_throughput, run_throughput
from .. import options
from ..options import add_to_argparse
from .common import add_device_argument, add_padding_rows_argument, choose_device, load

SHAPE_GROUPS = ("prefill", "decode", "mixed")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_device_argument(parser)
    parser.add_argument("--json", metavar="FILE", default=None, help="save the full results here")
    parser.add_argument("--groups", default=",".join(SHAPE_GROUPS),
                        help="comma-separated shape groups: prefill, decode, mixed")
    parser.add_argument("--shape", dest="shapes", action="append", default=None, metavar="NAME",
                        help="time only this shape (its name in the table, e.g. 'prefill 512'; "
                        "repeatable; default: every shape of --groups)")
    parser.add_argument("--vllm-release", default=None, metavar="VERSION|PATH",
                        help="also time this vLLM release's kernel (as the target "
                        "vllm-release:VERSION|PATH: a version fetched into the cache, or a wheel, "
                        "an extract or a folder holding one); default: none")
    parser.add_argument("--graph-launches", type=int, default=options.DEFAULT_GRAPH_LAUNCHES, metavar="N",
                        help="launches captured into one CUDA graph for the graph clock "
                        f"(default {options.DEFAULT_GRAPH_LAUNCHES}; 0: do_bench only)")
    parser.add_argument("--graph-replays", type=int, default=options.DEFAULT_GRAPH_REPLAYS, metavar="R",
                        help="replays of that graph; the graph clock is their median "
                        f"(default {options.DEFAULT_GRAPH_REPLAYS})")
    parser.add_argument("--tiles", default=None, metavar="TxWxWIDExWARPSxPERSM,...",
                        help="also time the project's kernel at these tiles (tuning)")
    parser.add_argument("--tiles-at-capacity", action="store_true",
                        help="time the --tiles variants at W = C too")
    parser.add_argument("--warmup-ms", type=int, default=10, help="do_bench warm-up (ms)")
    parser.add_argument("--rep-ms", type=int, default=40, help="do_bench repetition time (ms)")
    parser.add_argument("--seed", type=int, default=0, help="seed of --throughput's examples")
    parser.add_argument("--throughput", action="store_true",
                        help="run one property as a Hypothesis test for --seconds against "
                        "--target and report examples/s and where the time goes (CPU or CUDA)")
    parser.add_argument("--property", default="matches_oracle",
                        help="the property --throughput runs (default matches_oracle)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long --throughput runs, after one warm-up example")
    parser.add_argument("--examples", type=int, default=None, metavar="N",
                        help="--throughput runs N examples instead of --seconds (the same ones "
                        "every run, for comparisons)")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="--throughput draws batches of up to this many tokens")
    add_to_argparse(parser, options.TARGET_OPTION)  # --throughput's target
    add_padding_rows_argument(parser)
    parser.add_argument("--profile-out", metavar="FILE", default=None,
                        help="--throughput also runs cProfile, saves its stats here and prints "
                        "the top entries")


def parse_tiles(text: str | None) -> list[tuple[int, int, int, int, int, int]]:
    """'4x128x1024x4x16,...' -> [(4, 128, 1024, 4, 16, 0), ...]: BLOCK_T x
    BLOCK_W x WIDE_W x warps x programs per multiprocessor (0: one program a
    block), and optionally x registers per thread (0 or absent: the
    compiler's choice)."""
    if not text:
        return []
    tiles = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) not in (5, 6) or not all(p.isdigit() for p in parts):
            raise UsageError(
                f"--tiles item {item!r} must look like 4x128x1024x4x16 "
                "(or 4x128x1024x4x16x32 with a register cap)"
            )
        tiles.append(tuple(int(p) for p in parts) + (0,) * (6 - len(parts)))
    return tiles


def check_graph_options(args: argparse.Namespace) -> None:
    if args.graph_launches < 0:
        raise UsageError(f"--graph-launches={args.graph_launches} must be >= 0 (0: no graph clock)")
    if args.graph_replays < 1:
        raise UsageError(f"--graph-replays={args.graph_replays} must be >= 1")


def check_output_files(args: argparse.Namespace) -> None:
    """``--json`` and ``--profile-out`` checked before any work: each is
    written only at the end, after minutes of it."""
    # --json is written whole (atomic_write_json); cProfile writes its stats in place.
    for option, path, atomic in (("--json", args.json, True),
                                 ("--profile-out", args.profile_out, False)):
        if path is None:
            continue
        problem = "is empty; name a file" if not path else output_file_problem(path, atomic=atomic)
        if problem is not None:
            raise UsageError(f"{option}={path}: {problem}")


def run(args: argparse.Namespace) -> int:
    check_output_files(args)
    if args.throughput:
        if args.vllm_release is not None:
            raise UsageError(
                "--vllm-release is for the timing mode; --throughput takes "
                "--target vllm-release:VERSION|PATH"
            )
        return _run_throughput(args)
    tiles = parse_tiles(args.tiles)
    groups = args.groups.split(",")
    unknown = sorted(set(groups) - set(SHAPE_GROUPS))
    if unknown:
        raise UsageError(f"--groups {', '.join(unknown)}: choose from {', '.join(SHAPE_GROUPS)}")
    check_graph_options(args)
    device = torch.device(choose_device(args.device))
    # Imports the kernels: only now that the device is chosen.
    from ..runners import benchmark

    benchmark.select_shapes(args.groups, args.shapes)
    release = None if args.vllm_release is None else benchmark.load_release(args.vllm_release)
    if device.type != "cuda":
        raise UsageError("timing needs a CUDA device (--throughput also runs on the cpu)")

    report = benchmark.run_benchmark(args, device, tiles, release)
    benchmark.print_report(report)
    rows = benchmark.summary_rows(report)
    if args.json:
        atomic_write_json(Path(args.json), {**report, "summary": rows})
        print(f"saved {args.json}")
    return EXIT_OK if all(row["exact"] for row in rows) else EXIT_FAILED


def _run_throughput(args: argparse.Namespace) -> int:
    if not (args.seconds > 0 and math.isfinite(args.seconds)):
        raise UsageError(f"--seconds={args.seconds} must be a finite number > 0")
    if args.examples is not None and args.examples <= 0:
        raise UsageError(f"--examples={args.examples} must be > 0")
    if args.max_tokens < 1:
        # 0 draws steps of no token at all (mean 0 tokens): nothing of the kernel's work.
        raise UsageError(
            f"--max-tokens={args.max_tokens} must be >= 1: a step of 0 tokens has nothing to "
            "build (as c128a fuzz --max-tokens)"
        )
    device_name = choose_device(args.device)
    target, _ = load(args.target, padding_rows=args.padding_rows)
    if device_name == "cpu":
        # Small tensors: one thread is as fast and steadier on a shared machine.
        torch.set_num_threads(1)
    try:
        report = run_throughput(
            target,
            torch.device(device_name),
            args.property,
            seconds=args.seconds,
            max_tokens=args.max_tokens,
            seed=args.seed,
            examples=args.examples,
            profile_out=args.profile_out,
        )
    except ContractViolation as exc:
        print(f"c128a bench: {target.spec} failed {args.property}:\n{failure_text(exc)}",
              file=sys.stderr)
        return EXIT_FAILED
    print_throughput(report)
    if args.json:
        atomic_write_json(Path(args.json), report)
        print(f"saved {args.json}")
    return EXIT_OK
