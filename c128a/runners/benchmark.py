"""``c128a bench``: time the project's kernel against the baseline design and,
optionally, a vLLM release's kernel (GPU).

For each shape (the seed's prefill rows, decode-heavy batches with block-table
lookups, mixed batches) it times the bare kernel launches
(:func:`c128a.kernels.adaptive.launch`, :func:`c128a.kernels.baseline.launch`;
no validation, which synchronises) and, with ``--vllm-release``, that
release's kernel launched with the arguments its launcher computes
(:meth:`c128a.kernels.vllm_extracts.BareLaunch.prepare`: the launcher's
Python, run by c128a's stand-ins, once per shape and width; the builder's
asserts and views left out), at the policy's width W ("adaptive") and at the
capacity C ("fixed"), with two clocks (:mod:`c128a.kernels.timing`):

- ``do_bench_us``: the median of ``triton.testing.do_bench`` (L2 flushed
  before every launch; the host's launch cost is in it for short kernels);
- ``graph_us``: the GPU's time alone: ``--graph-launches`` launches captured
  into one CUDA graph, the replay timed with CUDA events and divided by the
  launch count, the median of ``--graph-replays`` replays (L2 not flushed
  between the captured launches). ``None`` with ``--graph-launches 0``.

In the same run it measures the device's copy bandwidth and an empty
kernel's launch with both clocks, and derives the floors of each shape:
bytes the contract must move (every output written once, every input read
once) over that bandwidth, plus one empty launch (``floor_us`` with the
do_bench launch, ``graph_floor_us`` with the graph one). Every timed launch
is checked exactly against the oracle (:mod:`c128a.contract.oracle`) on
poisoned buffers, in the padding-row variant its kernel declares (``slots``
for all three; vLLM 0.34's is ``slots``).

A kernel module's user: import it only after the device is chosen.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import math
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from rich.console import Console
from rich.table import Table

from ..contract import BLOCK_SIZE, COMPRESS_RATIO, SLOTS, BuildArgs, policy, write_metadata
from ..failures import UsageError
from ..options import DEFAULT_GRAPH_LAUNCHES, DEFAULT_GRAPH_REPLAYS
from ..kernels import adaptive, baseline, vllm_extracts
from ..kernels.compiled import compiled_variants
from ..kernels.timing import graph_us, launch_empty, median_us
from ..step import (
    POISON,
    Batch,
    BatchTensors,
    Buffers,
    PermutedBlockTable,
    StepRequest,
    assemble_batch,
    page_modulus,
)
from ..targets import load_target
from ..targets.vllm_release import PREFIX as VLLM_RELEASE_PREFIX
from ..targets.vllm_release import VERSION_KEY

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
    """One benchmarked step: the :class:`~c128a.step.Batch` that
    :func:`~c128a.step.assemble_batch` puts together for a shape, and its
    tensor arguments on the device."""

    batch: Batch
    tensors: BatchTensors

    @property
    def positions(self) -> torch.Tensor:
        return self.tensors.positions

    @property
    def token_to_req_indices(self) -> torch.Tensor:
        return self.tensors.token_to_req_indices

    @property
    def num_decode_tokens(self) -> int:
        return self.batch.num_decode_tokens


def make_batch(shape: Shape, seed: int = 0) -> Batch:
    """A valid step of ``shape`` (deterministic for a seed): decode requests
    with sequences in [context / 2, context] (the first the full context),
    their last 8 tokens CUDA-graph padding when there are 16 or more, then
    one prefill request; random slots, and every table row full of unique,
    shuffled pages, as the first columns of a wider table."""
    gen = torch.Generator().manual_seed(seed)
    requests = shape.decode_requests
    seq_lens = torch.randint(shape.context // 2, shape.context + 1, (requests,), generator=gen)
    if requests:
        seq_lens[0] = shape.context
    slots = torch.randint(0, 1 << 24, (shape.num_tokens,), generator=gen).tolist()
    per_request = shape.tokens_per_request
    decode = [
        StepRequest(
            tuple(range(seq_len - per_request, seq_len)),
            tuple(slots[r * per_request : (r + 1) * per_request]),
        )
        for r, seq_len in enumerate(seq_lens.tolist())
    ]
    prefill_end = shape.prefill_end or shape.context
    prefill = [
        StepRequest(
            tuple(range(prefill_end - shape.prefill_tokens, prefill_end)),
            tuple(slots[shape.num_decode_tokens :]),
        )
    ] if shape.prefill_tokens else []
    num_decode = shape.num_decode_tokens
    padding = range(num_decode - 8, num_decode) if num_decode >= 16 else range(0)
    pages = -(-shape.capacity // PAGE_SIZE_ENTRIES)
    prime = page_modulus(PAGE_SIZE_ENTRIES, requests * pages)
    scale, offset = (int(v) for v in torch.randint(1, prime, (2,), generator=gen))
    batch = assemble_batch(
        decode,
        prefill,
        block_table=PermutedBlockTable(
            (pages,) * requests, pages, scale=scale, offset=offset, prime=prime
        ),
        padded_tokens={token: -1 for token in padding},
        block_table_row_stride=pages + TABLE_PADDING,
        block_size=PAGE_SIZE_ENTRIES,
        max_model_len=shape.max_model_len,
        capacity=shape.capacity,
        width=0,  # the policy's, for the step's longest sequence (below)
        # bench allocates its own buffers (allocate_buffers): decode and
        # prefill rows apart, not buffer_rows of each.
        buffer_rows=max(shape.num_tokens, 1),
    )
    return batch.with_width(
        policy.active_topk_width(batch.max_seq_len, COMPRESS_RATIO, shape.capacity,
                                 batch_invariant=False)
    )


def make_inputs(shape: Shape, device: torch.device, seed: int = 0) -> Inputs:
    """:func:`make_batch`'s step for ``shape`` and its tensors on ``device``."""
    batch = make_batch(shape, seed)
    return Inputs(batch, batch.tensors(device))


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
    return inputs.batch.build_args(inputs.tensors, Buffers(*buffers), width)


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



