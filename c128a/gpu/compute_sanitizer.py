"""Builds under NVIDIA's ``compute-sanitizer``: memory errors the CPU cannot see.

The contract says nothing is read or written outside the buffers and that a
decode token's block-table entries are read only for j < n(t) (none for a
padding row under ``inert``). Two of the sanitizer's tools check that on the
GPU, each over a child process that builds a list of steps:

- ``memcheck``: any access outside an allocation;
- ``initcheck``: any read of device memory nothing wrote. The child gives
  every argument its own allocation (PyTorch's caching allocator off,
  ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, so a tensor is a fresh allocation and
  an access past it leaves it) and writes into an uninitialised block table
  only the entries the contract lets the kernel read: a read of any other
  entry (junk columns, the row stride's gap, a padding row under ``inert``,
  one page past n(t)) is reported.

Expected values come from the oracle on the CPU (on the GPU, its gathers would
read the very entries left uninitialised), compared exactly. The child prints
a marker before and after each build and synchronises in between, so each of
the sanitizer's reports is attributed to the step that caused it.

:func:`run_sanitizer` is the parent's side; ``python -m c128a.gpu.compute_sanitizer``
the child's. Saving findings as cases is the caller's (``c128a sanitize``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("memcheck", "initcheck")
SANITIZER_ENV = "C128A_COMPUTE_SANITIZER"
SANITIZER_FALLBACKS = ("/usr/local/cuda/bin/compute-sanitizer",)
PROPERTY_PREFIX = "sanitizer_"
PROPERTIES = tuple(PROPERTY_PREFIX + tool for tool in TOOLS)
"""The property names of sanitizer cases: ``sanitizer_memcheck``, ``sanitizer_initcheck``."""
VALUES = "values"  # a finding of the child's own comparison with the oracle
MARKER = "@@c128a-sanitize"
ERROR_EXIT = 86  # the sanitizer's exit status when it reported an error
REPORT_LINES = 40  # lines of one step's sanitizer report kept in a finding
TOOL_OPTIONS = {"memcheck": ("--leak-check", "no"), "initcheck": ()}


class SanitizerUnavailable(Exception):
    """No ``compute-sanitizer`` here, or no GPU to run it on."""


@dataclass
class Finding:
    """What one step's build got wrong under one tool: the sanitizer's
    report (``kind`` the tool) or a difference from the oracle (``values``)."""

    tool: str
    kind: str
    index: int
    name: str
    batch: dict
    width: int
    report: str

    @property
    def headline(self) -> str:
        lines = [ln.strip("= ").strip() for ln in self.report.splitlines() if ln.strip("= ")]
        return lines[0] if lines else self.report


@dataclass
class SanitizerRun:
    """One tool over one child: what it found, and whether it ran to the end."""

    tool: str
    command: list[str]
    returncode: int
    steps: int = 0
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    output: str = ""
    summary: str = ""
    finished: bool = False  # the child built every step (a memcheck error ends it)

    @property
    def clean(self) -> bool:
        return not self.findings and not self.errors


def find_sanitizer(path: str | None = None) -> str:
    """The ``compute-sanitizer`` to run: ``path``, else ``$C128A_COMPUTE_SANITIZER``,
    else the one on PATH, else CUDA's default install location."""
    candidates = [path or os.environ.get(SANITIZER_ENV) or shutil.which("compute-sanitizer"),
                  *SANITIZER_FALLBACKS]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SanitizerUnavailable(
        "compute-sanitizer not found (looked at --sanitizer, "
        f"${SANITIZER_ENV}, PATH and {', '.join(SANITIZER_FALLBACKS)}); it comes with "
        "the CUDA toolkit"
    )


def sanitizer_command(tool: str, sanitizer: str, child: list[str]) -> list[str]:
    if tool not in TOOLS:
        raise ValueError(f"tool={tool!r} must be one of {', '.join(TOOLS)}")
    return [sanitizer, "--tool", tool, "--error-exitcode", str(ERROR_EXIT),
            "--show-backtrace", "device", "--print-limit", "10000", *TOOL_OPTIONS[tool],
            *child]


