"""``c128a bench``: the throughput mode, and the timing mode's CPU-testable parts.

``--throughput`` (a property run for a few examples on the CPU): nothing is
timed; the run must report a positive rate and every phase by name, and a
failing target must end it with exit status 1.

The timing mode needs CUDA. On the CPU: its options and usage errors (a
missing vLLM release among them), the summary and the printed tables of
synthetic reports, the bare launch of a vLLM release's builder (a stand-in
written for these tests, and the real release where its extract is here),
and the graph clock's refusal of the CPU. On CUDA (``cuda`` marker, skipped
elsewhere with the reason): the graph clock, and ``c128a bench`` on one
small shape; with the vLLM column where ``$C128A_VLLM_RELEASE`` names a
release (a path: wheel, extract or folder), else that test skips saying so.
"""

from __future__ import annotations

import json
import math
import os
import textwrap

import pytest
import torch

from c128a import cli, options, phases
from c128a.cli.bench import parse_tiles
from c128a.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE, DeviceError, UsageError
from c128a.runners.throughput import run_throughput
from c128a.targets import load_target


def test_throughput_reports_examples_per_second_and_every_phase():
    report = run_throughput(
        load_target("reference"), torch.device("cpu"), "matches_oracle",
        max_tokens=64, examples=4,
    )
    assert report["examples"] == 4
    assert report["examples_per_s"] > 0
    assert set(report["phases"]) == set(phases.PHASES)
    assert all(seconds >= 0 for seconds in report["phases"].values())
    for phase in ("draw", "target", "oracle", "tensors", "validation"):
        assert report["phases"][phase] > 0, phase
    assert phases._running is None  # the clock is stopped after the run


def test_throughput_command_prints_the_breakdown_and_saves_json(
    tmp_path, capsys, monkeypatch, c128a_device
):
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    out = tmp_path / "throughput.json"
    status = cli.main([
        "bench", "--throughput", "--device", c128a_device.type, "--target", "reference",
        "--property", "adaptive_equals_full", "--examples", "3", "--max-tokens", "32",
        "--json", str(out),
    ])
    assert status == 0
    assert threads == ([1] if c128a_device.type == "cpu" else [])  # steady CPU timings
    printed = capsys.readouterr().out
    assert "examples/s" in printed
    for phase in phases.PHASES:
        assert f"  {phase} " in printed
    saved = json.loads(out.read_text())
    assert saved["property"] == "adaptive_equals_full" and saved["examples"] == 3


def test_throughput_of_a_failing_target_exits_1_with_the_diff(capsys, c128a_device):
    status = cli.main([
        "bench", "--throughput", "--device", c128a_device.type,
        "--target", "c128a.mutants:off_by_one_length", "--examples", "50", "--max-tokens", "32",
    ])
    assert status == EXIT_FAILED
    assert "[matches_oracle]" in capsys.readouterr().err


def test_throughput_names_an_unknown_property(capsys, c128a_device):
    status = cli.main(["bench", "--throughput", "--device", c128a_device.type, "--target",
                       "reference", "--property", "no_such_property", "--examples", "1"])
    assert status == EXIT_USAGE
    assert "no_such_property" in capsys.readouterr().err


def test_tiles_parse_with_and_without_a_register_cap():
    assert parse_tiles("4x128x1024x4x16, 8x256x1024x8x0x32") == [
        (4, 128, 1024, 4, 16, 0),
        (8, 256, 1024, 8, 0, 32),
    ]
    assert parse_tiles(None) == []


@pytest.mark.parametrize("bad", ["4x128x1024x4", "4x128x1024x4x16x32x1", "4x128xWIDEx4x16"])
def test_tiles_refuse_a_malformed_item(bad):
    with pytest.raises(UsageError, match="4x128x1024x4x16"):
        parse_tiles(bad)


# ---------------------------------------------------------------- the timing mode


RELEASE_ENV = "C128A_VLLM_RELEASE"
"""A vLLM release (a path: wheel, extract or folder) for the GPU test's vLLM column."""
SMALL_SHAPE = "prefill 512"
QUICK = ["--warmup-ms", "1", "--rep-ms", "5", "--graph-launches", "20", "--graph-replays", "3"]