BASELINE, PROJECT, VLLM = "baseline", "project", "vllm"
KERNELS = (BASELINE, PROJECT, VLLM)
"""The summary's kernel columns, in order (``vllm`` only with a release)."""
LABELS = {BASELINE: "base", PROJECT: "proj", VLLM: "vllm"}


def select_shapes(groups: str, names: list[str] | None = None) -> list[Shape]:
    """The shapes of ``groups`` (comma-separated), only those named in
    ``names`` where given; a usage error for an unknown name or an empty
    selection."""
    wanted = set(groups.split(","))
    if names:
        unknown = [name for name in names if name not in {s.name for s in SHAPES}]
        if unknown:
            raise UsageError(
                f"--shape {', '.join(map(repr, unknown))}: choose from "
                + ", ".join(repr(s.name) for s in SHAPES)
            )
    shapes = [s for s in SHAPES if s.group in wanted and (not names or s.name in names)]
    if not shapes:
        raise UsageError(f"no shape is both in --groups {groups} and named by --shape")
    return shapes


# ---------------------------------------------------------------- a vLLM release's kernel


@dataclass(frozen=True)
class ReleaseKernel:
    """A vLLM release's kernel as bench times it: the launch inside the
    release's builder (its asserts and views left out), and where it came from."""

    spec: str
    version: str
    extract: str
    source_sha256: str
    launch: vllm_extracts.BareLaunch
    jit_functions: tuple = ()
    padding_rows: str = SLOTS

    def describe(self) -> dict:
        """What the JSON report says about it."""
        return {
            "spec": self.spec,
            "version": self.version,
            "extract": self.extract,
            "source_sha256": self.source_sha256,
            "launcher": self.launch.__name__,
            "padding_rows": self.padding_rows,
        }


