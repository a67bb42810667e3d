"""``c128a bench``: time the project's kernel against the baseline design.

For each shape (the seed's prefill rows, decode-heavy batches with block-table
lookups, mixed batches) it times, with the median of
``triton.testing.do_bench`` (L2 flushed before every launch), the bare kernel
launches (:func:`c128a.kernel.launch`, :func:`c128a.baseline.launch`; no
validation, which synchronises) at the policy's width W ("adaptive") and at
the capacity C ("fixed"). In the same run it measures the device's copy
bandwidth and an empty kernel's launch, and derives the floor of each shape:
bytes the contract must move (every output written once, every input read
once) over that bandwidth, plus one empty launch. Every timed launch is
checked exactly against the oracle (:mod:`c128a.reference`) on poisoned
buffers. ``--check N`` instead runs N random differential batches (CPU under
Triton's interpreter, or CUDA) and times nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
from dataclasses import asdict, dataclass, field

import torch

from . import policy
from .batch import POISON
from .cli import usage_error

PAGE_SIZE_ENTRIES = 2  # block_size: a 256-token KV page holds 2 compressed entries
TABLE_PADDING = 16  # the block table is a slice of a wider one, as vLLM passes it


@dataclass(frozen=True)
class Shape:
    """One benchmarked batch: decode requests of ``tokens_per_request`` tokens
    each with sequences near ``context``, then ``prefill_tokens`` tokens of one
    request ending at ``prefill_end`` (``context`` when 0)."""

    name: str
    group: str
    context: int
    decode_requests: int = 0
    tokens_per_request: int = 1
    prefill_tokens: int = 0
    prefill_end: int = 0
    max_model_len: int = 1 << 20

    @property
    def num_decode_tokens(self) -> int:
        return self.decode_requests * self.tokens_per_request

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.prefill_tokens

    @property
    def capacity(self) -> int:
        return policy.capacity_width(self.max_model_len)


SHAPES = (
    # The seed's table: context 32,768, capacity 8192 (1M model), prefill rows.
    *(
        Shape(f"prefill {t:,}", "prefill", context=32_768, prefill_tokens=t)
        for t in (512, 2_048, 8_192, 32_768)
    ),
    # Decode-heavy: long sequences, one block-table lookup per entry.
    *(
        Shape(
            f"decode {t:,} @ {label}",
            "decode",
            context=ctx,
            decode_requests=t,
            max_model_len=ctx,
        )
        for ctx, label in ((131_072, "128K"), (1 << 20, "1M"))
        for t in (512, 4_096)
    ),
    # Mixed: speculative decode (4 tokens a request) beside a prefill chunk.
    Shape(
        "mixed 256x4 + 4,096 @ 128K",
        "mixed",
        context=131_072,
        decode_requests=256,
        tokens_per_request=4,
        prefill_tokens=4_096,
        max_model_len=131_072,
    ),
    Shape(
        "mixed 128 + 8,192 @ 1M",
        "mixed",
        context=1 << 20,
        decode_requests=128,
        prefill_tokens=8_192,
        prefill_end=508_192,
    ),
)


@dataclass
class Inputs:
    positions: torch.Tensor
    token_to_req_indices: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_decode_tokens: int
    max_seq_len: int


def make_inputs(shape: Shape, device: torch.device, seed: int = 0) -> Inputs:
    """Random, valid inputs for ``shape`` (deterministic for a seed)."""
    gen = torch.Generator().manual_seed(seed)
    requests = shape.decode_requests
    # Sequence lengths in [context / 2, context]; the first is the full context.
    seq_lens = torch.randint(shape.context // 2, shape.context + 1, (requests,), generator=gen)
    if requests:
        seq_lens[0] = shape.context
    decode_positions = []
    request_of_token = []
    for r in range(requests):
        first = int(seq_lens[r]) - shape.tokens_per_request
        decode_positions.extend(range(first, first + shape.tokens_per_request))
        request_of_token.extend([r] * shape.tokens_per_request)
    prefill_end = shape.prefill_end or shape.context
    prefill_positions = list(range(prefill_end - shape.prefill_tokens, prefill_end))
    positions = torch.tensor(decode_positions + prefill_positions, dtype=torch.int64)
    # Prefill tokens belong to one more request, after the decode ones.
    token_to_req = torch.tensor(
        request_of_token + [requests] * shape.prefill_tokens, dtype=torch.int32
    )
    pages = -(-shape.capacity // PAGE_SIZE_ENTRIES)
    wide = torch.randint(0, 1 << 20, (max(requests, 1), pages + TABLE_PADDING), generator=gen)
    slot_mapping = torch.randint(0, 1 << 24, (shape.num_tokens,), generator=gen)
    if shape.num_decode_tokens >= 16:
        slot_mapping[shape.num_decode_tokens - 8 : shape.num_decode_tokens] = -1  # graph padding
    wide_device = wide.to(torch.int32).to(device)
    return Inputs(
        positions=positions.to(device),
        token_to_req_indices=token_to_req.to(device),
        block_table=wide_device[:requests, :pages],
        slot_mapping=slot_mapping.to(device),
        num_decode_tokens=shape.num_decode_tokens,
        max_seq_len=int(positions.max()) + 1 if positions.numel() else 0,
    )


def allocate_buffers(shape: Shape, device: torch.device):
    rows_decode = max(shape.num_decode_tokens, 1)
    rows_prefill = max(shape.prefill_tokens, 1)
    capacity = shape.capacity
    return (
        torch.full((rows_decode, capacity), POISON, dtype=torch.int32, device=device),
        torch.full((rows_decode,), POISON, dtype=torch.int32, device=device),
        torch.full((rows_prefill, capacity), POISON, dtype=torch.int32, device=device),
    )


def call_arguments(inputs: Inputs, buffers, width: int) -> tuple:
    """vLLM's argument order, for ``launch`` and ``build_c128a_topk_metadata``."""
    decode, lens, prefill = buffers
    return (
        inputs.positions,
        policy.COMPRESS_RATIO,
        inputs.num_decode_tokens,
        inputs.token_to_req_indices,
        inputs.block_table,
        PAGE_SIZE_ENTRIES,
        inputs.slot_mapping,
        decode,
        lens,
        prefill,
        width,
    )