LAUNCHER_STAND_IN = textwrap.dedent(
    '''
    """A stand-in for a vLLM builder around a launcher object, written for c128a's tests:
    it writes decode_lens only, through a launcher whose parameters come in another
    order than the builder's."""
    import torch

    from vllm.kernels import LaunchSpec, VllmTritonJitKernel, kernel_launcher
    from vllm.triton_utils import tl, triton


    class LensLauncher(VllmTritonJitKernel):
        @staticmethod
        @triton.jit
        def kernel(lens_ptr, positions_ptr, slot_mapping_ptr, ratio, width, count,
                   BLOCK: tl.constexpr):
            offsets = tl.arange(0, BLOCK)
            mask = offsets < count
            positions = tl.load(positions_ptr + offsets, mask=mask, other=0)
            slots = tl.load(slot_mapping_ptr + offsets, mask=mask, other=0)
            lens = tl.minimum((positions + 1) // ratio, width)
            tl.store(lens_ptr + offsets, tl.where(slots >= 0, lens, 0).to(tl.int32), mask=mask)

        @kernel_launcher
        def __call__(self, decode_lens_buffer, slot_mapping, positions, num_decode_tokens,
                     max_compressed_tokens, compress_ratio) -> LaunchSpec:
            return (1,), dict(lens_ptr=decode_lens_buffer, ratio=compress_ratio,
                              width=max_compressed_tokens, count=num_decode_tokens, BLOCK=64)


    LENS = LensLauncher()


    def build_c128a_topk_metadata(
        positions, compress_ratio, num_decode_tokens, token_to_req_indices, block_table,
        block_size, slot_mapping, global_decode_buffer, decode_lens_buffer, prefill_buffer,
        max_compressed_tokens=8192,
    ):
        assert max_compressed_tokens % 128 == 0
        LENS(decode_lens_buffer, slot_mapping, positions, num_decode_tokens,
             max_compressed_tokens, compress_ratio)
        return global_decode_buffer, decode_lens_buffer, prefill_buffer
    '''
)

NO_LAUNCHER_STAND_IN = textwrap.dedent(
    '''
    """A stand-in for a vLLM builder that launches nothing, written for c128a's tests."""


    def build_c128a_topk_metadata(
        positions, compress_ratio, num_decode_tokens, token_to_req_indices, block_table,
        block_size, slot_mapping, global_decode_buffer, decode_lens_buffer, prefill_buffer,
        max_compressed_tokens=8192,
    ):
        return global_decode_buffer, decode_lens_buffer, prefill_buffer
    '''
)


@pytest.fixture(scope="module")
def bench():
    """The timing mode's runner (it imports the kernels: after the plugin chose the device)."""
    from c128a.runners import benchmark as runner

    return runner


def stand_in(tmp_path, text: str):
    path = tmp_path / "sparse_mla.py"
    path.write_text(text)
    return path


def tiny_shape(bench):
    """20 decode tokens (the last 8 CUDA-graph padding) and 8 prefill tokens; W = 128, C = 512."""
    return bench.Shape(
        "tiny", "mixed", context=4096, decode_requests=20, prefill_tokens=8, max_model_len=65_536
    )


def timing(kernel, width, do_bench_us, graph_us, exact=True):
    return {"kernel": kernel, "width": width, "do_bench_us": do_bench_us, "graph_us": graph_us,
            "exact": exact}