def load_release(text: str) -> ReleaseKernel:
    """The kernel of the vLLM release ``text`` names (a version, or a path:
    a wheel, an extract, a folder holding one; as ``vllm-release:TEXT``,
    :mod:`c128a.targets.vllm_release`). A usage error naming ``text`` when it
    is not there (a missing path, a version pip cannot fetch) or its builder
    holds no launcher to time bare."""
    spec = f"{VLLM_RELEASE_PREFIX}:{text.strip()}"
    try:
        target = load_target(spec)
        launch = vllm_extracts.bare_launch(target.build_c128a_topk_metadata)
    except (UsageError, vllm_extracts.ExtractError) as exc:
        raise UsageError(f"--vllm-release {text}: {exc}") from exc
    extract = Path(target.build_c128a_topk_metadata.__code__.co_filename)
    header = vllm_extracts.read_header(extract)
    return ReleaseKernel(
        spec=spec,
        version=header.get(VERSION_KEY, "unknown"),
        extract=str(extract),
        source_sha256=header.get("source-sha256", ""),
        launch=launch,
        jit_functions=target.jit_functions,
        padding_rows=target.padding_rows,
    )


# ---------------------------------------------------------------- measuring


@dataclass
class Timing:
    kernel: str
    width: int
    do_bench_us: float
    graph_us: float | None
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
    graph_floor_us: float | None = None
    timings: list[Timing] = field(default_factory=list)

    def time(self, kernel: str, width: int, clock: str = "do_bench_us") -> float:
        for t in self.timings:
            if t.kernel == kernel and t.width == width:
                value = getattr(t, clock)
                return math.nan if value is None else value
        return math.nan


def exact_against_oracle(
    launch, shape: Shape, inputs: Inputs, width: int, device, padding_rows: str = SLOTS
) -> bool:
    """Run ``launch`` once on poisoned buffers and compare every buffer,
    written region and canaries alike, with the oracle's (of the
    ``padding_rows`` variant)."""
    got = allocate_buffers(shape, device)
    launch(call_arguments(inputs, got, width))
    want = allocate_buffers(shape, device)
    write_metadata(call_arguments(inputs, want, width), padding_rows)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


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


def measure_empty_launch_graph(device, launches: int, replays: int) -> float:
    """An empty kernel's time inside a CUDA graph (the graph clock's floor)."""
    scratch = torch.zeros(1, dtype=torch.int32, device=device)
    return graph_us(lambda: launch_empty(scratch), device, launches, replays)


def compiled_registers(device: torch.device, release: ReleaseKernel | None = None) -> dict:
    """Registers per thread of each compiled variant of the project's, the
    baseline's (and the release's) kernels (occupancy explains some of their
    differences)."""
    kernels = {PROJECT: list(adaptive.jit_functions), BASELINE: [baseline.baseline_topk_kernel]}
    if release is not None:
        kernels[VLLM] = list(release.jit_functions)
    return {
        name: sorted(
            getattr(k, "n_regs", -1) for jit in jits for k in compiled_variants(jit, device)
        )
        for name, jits in kernels.items()
    }


def per_call(launch: Callable[[BuildArgs], None]) -> Callable[[BuildArgs], Callable[[], None]]:
    """What bench times for ``launch`` (whose Python runs on every call, as the
    project's and the baseline's do): ``launch(args)`` itself."""
    return lambda args: functools.partial(launch, args)