def floor_bytes(shape: Shape, inputs: Inputs, width: int) -> int:
    """Bytes the contract must move at ``width``: outputs written once, inputs
    read once (positions; request ids and slot ids of decode tokens; the
    block-table entries the longest token of each request needs)."""
    ratio = policy.COMPRESS_RATIO
    num_decode = inputs.num_decode_tokens
    written = shape.num_tokens * width * 4 + num_decode * 4
    read = shape.num_tokens * 8 + num_decode * (4 + 8)
    if num_decode:
        lengths = torch.clamp((inputs.positions[:num_decode] + 1) // ratio, max=width)
        requests = inputs.token_to_req_indices[:num_decode].long()
        longest = torch.zeros(shape.decode_requests, dtype=torch.int64, device=lengths.device)
        longest.scatter_reduce_(0, requests, lengths, reduce="amax")
        read += int((-(-longest // PAGE_SIZE_ENTRIES)).sum()) * 4
    return written + read


@dataclass
class Timing:
    kernel: str
    width: int
    median_us: float
    exact: bool


@dataclass
class ShapeResult:
    shape: dict
    num_tokens: int
    num_decode_tokens: int
    capacity: int
    width: int
    floor_bytes: int
    floor_us: float
    timings: list[Timing] = field(default_factory=list)

    def time(self, kernel: str, width: int) -> float:
        for t in self.timings:
            if t.kernel == kernel and t.width == width:
                return t.median_us
        return math.nan


def exact_against_oracle(launch, shape: Shape, inputs: Inputs, width: int, device) -> bool:
    """Run ``launch`` once on poisoned buffers and compare every buffer,
    written region and canaries alike, with the oracle's."""
    from . import reference

    got = allocate_buffers(shape, device)
    launch(*call_arguments(inputs, got, width))
    want = allocate_buffers(shape, device)
    reference.build_c128a_topk_metadata(*call_arguments(inputs, want, width))
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    return all(torch.equal(g, w) for g, w in zip(got, want))


def median_us(fn, warmup_ms: int, rep_ms: int) -> float:
    import triton.testing

    return 1000.0 * triton.testing.do_bench(
        fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"
    )


def measure_copy_bandwidth(device, warmup_ms: int, rep_ms: int, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read plus written per second."""
    src = torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    seconds = median_us(lambda: dst.copy_(src), warmup_ms, rep_ms) * 1e-6
    del src, dst
    return 2 * nbytes / seconds


def measure_empty_launch(device, warmup_ms: int, rep_ms: int) -> float:
    from .kernel import empty_kernel

    scratch = torch.zeros(1, dtype=torch.int32, device=device)
    return median_us(lambda: empty_kernel[(1,)](scratch), warmup_ms, rep_ms)


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
            usage_error(
                f"bench: --tiles item {item!r} must look like 4x128x1024x4x16 "
                "(or 4x128x1024x4x16x32 with a register cap)"
            )
        tiles.append(tuple(int(p) for p in parts) + (0,) * (6 - len(parts)))
    return tiles


def compiled_registers(device: torch.device) -> dict[str, list[int]]:
    """Registers per thread of each compiled variant of the project's and the
    baseline's kernels (occupancy explains some of their differences)."""
    from . import baseline, kernel

    kernels = {"project": kernel.c128a_topk_kernel, "baseline": baseline.baseline_topk_kernel}
    return {
        name: sorted(getattr(k, "n_regs", -1) for k in kernel.compiled_variants(jit, device))
        for name, jit in kernels.items()
    }


def run_benchmark(args, device: torch.device) -> dict:
    from . import baseline, kernel

    warmup_ms, rep_ms = args.warmup_ms, args.rep_ms
    groups = set(args.groups.split(","))
    shapes = [s for s in SHAPES if s.group in groups]
    copy_bandwidth = measure_copy_bandwidth(device, warmup_ms, rep_ms)
    empty_launch_us = measure_empty_launch(device, warmup_ms, rep_ms)
    kernels = {"baseline": baseline.launch, "project": kernel.launch}
    for block_t, block_w, wide_w, warps, per_sm, registers in parse_tiles(args.tiles):

        def tiled(
            *call, _tile=(block_t, block_w, wide_w), _warps=warps, _per_sm=per_sm, _regs=registers
        ):
            kernel.launch_tiled(
                *call, tile=_tile, num_warps=_warps, programs_per_sm=_per_sm,
                max_registers=_regs or None,
            )

        name = f"tile {block_t}x{block_w}x{wide_w}x{warps}x{per_sm}"
        kernels[name + (f"x{registers}" if registers else "")] = tiled

    results = []
    for shape in shapes:
        inputs = make_inputs(shape, device)
        width = policy.active_topk_width(
            inputs.max_seq_len, policy.COMPRESS_RATIO, shape.capacity, batch_invariant=False
        )
        nbytes = floor_bytes(shape, inputs, width)
        result = ShapeResult(
            shape=asdict(shape),
            num_tokens=shape.num_tokens,
            num_decode_tokens=shape.num_decode_tokens,
            capacity=shape.capacity,
            width=width,
            floor_bytes=nbytes,
            floor_us=nbytes / copy_bandwidth * 1e6 + empty_launch_us,
        )
        widths = sorted({width, shape.capacity})
        for name, launch in kernels.items():
            for w in widths:
                if name.startswith("tile") and w != width and not args.tiles_at_capacity:
                    continue
                buffers = allocate_buffers(shape, device)
                call = call_arguments(inputs, buffers, w)
                micros = median_us(lambda: launch(*call), warmup_ms, rep_ms)
                exact = exact_against_oracle(launch, shape, inputs, w, device)
                result.timings.append(Timing(name, w, micros, exact))
                del buffers
        results.append(result)
        print(f"  {shape.name}: done", flush=True)
        torch.cuda.empty_cache()

    import triton

    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "project_tile": list(kernel.TILE),
        "project_num_warps": kernel.NUM_WARPS,
        "project_programs_per_sm": kernel.PROGRAMS_PER_SM,
        "project_max_registers": kernel.MAX_REGISTERS,
        "registers_per_thread": compiled_registers(device),
        "copy_bandwidth_bytes_per_s": copy_bandwidth,
        "empty_launch_us": empty_launch_us,
        "warmup_ms": warmup_ms,
        "rep_ms": rep_ms,
        "shapes": [asdict(r) for r in results],
    }


def summary_rows(report: dict) -> list[dict]:
    """One row a shape: fixed and adaptive times, floor and ratios."""
    rows = []
    for r in report["shapes"]:
        times = {(t["kernel"], t["width"]): t["median_us"] for t in r["timings"]}
        w, c = r["width"], r["capacity"]
        project, base = times[("project", w)], times[("baseline", w)]
        rows.append(
            {
                "shape": r["shape"]["name"],
                "T": r["num_tokens"],
                "C": c,
                "W": w,
                "baseline_fixed_us": times[("baseline", c)],
                "project_fixed_us": times[("project", c)],
                "baseline_us": base,
                "project_us": project,
                "floor_us": r["floor_us"],
                "project_over_baseline": project / base,
                "project_over_floor": project / r["floor_us"],
                "exact": all(t["exact"] for t in r["timings"]),
            }
        )
    return rows


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=240)
    title = (
        f"c128a bench, {report['device']}, {report['date']} (median us; torch {report['torch']}, "
        f"triton {report['triton']}); copy {report['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"empty launch {report['empty_launch_us']:.2f} us"
    )
    table = Table(title=title)
    for col in (
        "shape", "T", "C", "W", "base@C", "proj@C", "base@W", "proj@W", "floor",
        "proj/base", "proj/floor", "exact",
    ):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for row in summary_rows(report):
        table.add_row(
            row["shape"],
            f"{row['T']:,}",
            str(row["C"]),
            str(row["W"]),
            f"{row['baseline_fixed_us']:.2f}",
            f"{row['project_fixed_us']:.2f}",
            f"{row['baseline_us']:.2f}",
            f"{row['project_us']:.2f}",
            f"{row['floor_us']:.2f}",
            f"{row['project_over_baseline']:.2f}",
            f"{row['project_over_floor']:.2f}",
            "yes" if row["exact"] else "NO",
        )
    console.print(table)
    registers = report.get("registers_per_thread") or {}
    if registers:
        console.print(
            "registers per thread of the compiled variants: "
            + "; ".join(f"{name} {values}" for name, values in registers.items())
        )

    tiles = sorted(
        {t["kernel"] for r in report["shapes"] for t in r["timings"] if t["kernel"].startswith("tile")}
    )
    if tiles:
        sweep = Table(
            title="tile sweep (median us; BLOCK_T x BLOCK_W x WIDE_W x warps x programs per SM "
            "[x register cap])"
        )
        sweep.add_column("shape")
        for name in ("baseline", "project", *tiles):
            sweep.add_column(name.removeprefix("tile "), justify="right")
        for r in report["shapes"]:
            for width in sorted({t["width"] for t in r["timings"] if t["kernel"] in tiles}):
                times = {t["kernel"]: t for t in r["timings"] if t["width"] == width}
                cells = []
                for name in ("baseline", "project", *tiles):
                    t = times.get(name)
                    cells.append(
                        "-" if t is None else f"{t['median_us']:.2f}" + ("" if t["exact"] else "!")
                    )
                sweep.add_row(f"{r['shape']['name']} W={width}", *cells)
        console.print(sweep)


def random_check_batches(count: int, seed: int):
    """Random small batches across widths, strides, block sizes and padding,
    as (arguments builder, capacity) pairs; deterministic for a seed."""
    gen = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    for _ in range(count):
        capacity = (128, 256, 640)[draw(0, 2)]
        width = policy.reachable_widths(capacity)[draw(0, len(policy.reachable_widths(capacity)) - 1)]
        ratio = (1, 3, 128)[draw(0, 2)]
        block_size = draw(1, 4)
        requests = draw(0, 24)
        per_request = draw(1, 3)
        num_decode = requests * per_request
        num_prefill = draw(0, 70)
        limit = (capacity + 3) * ratio
        positions = torch.randint(0, limit, (num_decode + num_prefill,), generator=gen)
        req = [r for r in range(requests) for _ in range(per_request)] + [requests] * num_prefill
        table_width = -(-capacity // block_size)
        stride = table_width + draw(0, 9)
        table = torch.randint(0, 1 << 16, (max(requests, 1), stride), generator=gen).to(torch.int32)
        slots = torch.randint(-2, 1 << 10, (num_decode + num_prefill + draw(0, 3),), generator=gen)
        row_stride = capacity + draw(0, 5)
        yield {
            "positions": positions,
            "compress_ratio": ratio,
            "num_decode_tokens": num_decode,
            "token_to_req_indices": torch.tensor(req, dtype=torch.int32),
            "wide_table": table,
            "table_width": table_width,
            "requests": requests,
            "block_size": block_size,
            "slot_mapping": slots,
            "rows": num_decode + num_prefill + draw(0, 2),
            "capacity": capacity,
            "row_stride": row_stride,
            "width": width,
        }


def run_check(count: int, seed: int, device: torch.device) -> int:
    """Differential check: kernel and baseline against the oracle, exact, on
    whole poisoned buffers. Returns the number of mismatching batches."""
    from . import baseline, kernel, reference

    def project_at(tile, programs_per_sm):
        # Other tiles than the default, so both of the kernel's paths and its
        # persistent loop meet every width here.
        def build(*args):
            kernel.launch_tiled(*args, tile=tile, num_warps=4, programs_per_sm=programs_per_sm)

        return build

    builders = {
        "project": kernel.build_c128a_topk_metadata,
        "project (wide from 256)": project_at((4, 128, 256), 0),
        "project (persistent, 1 per SM)": project_at((2, 128, 1024), 1),
        "baseline": baseline.build_c128a_topk_metadata,
    }
    failures = 0
    for index, case in enumerate(random_check_batches(count, seed)):
        outputs = {}
        for name, build in {"reference": reference.build_c128a_topk_metadata, **builders}.items():
            wide = torch.full(
                (case["rows"], case["row_stride"]), POISON, dtype=torch.int32, device=device
            )
            decode = wide[:, : case["capacity"]]
            prefill = torch.full_like(wide, POISON)[:, : case["capacity"]]
            lens = torch.full((case["rows"],), POISON, dtype=torch.int32, device=device)
            table = case["wide_table"].to(device)[: case["requests"], : case["table_width"]]
            build(
                case["positions"].to(device),
                case["compress_ratio"],
                case["num_decode_tokens"],
                case["token_to_req_indices"].to(device),
                table,
                case["block_size"],
                case["slot_mapping"].to(device),
                decode,
                lens,
                prefill,
                case["width"],
            )
            outputs[name] = (decode.cpu(), lens.cpu(), prefill.cpu())
        for name in builders:
            if not all(torch.equal(a, b) for a, b in zip(outputs[name], outputs["reference"])):
                failures += 1
                print(
                    f"check {index}: {name} differs from the oracle (W={case['width']}, "
                    f"C={case['capacity']}, R={case['compress_ratio']}, B={case['block_size']}, "
                    f"decode={case['num_decode_tokens']}, T={len(case['positions'])})"
                )
    print(f"check: {count} random batches, {failures} mismatch(es) on {device}")
    return failures


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="timing needs cuda; --check also runs on the cpu (interpreter)")
    parser.add_argument("--json", metavar="FILE", default=None, help="save the full results here")
    parser.add_argument("--groups", default="prefill,decode,mixed",
                        help="comma-separated shape groups: prefill, decode, mixed")
    parser.add_argument("--tiles", default=None, metavar="TxWxWIDExWARPSxPERSM,...",
                        help="also time the project's kernel at these tiles (tuning)")
    parser.add_argument("--tiles-at-capacity", action="store_true",
                        help="time the --tiles variants at W = C too")
    parser.add_argument("--warmup-ms", type=int, default=10, help="do_bench warm-up (ms)")
    parser.add_argument("--rep-ms", type=int, default=40, help="do_bench repetition time (ms)")
    parser.add_argument("--check", type=int, default=0, metavar="N",
                        help="run N random differential batches against the oracle; time nothing")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of --check's batches and of --throughput's examples")
    parser.add_argument("--throughput", action="store_true",
                        help="run one property as a Hypothesis test for --seconds and report "
                        "examples/s and where the time goes (CPU or CUDA)")
    parser.add_argument("--property", default="matches_oracle",
                        help="the property --throughput runs (default matches_oracle)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long --throughput runs, after one warm-up example")
    parser.add_argument("--examples", type=int, default=None, metavar="N",
                        help="--throughput runs N examples instead of --seconds (the same ones "
                        "every run, for comparisons)")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="--throughput draws batches of up to this many tokens")
    parser.add_argument("--target", metavar="SPEC", default=None,
                        help="--throughput's target: triton (default), reference, vllm, MODULE:ATTR")
    parser.add_argument("--profile-out", metavar="FILE", default=None,
                        help="--throughput also runs cProfile, saves its stats here and prints "
                        "the top entries")


def run(args: argparse.Namespace) -> int:
    if args.throughput:
        return _run_throughput(args)
    from .device import DeviceError, use_device

    try:
        name = use_device(args.device)
    except DeviceError as exc:
        usage_error(f"bench: {exc}")
    device = torch.device(name)
    if args.check:
        return 1 if run_check(args.check, args.seed, device) else 0
    if device.type != "cuda":
        usage_error("bench: timing needs a CUDA device (use --check N on the cpu)")
    report = run_benchmark(args, device)
    print_report(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"saved {args.json}")
    rows = summary_rows(report)
    return 0 if all(row["exact"] for row in rows) else 1


# --------------------------------------------------------------------------- throughput

THROUGHPUT_PHASES = (
    "draw", "tensors", "buffers", "validation", "kernel", "oracle", "comparison", "other",
)
"""Where a property example's time goes, each phase's own time (nested phases
excluded): Hypothesis drawing the batch (everything outside the check),
Batch.tensors, poisoned buffers, check_build_arguments, the target's build,
the expected values (the oracle's build), comparing with them, and the rest
of the check."""


class PhaseClock:
    """Exclusive wall time per phase: a phase's time excludes the phases
    entered inside it. On CUDA every phase ends with a synchronisation, so
    asynchronous work is charged to the phase that launched it."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.totals = dict.fromkeys(THROUGHPUT_PHASES, 0.0)
        self.stack: list[list] = []  # [phase, start, time spent in nested phases]

    def wrap(self, phase: str, function):
        import functools
        import time

        @functools.wraps(function)
        def timed(*args, **kwargs):
            self.stack.append([phase, time.perf_counter(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                self.sync()
                _, start, nested = self.stack.pop()
                elapsed = time.perf_counter() - start
                self.totals[phase] += elapsed - nested
                if self.stack:
                    self.stack[-1][2] += elapsed

        return timed


def _instrument(clock: PhaseClock):
    """Wrap the harness's phases in ``clock``; returns a function that undoes it.
    Patches attributes by name, so the checks run unchanged."""
    import sys

    from . import batch as batch_module
    from . import invariants, reference

    patches = [
        (batch_module.Batch, "tensors", "tensors"),
        (reference, "check_build_arguments", "validation"),
        (invariants, "expected_result", "oracle"),
        (invariants, "_compare_rows", "comparison"),
        (invariants, "check_matches_oracle", "comparison"),
    ]
    kernel = sys.modules.get("c128a.kernel")
    if kernel is not None:
        patches.append((kernel, "check_build_arguments", "validation"))
    saved = []
    for owner, name, phase in patches:
        original = owner.__dict__[name]
        saved.append((owner, name, original))
        setattr(owner, name, clock.wrap(phase, original))
    allocate = batch_module.Buffers.__dict__["allocate"]
    saved.append((batch_module.Buffers, "allocate", allocate))
    batch_module.Buffers.allocate = classmethod(clock.wrap("buffers", allocate.__func__))

    def undo():
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)

    return undo


class _TimeUp(BaseException):
    """Ends the run after --seconds; a BaseException, so Hypothesis lets it through."""


def run_throughput(
    target,
    device: torch.device,
    property_name: str = "matches_oracle",
    *,
    seconds: float = 10.0,
    max_tokens: int = 512,
    seed: int = 0,
    examples: int | None = None,
    profile_out: str | None = None,
) -> dict:
    """Run one property as a Hypothesis test for ``seconds`` (or, when
    ``examples`` is given, for that many examples: the same examples on every
    run, to compare two versions of the harness) after one warm-up example,
    and report examples/s and the time per phase.

    Settings are the ``fuzz`` profile's without shrinking (the target is
    expected to pass), seeded for repeatability. Returns a dict with
    ``examples``, ``seconds``, ``examples_per_s``, ``tokens_per_example``
    and ``phases`` (phase -> seconds, ``draw`` being everything outside the
    property's check), plus ``profile_top`` when ``profile_out`` is given.
    """
    import cProfile
    import dataclasses
    import io
    import pstats
    import time

    from hypothesis import Phase, given, settings
    from hypothesis import seed as use_seed

    from . import profiles
    from .properties import PROPERTIES

    if property_name not in PROPERTIES:
        usage_error(
            f"bench: --property={property_name!r} is not one of {', '.join(PROPERTIES)}"
        )
    prop = PROPERTIES[property_name]
    clock = PhaseClock(device)
    timed_target = dataclasses.replace(
        target, build_c128a_topk_metadata=clock.wrap("kernel", target.build_c128a_topk_metadata)
    )
    profiles.register_profiles()
    state = {"examples": 0, "tokens": 0, "inside": 0.0, "start": None}
    profiler = cProfile.Profile() if profile_out else None

    def example(batch):
        now = time.perf_counter()
        if state["start"] is None:  # the first example warms up (compiles, caches)
            prop.check(timed_target, batch, device)
            for phase in clock.totals:
                clock.totals[phase] = 0.0
            state["start"] = time.perf_counter()
            if profiler:
                profiler.enable()
            return
        if (examples is None and now - state["start"] >= seconds) or (
            examples is not None and state["examples"] >= examples
        ):
            raise _TimeUp
        prop.check(timed_target, batch, device)
        state["examples"] += 1
        state["tokens"] += batch.num_tokens
        state["inside"] += time.perf_counter() - now

    test = settings(
        parent=settings.get_profile("fuzz"),
        database=None,
        phases=[Phase.generate, Phase.target],
        report_multiple_bugs=False,
    )(use_seed(seed)(given(prop.strategy(timed_target, max_tokens=max_tokens))(example)))
    undo = _instrument(clock)
    try:
        test()
    except _TimeUp:
        pass
    finally:
        if profiler:
            profiler.disable()
        undo()
    elapsed = time.perf_counter() - (state["start"] or time.perf_counter())
    done = state["examples"]
    phases = dict(clock.totals)
    phases["draw"] = max(elapsed - state["inside"], 0.0)
    phases["other"] = max(state["inside"] - sum(clock.totals.values()), 0.0)
    report = {
        "property": property_name,
        "target": str(target),
        "device": str(device),
        "max_tokens": max_tokens,
        "seed": seed,
        "examples": done,
        "seconds": elapsed,
        "examples_per_s": done / elapsed if elapsed > 0 else 0.0,
        "tokens_per_example": state["tokens"] / done if done else 0.0,
        "phases": phases,
    }
    if profiler:
        profiler.dump_stats(profile_out)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
        report["profile_top"] = text.getvalue()
    return report


def _run_throughput(args: argparse.Namespace) -> int:
    from .cli import prepare

    if args.seconds <= 0:
        usage_error(f"bench: --seconds={args.seconds} must be > 0")
    if args.examples is not None and args.examples <= 0:
        usage_error(f"bench: --examples={args.examples} must be > 0")
    if args.max_tokens < 0:
        usage_error(f"bench: --max-tokens={args.max_tokens} must be >= 0")
    device_name, target, _ = prepare(args)
    if device_name == "cpu":
        # Small tensors: one thread is as fast and steadier on a shared machine.
        torch.set_num_threads(1)
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
    print_throughput(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"saved {args.json}")
    return 0


def print_throughput(report: dict) -> None:
    examples, elapsed = report["examples"], report["seconds"]
    print(
        f"throughput: {report['property']} on {report['target']} ({report['device']}), "
        f"batches of up to {report['max_tokens']} tokens, seed {report['seed']}: "
        f"{examples} examples in {elapsed:.1f} s = {report['examples_per_s']:.1f} examples/s "
        f"(mean {report['tokens_per_example']:.0f} tokens)"
    )
    per_example = 1e3 / max(examples, 1)
    for phase in THROUGHPUT_PHASES:
        spent = report["phases"][phase]
        share = 100 * spent / elapsed if elapsed > 0 else 0.0
        print(f"  {phase:<11} {spent:8.2f} s  {share:5.1f} %  {spent * per_example:8.3f} ms/example")
    if "profile_top" in report:
        print(report["profile_top"])