def run_sanitizer(
    tool: str,
    target: str,
    *,
    padding_rows: str | None = None,
    batches: list[dict] | None = None,
    examples: int = 0,
    seed: int = 0,
    historical: bool = False,
    sanitizer: str | None = None,
    timeout: float | None = None,
    progress=None,
    device: str = "cuda",
) -> SanitizerRun:
    """Run ``tool`` over a child building, with ``target`` (a spec), the given
    ``batches`` (JSON), the historical steps when ``historical``, and
    ``examples`` steps drawn from the strategies with ``seed``, on ``device``
    (the CPU only to test this plumbing, under a stand-in sanitizer).
    ``progress`` is called with each line the child prints."""
    program = find_sanitizer(sanitizer)
    with tempfile.TemporaryDirectory(prefix="c128a-sanitize-") as scratch:
        inputs = Path(scratch) / "batches.json"
        inputs.write_text(json.dumps({"batches": batches or []}))
        child = [sys.executable, "-m", "c128a.gpu.compute_sanitizer", "--target", target,
                 "--batches", str(inputs), "--examples", str(examples), "--seed", str(seed),
                 "--device", device,
                 *(["--historical"] if historical else []),
                 *(["--padding-rows", padding_rows] if padding_rows else [])]
        command = sanitizer_command(tool, program, child)
        env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        if device == "cuda":
            env.pop("TRITON_INTERPRET", None)
        lines: list[str] = []
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env, text=True, errors="replace") as process:
            # The output is read as it comes, so the time limit is a timer's
            # kill: a hung child closes its output when it dies.
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                process.kill()

            timer = threading.Timer(timeout, expire) if timeout else None
            if timer is not None:
                timer.start()
            try:
                for line in process.stdout:
                    lines.append(line.rstrip("\n"))
                    if progress is not None:
                        progress(line.rstrip("\n"))
                process.wait()
            finally:
                if timer is not None:
                    timer.cancel()
            if expired.is_set():
                lines.append(f"{MARKER} error the sanitizer ran past {timeout:g} s and was killed")
    return parse_output(tool, command, process.returncode, lines)


_REPORT_START = re.compile(r"^========= (?! )(?!ERROR SUMMARY)(?!COMPUTE-SANITIZER)\S")
_SUMMARY = re.compile(r"^========= ERROR SUMMARY: (\d+) errors?")


def parse_output(tool: str, command: list[str], returncode: int, lines: list[str]) -> SanitizerRun:
    """The child's markers and the sanitizer's reports, read in order: each
    report belongs to the step whose build it followed."""
    run = SanitizerRun(tool=tool, command=command, returncode=returncode,
                       output="\n".join(lines))
    current: dict | None = None
    steps: dict[int, dict] = {}
    reports: dict[int, list[str]] = {}
    in_report = False
    reported = 0
    for line in lines:
        if line.startswith(MARKER + " "):
            in_report = False
            word, _, rest = line[len(MARKER) + 1:].partition(" ")
            if word == "step":
                current = json.loads(rest)
                steps[current["index"]] = current
                run.steps += 1
            elif word == "values" and current is not None:
                run.findings.append(_finding(tool, VALUES, current, json.loads(rest)["report"]))
            elif word == "done":
                run.finished = True
            elif word == "error":
                run.errors.append(rest)
            continue
        summary = _SUMMARY.match(line)
        if summary:
            reported = int(summary.group(1))
            run.summary = line.strip("= ").strip()
            in_report = False
            continue
        if _REPORT_START.match(line):
            in_report = True
            if current is None:
                run.errors.append(f"the sanitizer reported before the first build: {line}")
                in_report = False
                continue
            reports.setdefault(current["index"], [])
        if in_report and line.startswith("========="):
            if line.strip() == "=========":
                in_report = False
            if current is not None:
                reports[current["index"]].append(line)
    for index, report in reports.items():
        kept = report[:REPORT_LINES]
        if len(report) > REPORT_LINES:
            kept.append(f"========= ... {len(report) - REPORT_LINES} more lines")
        run.findings.append(_finding(tool, tool, steps[index], "\n".join(kept)))
    if reported and not reports:
        run.errors.append(f"the sanitizer counted {reported} errors but none followed a build")
    if returncode not in (0, ERROR_EXIT) or (returncode == ERROR_EXIT and not run.findings):
        tail = "\n".join(lines[-15:])
        run.errors.append(f"the sanitizer's child exited {returncode}:\n{tail}")
    return run


def _finding(tool: str, kind: str, step: dict, report: str) -> Finding:
    return Finding(tool=tool, kind=kind, index=step["index"], name=step["name"],
                   batch=step["batch"], width=step["width"], report=report)