def run_benchmark(args, device: torch.device, tiles, release: ReleaseKernel | None = None) -> dict:
    """Time every shape of ``args.groups`` (``args.shapes`` where named) for
    the baseline, the project's kernel, ``release``'s where given and the
    ``tiles`` variants, with both clocks."""
    warmup_ms, rep_ms = args.warmup_ms, args.rep_ms
    launches = getattr(args, "graph_launches", DEFAULT_GRAPH_LAUNCHES)
    replays = getattr(args, "graph_replays", DEFAULT_GRAPH_REPLAYS)
    shapes = select_shapes(args.groups, getattr(args, "shapes", None))
    copy_bandwidth = measure_copy_bandwidth(device, warmup_ms, rep_ms)
    empty_launch_us = measure_empty_launch(device, warmup_ms, rep_ms)
    empty_launch_graph_us = (
        measure_empty_launch_graph(device, launches, replays) if launches else None
    )
    # name -> (prepare, the padding-row variant its exactness is checked in), where
    # prepare(args) returns the call bench times (and checks) for those arguments
    kernels = {
        BASELINE: (per_call(baseline.launch), SLOTS),
        PROJECT: (per_call(adaptive.launch), SLOTS),
    }
    if release is not None:
        kernels[VLLM] = (release.launch.prepare, release.padding_rows)
    for block_t, block_w, wide_w, warps, per_sm, registers in tiles:

        def tiled(
            call, _tile=(block_t, block_w, wide_w), _warps=warps, _per_sm=per_sm, _regs=registers
        ):
            adaptive.launch_tiled(
                call, tile=_tile, num_warps=_warps, programs_per_sm=_per_sm,
                max_registers=_regs or None,
            )

        name = f"tile {block_t}x{block_w}x{wide_w}x{warps}x{per_sm}"
        kernels[name + (f"x{registers}" if registers else "")] = (per_call(tiled), SLOTS)

    results = []
    for shape in shapes:
        inputs = make_inputs(shape, device)
        width = inputs.batch.width
        nbytes = floor_bytes(shape, inputs, width)
        transfer_us = nbytes / copy_bandwidth * 1e6
        result = ShapeResult(
            shape=asdict(shape),
            num_tokens=shape.num_tokens,
            num_decode_tokens=shape.num_decode_tokens,
            capacity=shape.capacity,
            width=width,
            floor_bytes=nbytes,
            floor_us=transfer_us + empty_launch_us,
            graph_floor_us=(
                None if empty_launch_graph_us is None else transfer_us + empty_launch_graph_us
            ),
        )
        widths = sorted({width, shape.capacity})
        for name, (prepare, padding_rows) in kernels.items():
            for w in widths:
                if name.startswith("tile") and w != width and not args.tiles_at_capacity:
                    continue
                buffers = allocate_buffers(shape, device)
                timed = prepare(call_arguments(inputs, buffers, w))
                micros = median_us(timed, warmup_ms, rep_ms)
                graph = graph_us(timed, device, launches, replays) if launches else None
                exact = exact_against_oracle(
                    lambda call, _prepare=prepare: _prepare(call)(),
                    shape, inputs, w, device, padding_rows,
                )
                result.timings.append(Timing(name, w, micros, graph, exact))
                del buffers, timed
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
        "project_wide_num_warps": adaptive.WIDE_NUM_WARPS,
        "project_programs_per_sm": adaptive.PROGRAMS_PER_SM,
        "project_single_row_tokens_per_sm": adaptive.SINGLE_ROW_TOKENS_PER_SM,
        "project_max_registers": adaptive.MAX_REGISTERS,
        "kernels": [k for k in KERNELS if k in kernels],
        "vllm_release": None if release is None else release.describe(),
        "registers_per_thread": compiled_registers(device, release),
        "copy_bandwidth_bytes_per_s": copy_bandwidth,
        "empty_launch_us": empty_launch_us,
        "empty_launch_graph_us": empty_launch_graph_us,
        "warmup_ms": warmup_ms,
        "rep_ms": rep_ms,
        "graph_launches": launches,
        "graph_replays": replays,
        "shapes": [asdict(r) for r in results],
    }


# ---------------------------------------------------------------- the report


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _clocks(timing: dict) -> tuple[float | None, float | None]:
    """(do_bench, graph) of one timing; reports before the graph clock named
    the do_bench time ``median_us``."""
    return timing.get("do_bench_us", timing.get("median_us")), timing.get("graph_us")