def synthetic_report(kernels=("baseline", "project", "vllm"), graph=True, exact=True):
    """A report as run_benchmark returns it, with made-up times: at W the
    baseline takes 10 us, the project 5, vLLM 20; in a graph half that; at C
    each takes four times as long."""
    at_w = {"baseline": 10.0, "project": 5.0, "vllm": 20.0}
    timings = [
        timing(k, w, factor * at_w[k], factor * at_w[k] / 2 if graph else None,
               exact or k != "vllm")
        for k in kernels
        for w, factor in ((256, 1.0), (8192, 4.0))
    ]
    return {
        "date": "2026-12-04", "device": "Synthetic GPU", "torch": "2.11.0", "triton": "3.6.0",
        "python": "3.12", "copy_bandwidth_bytes_per_s": 4.0e12, "empty_launch_us": 3.0,
        "empty_launch_graph_us": 1.0 if graph else None, "warmup_ms": 10, "rep_ms": 40,
        "graph_launches": 100 if graph else 0, "graph_replays": 10,
        "kernels": list(kernels),
        "vllm_release": (
            {"spec": "vllm-release:/x/c128a_vllm_extract.py", "version": "0.34.0",
             "extract": "/x/c128a_vllm_extract.py", "source_sha256": "ab",
             "launcher": "_BUILD_C128A_TOPK_METADATA_KERNEL", "padding_rows": "slots"}
            if "vllm" in kernels else None
        ),
        "registers_per_thread": {},
        "shapes": [
            {"shape": {"name": "prefill 512"}, "num_tokens": 512, "num_decode_tokens": 0,
             "capacity": 8192, "width": 256, "floor_bytes": 1, "floor_us": 4.0,
             "graph_floor_us": 2.0 if graph else None, "timings": timings},
        ],
    }


def test_timing_options_parse_with_their_defaults(bench):
    args = cli.build_parser().parse_args(["bench"])
    assert args.vllm_release is None and args.shapes is None
    # Written once (c128a/options.py): the CLI's defaults and the runner's fallbacks.
    assert args.graph_launches == bench.DEFAULT_GRAPH_LAUNCHES == options.DEFAULT_GRAPH_LAUNCHES
    assert args.graph_replays == bench.DEFAULT_GRAPH_REPLAYS == options.DEFAULT_GRAPH_REPLAYS
    args = cli.build_parser().parse_args([
        "bench", "--vllm-release", "0.34.0", "--graph-launches", "50", "--graph-replays", "5",
        "--shape", "prefill 512", "--shape", "decode 512 @ 1M",
    ])
    assert args.vllm_release == "0.34.0"
    assert (args.graph_launches, args.graph_replays) == (50, 5)
    assert args.shapes == ["prefill 512", "decode 512 @ 1M"]
    assert [s.name for s in bench.select_shapes(args.groups, args.shapes)] == args.shapes


@pytest.mark.parametrize(
    "options, message",
    [
        (["--graph-launches", "-1"], "--graph-launches=-1 must be >= 0"),
        (["--graph-replays", "0"], "--graph-replays=0 must be >= 1"),
        (["--shape", "prefill 7"], "--shape 'prefill 7': choose from 'prefill 512'"),
        (["--groups", "decode", "--shape", "prefill 512"], "no shape is both in --groups decode"),
        (["--throughput", "--vllm-release", "0.34.0"], "--vllm-release is for the timing mode"),
    ],
)
def test_timing_usage_errors(capsys, c128a_device, options, message):
    assert cli.main(["bench", "--device", c128a_device.type, *options]) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_a_missing_release_path_is_a_usage_error_naming_it(tmp_path, capsys, c128a_device):
    missing = tmp_path / "no-such" / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    status = cli.main(["bench", "--device", c128a_device.type, "--vllm-release", str(missing)])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE
    assert f"c128a bench: --vllm-release {missing}: " in err
    assert "neither a vLLM release version" in err
    assert "Traceback" not in err


def test_a_release_pip_cannot_fetch_is_a_usage_error_naming_the_version(
    tmp_path, capsys, monkeypatch, vllm_cache, c128a_device
):
    links = tmp_path / "links"  # pip sees no index, only this empty folder
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    status = cli.main(["bench", "--device", c128a_device.type, "--vllm-release", "0.0.1"])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE
    assert "--vllm-release 0.0.1: vLLM 0.0.1: " in err
    assert "Traceback" not in err


def test_a_release_whose_builder_names_no_launcher_is_a_usage_error(
    tmp_path, capsys, vllm_cache, c128a_device
):
    path = stand_in(tmp_path, NO_LAUNCHER_STAND_IN)
    status = cli.main(["bench", "--device", c128a_device.type, "--vllm-release", str(path)])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE
    assert f"--vllm-release {path}: " in err
    assert "names not exactly one launcher object" in err and "found: none" in err