# ---------------------------------------------------------------- the child


def _say(word: str, payload) -> None:
    print(f"{MARKER} {word} {json.dumps(payload, separators=(',', ':'))}", flush=True)


def readable_pages(batch, width: int, padding_rows: str) -> dict[int, int]:
    """Block-table row -> how many of its first entries the contract lets a
    build of ``batch`` at ``width`` read: ceil(n(t) / B) for the row's
    longest decode token; a padding token's row counts for none under ``inert``."""
    pages: dict[int, int] = {}
    for t in range(batch.num_decode_tokens):
        if padding_rows == "inert" and batch.slot_mapping[t] < 0:
            continue
        n = min((batch.positions[t] + 1) // batch.compress_ratio, width)
        request = batch.token_to_req_indices[t]
        pages[request] = max(pages.get(request, 0), -(-n // batch.block_size))
    return pages


def _own_allocations(batch, device, width: int, padding_rows: str):
    """The step's tensors, each its own allocation, with a block table of
    the step's row stride in which only the readable entries were written."""
    import torch

    from ..step.batch import BatchTensors

    full = batch.tensors("cpu")
    rows, columns = full.block_table.shape
    stride = max(batch.block_table_row_stride, columns, 1)
    storage = torch.empty(max(rows, 1) * stride, dtype=torch.int32, device=device)
    readable = [(r, n) for r, n in readable_pages(batch, width, padding_rows).items() if n]
    if readable:
        flat = torch.cat([r * stride + torch.arange(n) for r, n in readable])
        values = torch.cat([full.block_table[r, :n] for r, n in readable])
        storage[flat.to(device)] = values.to(device)
    return BatchTensors(
        positions=full.positions.to(device),
        token_to_req_indices=full.token_to_req_indices.to(device),
        block_table=storage.view(max(rows, 1), stride)[:rows, :columns],
        slot_mapping=full.slot_mapping.to(device),
    )


def _child(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c128a.gpu.compute_sanitizer")
    parser.add_argument("--target", required=True)
    parser.add_argument("--padding-rows", default=None)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--examples", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--historical", action="store_true")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)

    from ..targets import load_target, use_device

    use_device(args.device)
    import torch

    from ..checks.one_build import check_matches_oracle
    from ..contract import padding_rows_of
    from ..failures import ContractViolation, failure_text
    from ..step import Batch, Buffers, BuildResult
    from ..step.buffers import tuple_of_views
    from ..strategies import HISTORICAL_BATCHES

    target = load_target(args.target, args.padding_rows)
    variant = padding_rows_of(target)
    device = torch.device(args.device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    steps = [(f"case {i}", Batch.from_json(b))
             for i, b in enumerate(json.loads(Path(args.batches).read_text())["batches"])]
    if args.historical:
        steps += list(HISTORICAL_BATCHES.items())
    steps += _drawn(target, args.examples, args.seed)
    index = 0
    for name, batch in steps:
        # At the step's width and at full width: C reads the most entries.
        for width in dict.fromkeys((batch.width, batch.widest_width)):
            _say("step", {"index": index, "name": name, "width": width,
                          "batch": batch.to_json()})
            tensors = _own_allocations(batch, device, width, variant)
            buffers = Buffers.for_batch(batch, device)
            try:
                views = target.build_c128a_topk_metadata(*batch.build_args(tensors, buffers, width))
                # Whatever the sanitizer reports of this build is printed before the next marker.
                synchronize()
                result = BuildResult(batch=batch, width=width, views=tuple_of_views(views),
                                     buffers=buffers)
                check_matches_oracle(target, result)
            except ContractViolation as exc:
                _say("values", {"report": failure_text(exc)})
            except Exception as exc:  # noqa: BLE001 - the target raised: a finding too
                synchronize()
                _say("values", {"report": f"the target raised {type(exc).__name__}: {exc}"})
            index += 1
    _say("done", {"steps": index})
    return 0


def _drawn(target, examples: int, seed: int):
    """``examples`` steps from the strategies, reproducibly from ``seed``."""
    if examples <= 0:
        return []
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    from ..strategies import batches

    drawn = []

    @with_seed(seed)
    @settings(max_examples=examples, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(batches(target))
    def collect(batch):
        drawn.append(batch)

    collect()
    return [(f"drawn {i} (seed {seed})", b) for i, b in enumerate(drawn[:examples])]


if __name__ == "__main__":
    sys.exit(_child())