def summary_rows(report: dict) -> list[dict]:
    """One row a shape: each kernel's do_bench and graph times at W and at C
    (``None`` where not measured: no release, ``--graph-launches 0``), the
    floors, and the ratios of the project's kernel to the others and to the
    floor (each clock to its own)."""
    rows = []
    for r in report["shapes"]:
        clocks = {(t["kernel"], t["width"]): _clocks(t) for t in r["timings"]}
        w, c = r["width"], r["capacity"]
        row = {"shape": r["shape"]["name"], "T": r["num_tokens"], "C": c, "W": w}
        for kernel in KERNELS:
            row[f"{kernel}_fixed_us"], row[f"{kernel}_fixed_graph_us"] = clocks.get(
                (kernel, c), (None, None)
            )
            row[f"{kernel}_us"], row[f"{kernel}_graph_us"] = clocks.get((kernel, w), (None, None))
        floor, graph_floor = r["floor_us"], r.get("graph_floor_us")
        project, project_graph = row["project_us"], row["project_graph_us"]
        row.update(
            floor_us=floor,
            graph_floor_us=graph_floor,
            project_over_baseline=_ratio(project, row["baseline_us"]),
            project_over_baseline_graph=_ratio(project_graph, row["baseline_graph_us"]),
            project_over_vllm=_ratio(project, row["vllm_us"]),
            project_over_vllm_graph=_ratio(project_graph, row["vllm_graph_us"]),
            project_over_floor=_ratio(project, floor),
            project_graph_over_floor=_ratio(project_graph, graph_floor),
            exact=all(t["exact"] for t in r["timings"]),
        )
        rows.append(row)
    return rows