@pytest.mark.slow
def test_bare_launch_binds_the_builder_arguments_by_name(
    bench, tmp_path, vllm_cache, monkeypatch, c128a_device
):
    release = bench.load_release(str(stand_in(tmp_path, LAUNCHER_STAND_IN)))
    assert release.version == "source" and release.launch.__name__ == "LENS"
    assert [f.__name__ for f in release.jit_functions] == ["kernel"]
    shape = tiny_shape(bench)
    inputs = bench.make_inputs(shape, c128a_device)
    width = shape.capacity
    got = bench.allocate_buffers(shape, c128a_device)
    release.launch(bench.call_arguments(inputs, got, width))
    want = bench.allocate_buffers(shape, c128a_device)
    bench.write_metadata(bench.call_arguments(inputs, want, width))
    assert torch.equal(got[1], want[1])  # the lens, padding tokens' zeros among them
    assert int((got[1] == 0).sum()) == 8
    assert bool((got[0] == bench.POISON).all()) and bool((got[2] == bench.POISON).all())

    # prepare: the launcher's Python runs once, each call only launches the kernel.
    prepared_buffers = bench.allocate_buffers(shape, c128a_device)
    prepared = release.launch.prepare(bench.call_arguments(inputs, prepared_buffers, width))
    monkeypatch.setattr(release.launch, "launcher", None)  # no per-call launcher from here
    prepared()
    assert all(torch.equal(p, g) for p, g in zip(prepared_buffers, got, strict=True))
    empty = bench.call_arguments(inputs, prepared_buffers, width)._replace(
        positions=inputs.positions[:0], num_decode_tokens=0
    )
    release.launch(empty)  # zero tokens: nothing launched (the launcher is gone)
    release.launch.prepare(empty)()


def test_timing_refuses_the_cpu_after_loading_the_release(tmp_path, capsys, vllm_cache,
                                                          c128a_device):
    if c128a_device.type == "cuda":
        pytest.skip("the CPU's refusal: running on CUDA")
    path = stand_in(tmp_path, LAUNCHER_STAND_IN)
    assert cli.main(["bench", "--device", "cpu", "--vllm-release", str(path)]) == EXIT_USAGE
    assert "timing needs a CUDA device" in capsys.readouterr().err


def local_release() -> str:
    """$C128A_VLLM_RELEASE, else the cached extract of vLLM 0.34.0; skips when neither is here."""
    from c128a.targets.vllm_release import EXTRACT_NAME, cache_folder

    if os.environ.get(RELEASE_ENV):
        return os.environ[RELEASE_ENV]
    extract = cache_folder("0.34.0") / EXTRACT_NAME
    if not extract.is_file():
        pytest.skip(f"no vLLM release here: ${RELEASE_ENV} is unset and {extract} is missing "
                    "(c128a fetches it with --c128a-target=vllm-release:0.34.0)")
    return str(extract)


def test_the_real_release_bare_launch_matches_the_oracle(bench, c128a_device):
    release = bench.load_release(local_release())
    assert release.padding_rows == "slots"
    shape = tiny_shape(bench)
    inputs = bench.make_inputs(shape, c128a_device)
    for width in (128, shape.capacity):
        assert bench.exact_against_oracle(release.launch, shape, inputs, width, c128a_device)
    assert release.describe()["launcher"] == release.launch.__name__


