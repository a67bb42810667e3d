"""``c128a bench``: time the project's kernel against the baseline design (GPU).

For each shape (the seed's prefill rows, decode-heavy batches with block-table
lookups, mixed batches) it times, with the median of
``triton.testing.do_bench`` (L2 flushed before every launch), the bare kernel
launches (:func:`c128a.kernels.adaptive.launch`,
:func:`c128a.kernels.baseline.launch`; no validation, which synchronises) at
the policy's width W ("adaptive") and at the capacity C ("fixed"). In the
same run it measures the device's copy bandwidth and an empty kernel's
launch, and derives the floor of each shape: bytes the contract must move
(every output written once, every input read once) over that bandwidth,
plus one empty launch. Every timed launch is checked exactly against the
oracle (:mod:`c128a.contract.oracle`) on poisoned buffers.

A kernel module's user: import it only after the device is chosen.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import platform
from dataclasses import asdict, dataclass, field

import torch
from rich.console import Console
from rich.table import Table

from ..contract import BLOCK_SIZE, COMPRESS_RATIO, BuildArgs, policy, write_metadata
from ..kernels import adaptive, baseline
from ..kernels.compiled import compiled_variants
from ..kernels.timing import launch_empty, median_us
from ..step import POISON

PAGE_SIZE_ENTRIES = BLOCK_SIZE  # a 256-token KV page holds 2 compressed entries
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


def call_arguments(inputs: Inputs, buffers, width: int) -> BuildArgs:
    """The builder's arguments for ``inputs`` into ``buffers`` at ``width``."""
    decode, lens, prefill = buffers
    return BuildArgs(
        positions=inputs.positions,
        compress_ratio=COMPRESS_RATIO,
        num_decode_tokens=inputs.num_decode_tokens,
        token_to_req_indices=inputs.token_to_req_indices,
        block_table=inputs.block_table,
        block_size=PAGE_SIZE_ENTRIES,
        slot_mapping=inputs.slot_mapping,
        global_decode_buffer=decode,
        decode_lens_buffer=lens,
        prefill_buffer=prefill,
        max_compressed_tokens=width,
    )


def floor_bytes(shape: Shape, inputs: Inputs, width: int) -> int:
    """Bytes the contract must move at ``width``: outputs written once, inputs
    read once (positions; request ids and slot ids of decode tokens; the
    block-table entries the longest token of each request needs)."""
    ratio = COMPRESS_RATIO
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
    got = allocate_buffers(shape, device)
    launch(call_arguments(inputs, got, width))
    want = allocate_buffers(shape, device)
    write_metadata(call_arguments(inputs, want, width))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return all(torch.equal(g, w) for g, w in zip(got, want))


def measure_copy_bandwidth(device, warmup_ms: int, rep_ms: int, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read plus written per second."""
    src = torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    seconds = median_us(lambda: dst.copy_(src), warmup_ms, rep_ms) * 1e-6
    del src, dst
    return 2 * nbytes / seconds


def measure_empty_launch(device, warmup_ms: int, rep_ms: int) -> float:
    scratch = torch.zeros(1, dtype=torch.int32, device=device)
    return median_us(lambda: launch_empty(scratch), warmup_ms, rep_ms)


def compiled_registers(device: torch.device) -> dict[str, list[int]]:
    """Registers per thread of each compiled variant of the project's and the
    baseline's kernels (occupancy explains some of their differences)."""
    kernels = {"project": adaptive.c128a_topk_kernel, "baseline": baseline.baseline_topk_kernel}
    return {
        name: sorted(getattr(k, "n_regs", -1) for k in compiled_variants(jit, device))
        for name, jit in kernels.items()
    }


def run_benchmark(args, device: torch.device, tiles) -> dict:
    """Time every shape of ``args.groups`` (and the ``tiles`` variants)."""
    warmup_ms, rep_ms = args.warmup_ms, args.rep_ms
    groups = set(args.groups.split(","))
    shapes = [s for s in SHAPES if s.group in groups]
    copy_bandwidth = measure_copy_bandwidth(device, warmup_ms, rep_ms)
    empty_launch_us = measure_empty_launch(device, warmup_ms, rep_ms)
    kernels = {"baseline": baseline.launch, "project": adaptive.launch}
    for block_t, block_w, wide_w, warps, per_sm, registers in tiles:

        def tiled(
            call, _tile=(block_t, block_w, wide_w), _warps=warps, _per_sm=per_sm, _regs=registers
        ):
            adaptive.launch_tiled(
                call, tile=_tile, num_warps=_warps, programs_per_sm=_per_sm,
                max_registers=_regs or None,
            )

        name = f"tile {block_t}x{block_w}x{wide_w}x{warps}x{per_sm}"
        kernels[name + (f"x{registers}" if registers else "")] = tiled

    results = []
    for shape in shapes:
        inputs = make_inputs(shape, device)
        width = policy.active_topk_width(
            inputs.max_seq_len, COMPRESS_RATIO, shape.capacity, batch_invariant=False
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
                micros = median_us(lambda: launch(call), warmup_ms, rep_ms)
                exact = exact_against_oracle(launch, shape, inputs, w, device)
                result.timings.append(Timing(name, w, micros, exact))
                del buffers
        results.append(result)
        print(f"  {shape.name}: done", flush=True)
        torch.cuda.empty_cache()

    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": importlib.metadata.version("triton"),
        "python": platform.python_version(),
        "project_tile": list(adaptive.TILE),
        "project_num_warps": adaptive.NUM_WARPS,
        "project_programs_per_sm": adaptive.PROGRAMS_PER_SM,
        "project_max_registers": adaptive.MAX_REGISTERS,
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
