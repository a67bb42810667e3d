"""``c128a bench --throughput``: a property run for a few examples on the CPU.

Nothing here is timed: the run must report a positive rate and every phase
by name, and a failing target must end it with exit status 1.
"""

from __future__ import annotations

import json

import pytest
import torch

from c128a import cli, phases
from c128a.cli.bench import parse_tiles
from c128a.failures import EXIT_FAILED, EXIT_USAGE, UsageError
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