@pytest.mark.parametrize("which", ["stand-in", "real"])
@pytest.mark.slow
def test_the_timing_loop_with_fake_clocks(bench, which, tmp_path, monkeypatch, capsys, request,
                                          c128a_device):
    """run_benchmark end to end on one tiny shape, its clocks replaced (each
    still calls the launch it times): every kernel at W and C with both
    clocks, each checked against the oracle (the stand-in writes only the
    lens, so it is caught)."""
    if which == "real":
        release = bench.load_release(local_release())
    else:
        request.getfixturevalue("vllm_cache")  # the stand-in's extract goes to a temporary cache
        release = bench.load_release(str(stand_in(tmp_path, LAUNCHER_STAND_IN)))
    shape = tiny_shape(bench)
    calls = []

    def fake_do_bench(fn, warmup_ms, rep_ms):
        fn()
        calls.append("do_bench")
        return 7.0

    def fake_graph(fn, device, launches, replays):
        assert (launches, replays) == (20, 3)
        fn()
        calls.append("graph")
        return 3.0

    monkeypatch.setattr(bench, "SHAPES", (shape,))
    monkeypatch.setattr(bench, "median_us", fake_do_bench)
    monkeypatch.setattr(bench, "graph_us", fake_graph)
    monkeypatch.setattr(bench, "measure_copy_bandwidth", lambda *a, **k: 4.0e12)
    monkeypatch.setattr(bench, "compiled_registers", lambda device, release=None: {})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    args = cli.build_parser().parse_args(["bench", *QUICK])
    report = bench.run_benchmark(args, c128a_device, [], release)
    capsys.readouterr()

    assert report["kernels"] == ["baseline", "project", "vllm"]
    assert report["vllm_release"]["version"] == ("source" if which == "stand-in" else "0.34.0")
    assert report["empty_launch_graph_us"] == 3.0
    (result,) = report["shapes"]
    assert (result["width"], result["capacity"]) == (128, 512)
    assert result["graph_floor_us"] == pytest.approx(result["floor_us"] - 7.0 + 3.0)
    exact = {(t["kernel"], t["width"]): t["exact"] for t in result["timings"]}
    assert set(exact) == {(k, w) for k in report["kernels"] for w in (128, 512)}
    assert {k: v for k, v in exact.items() if k[0] != "vllm"} == {
        (k, w): True for k in ("baseline", "project") for w in (128, 512)
    }
    assert all(exact[("vllm", w)] == (which == "real") for w in (128, 512))
    assert all((t["do_bench_us"], t["graph_us"]) == (7.0, 3.0) for t in result["timings"])
    assert calls.count("graph") == 1 + 6 and calls.count("do_bench") == 1 + 6
    (row,) = bench.summary_rows(report)
    assert row["project_over_vllm_graph"] == 1.0 and row["exact"] == (which == "real")


def test_graph_clock_refuses_the_cpu(bench):
    from c128a.kernels.timing import graph_us

    with pytest.raises(DeviceError, match="CUDA-graph timing needs a CUDA device, not 'cpu'"):
        graph_us(lambda: None, "cpu")
    with pytest.raises(DeviceError, match="CUDA-graph timing needs a CUDA device"):
        bench.measure_empty_launch_graph(torch.device("cpu"), 10, 3)


def test_summary_rows_hold_both_clocks_of_every_kernel_and_the_ratios(bench):
    (row,) = bench.summary_rows(synthetic_report())
    assert (row["shape"], row["T"], row["C"], row["W"]) == ("prefill 512", 512, 8192, 256)
    assert (row["project_us"], row["project_graph_us"]) == (5.0, 2.5)
    assert (row["vllm_us"], row["vllm_graph_us"]) == (20.0, 10.0)
    assert (row["baseline_fixed_us"], row["baseline_fixed_graph_us"]) == (40.0, 20.0)
    assert (row["floor_us"], row["graph_floor_us"]) == (4.0, 2.0)
    assert row["project_over_baseline"] == row["project_over_baseline_graph"] == 0.5
    assert row["project_over_vllm"] == row["project_over_vllm_graph"] == 0.25
    assert row["project_over_floor"] == 1.25 and row["project_graph_over_floor"] == 1.25
    assert row["exact"]


def test_the_printed_report_has_a_column_for_each_clock_and_ratio(bench, capsys):
    bench.print_report(synthetic_report())
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "shape" in line and "proj g" in line)
    cells = [cell.strip() for cell in header.strip("┃│ ").split("┃")]
    assert cells == [
        "shape", "T", "C", "W", "base", "base g", "proj", "proj g", "vllm", "vllm g", "floor",
        "floor g", "proj/base", "proj/base g", "proj/vllm", "proj/vllm g", "proj/floor",
        "proj g/floor g", "exact",
    ]
    assert "vllm@C g" in out and "proj C/W g" in out
    assert "100 launches captured in one CUDA graph" in out
    launcher = "_BUILD_C128A_TOPK_METADATA_KERNEL"
    assert f"vllm: vLLM 0.34.0's kernel with the arguments its launcher {launcher} computes" in out
    row = next(line for line in out.splitlines() if line.startswith("│ prefill 512"))
    assert [cell.strip() for cell in row.strip("│ ").split("│")][4:] == [
        "10.00", "5.00", "5.00", "2.50", "20.00", "10.00", "4.00", "2.00", "0.50", "0.50",
        "0.25", "0.25", "1.25", "1.25", "yes",
    ]