def _cell(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def report_columns(rows: list[dict]) -> tuple[list[str], bool]:
    """(the kernels measured in ``rows``, whether the graph clock ran)."""
    kernels = [k for k in KERNELS if any(row[f"{k}_us"] is not None for row in rows)]
    graph = any(row[f"{k}_graph_us"] is not None for row in rows for k in kernels)
    return kernels, graph


def main_table(report: dict, rows: list[dict]) -> Table:
    """At the policy's width W: each kernel's two times, the floors, the ratios."""
    kernels, graph = report_columns(rows)
    clocks = [("", "")] + ([(" g", "_graph")] if graph else [])
    columns: list[tuple[str, Callable[[dict], str]]] = [
        ("shape", lambda row: row["shape"]),
        ("T", lambda row: f"{row['T']:,}"),
        ("C", lambda row: str(row["C"])),
        ("W", lambda row: str(row["W"])),
    ]
    for kernel in kernels:
        for suffix, key in clocks:
            column = f"{kernel}{key}_us"
            columns.append((LABELS[kernel] + suffix, lambda row, k=column: _cell(row[k])))
    columns.append(("floor", lambda row: _cell(row["floor_us"])))
    if graph:
        columns.append(("floor g", lambda row: _cell(row["graph_floor_us"])))
    for other in [k for k in (BASELINE, VLLM) if k in kernels]:
        for suffix, key in clocks:
            name = f"project_over_{other}{key}"
            columns.append((f"proj/{LABELS[other]}{suffix}", lambda row, n=name: _cell(row[n])))
    columns.append(("proj/floor", lambda row: _cell(row["project_over_floor"])))
    if graph:
        columns.append(("proj g/floor g", lambda row: _cell(row["project_graph_over_floor"])))
    columns.append(("exact", lambda row: "yes" if row["exact"] else "NO"))

    title = (
        f"c128a bench, {report['device']}, {report['date']} (us at the policy's width W; torch "
        f"{report['torch']}, triton {report['triton']}); copy "
        f"{report['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, empty launch "
        f"{report['empty_launch_us']:.2f} us"
        + (
            f" ({report['empty_launch_graph_us']:.2f} us in a graph)"
            if report.get("empty_launch_graph_us") is not None
            else ""
        )
    )
    table = Table(title=title)
    for name, _ in columns:
        table.add_column(name, justify="left" if name == "shape" else "right")
    for row in rows:
        table.add_row(*(cell(row) for _, cell in columns))
    return table


def fixed_table(rows: list[dict]) -> Table:
    """At the capacity W = C: each kernel's two times, and the project's
    gain from the adaptive width (its time at C over its time at W)."""
    kernels, graph = report_columns(rows)
    clocks = [("", "")] + ([(" g", "_graph")] if graph else [])
    table = Table(title="at the fixed width W = C (us)")
    table.add_column("shape")
    table.add_column("C", justify="right")
    for kernel in kernels:
        for suffix, _ in clocks:
            table.add_column(f"{LABELS[kernel]}@C{suffix}", justify="right")
    for suffix, _ in clocks:
        table.add_column(f"proj C/W{suffix}", justify="right")
    for row in rows:
        cells = [row["shape"], str(row["C"])]
        for kernel in kernels:
            cells += [_cell(row[f"{kernel}_fixed{key}_us"]) for _, key in clocks]
        cells += [
            _cell(_ratio(row[f"project_fixed{key}_us"], row[f"project{key}_us"]))
            for _, key in clocks
        ]
        table.add_row(*cells)
    return table


def clock_legend(report: dict) -> str:
    """What the columns mean, and where the vLLM column's kernel came from."""
    launches, replays = report.get("graph_launches"), report.get("graph_replays")
    lines = [
        (
            "columns without ' g': the median of triton.testing.do_bench (L2 flushed before "
            "each launch; the host's launch cost is in it for short kernels)"
        )
    ]
    if launches:
        lines.append(
            f"' g': the GPU's time alone: {launches} launches captured in one CUDA graph, the "
            f"replay's time over {launches}, median of {replays} replays (L2 not flushed "
            "between launches)"
        )
    lines.append(
        "floor: bytes written and read over the copy bandwidth, plus one empty launch "
        "(timed with the same clock)"
    )
    release = report.get("vllm_release")
    if release:
        lines.append(
            f"vllm: vLLM {release['version']}'s kernel with the arguments its launcher "
            f"{release['launcher']} computes (once per shape and width; the builder's asserts "
            f"and views left out), from {release['extract']}"
        )
    return "\n".join(lines)


def inexact_launches(report: dict) -> list[str]:
    """'KERNEL at W=WIDTH (SHAPE)' for every timed launch that differed from the oracle."""
    return [
        f"{t['kernel']} at W={t['width']} ({r['shape']['name']})"
        for r in report["shapes"]
        for t in r["timings"]
        if not t["exact"]
    ]


def print_report(report: dict, console: Console | None = None) -> None:
    console = console or Console(width=240)
    rows = summary_rows(report)
    console.print(main_table(report, rows))
    console.print(fixed_table(rows))
    console.print(clock_legend(report), highlight=False)
    wrong = inexact_launches(report)
    if wrong:
        console.print("NOT EXACT against the oracle: " + "; ".join(wrong), highlight=False)
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
        timed = {t["kernel"] for r in report["shapes"] for t in r["timings"]}
        names = [k for k in KERNELS if k in timed]
        sweep = Table(
            title="tile sweep (us, do_bench[ / graph]; BLOCK_T x BLOCK_W x WIDE_W x warps x "
            "programs per SM [x register cap])"
        )
        sweep.add_column("shape")
        for name in (*names, *tiles):
            sweep.add_column(name.removeprefix("tile "), justify="right")
        for r in report["shapes"]:
            for width in sorted({t["width"] for t in r["timings"] if t["kernel"] in tiles}):
                times = {t["kernel"]: t for t in r["timings"] if t["width"] == width}
                cells = []
                for name in (*names, *tiles):
                    t = times.get(name)
                    if t is None:
                        cells.append("-")
                        continue
                    do_bench, graph = _clocks(t)
                    text = _cell(do_bench) + ("" if graph is None else f" / {_cell(graph)}")
                    cells.append(text + ("" if t["exact"] else "!"))
                sweep.add_row(f"{r['shape']['name']} W={width}", *cells)
        console.print(sweep)