def test_without_release_or_graph_clock_their_columns_are_left_out(bench, capsys):
    report = synthetic_report(kernels=("baseline", "project"), graph=False)
    (row,) = bench.summary_rows(report)
    assert row["vllm_us"] is None and row["project_over_vllm"] is None
    assert row["project_graph_us"] is None and row["project_graph_over_floor"] is None
    assert row["project_over_baseline"] == 0.5
    bench.print_report(report)
    out = capsys.readouterr().out
    assert "proj/base" in out and "proj/floor" in out
    assert "vllm" not in out and " g " not in out and "CUDA graph" not in out


def test_a_report_before_the_graph_clock_still_reads(bench):
    report = synthetic_report(kernels=("baseline", "project"), graph=False)
    for t in report["shapes"][0]["timings"]:
        t["median_us"] = t.pop("do_bench_us")
        del t["graph_us"]
    del report["shapes"][0]["graph_floor_us"]
    (row,) = bench.summary_rows(report)
    assert (row["project_us"], row["baseline_fixed_us"]) == (5.0, 40.0)
    assert row["project_graph_us"] is None


def test_an_inexact_launch_is_named_and_fails_the_row(bench, capsys):
    report = synthetic_report(exact=False)
    assert not bench.summary_rows(report)[0]["exact"]
    bench.print_report(report)
    out = capsys.readouterr().out
    assert "NOT EXACT against the oracle: vllm at W=256 (prefill 512); vllm at W=8192" in out


@pytest.mark.cuda
def test_graph_clock_times_an_empty_kernel(bench, c128a_device):
    micros = bench.measure_empty_launch_graph(c128a_device, 50, 5)
    assert 0 < micros < 100, micros


def run_small_bench(tmp_path, capsys, *extra):
    out = tmp_path / "bench.json"
    status = cli.main(["bench", "--device", "cuda", "--shape", SMALL_SHAPE, *QUICK,
                       "--json", str(out), *extra])
    printed = capsys.readouterr().out
    assert status == EXIT_OK, printed
    return json.loads(out.read_text()), printed


def check_both_clocks(report, kernels):
    assert report["kernels"] == kernels
    assert report["graph_launches"] == 20 and report["empty_launch_graph_us"] > 0
    (shape,) = report["shapes"]
    assert shape["shape"]["name"] == SMALL_SHAPE
    timed = {(t["kernel"], t["width"]) for t in shape["timings"]}
    assert timed == {(k, w) for k in kernels for w in (shape["width"], shape["capacity"])}
    for t in shape["timings"]:
        assert t["exact"], t
        assert t["do_bench_us"] > 0 and t["graph_us"] > 0 and math.isfinite(t["graph_us"]), t
    (row,) = report["summary"]
    assert row["project_graph_over_floor"] > 0 and row["exact"]


@pytest.mark.cuda
def test_bench_on_one_small_shape_times_both_clocks(tmp_path, capsys):
    report, printed = run_small_bench(tmp_path, capsys)
    check_both_clocks(report, ["baseline", "project"])
    assert report["vllm_release"] is None
    assert "proj g/floor g" in printed and "vllm" not in printed


@pytest.mark.cuda
def test_bench_on_one_small_shape_with_the_vllm_column(tmp_path, capsys):
    release = os.environ.get(RELEASE_ENV)
    if not release:
        pytest.skip(f"${RELEASE_ENV} is unset: set it to a vLLM release's wheel, extract or "
                    "cache folder to time the vLLM column")
    report, printed = run_small_bench(tmp_path, capsys, "--vllm-release", release)
    check_both_clocks(report, ["baseline", "project", "vllm"])
    assert report["vllm_release"]["spec"] == f"vllm-release:{release}"
    (row,) = report["summary"]
    assert row["project_over_vllm"] > 0 and row["project_over_vllm_graph"] > 0
    assert "proj/vllm g" in printed and "vllm@C g" in printed
    assert report["registers_per_thread"]["vllm"]
