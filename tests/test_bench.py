"""``c128a bench --throughput``: a property run for a few examples on the CPU.

Nothing here is timed: the run must report a positive rate, every phase by
name, and leave the harness it instrumented as it found it.
"""

from __future__ import annotations

import json

import pytest
import torch

from c128a import batch, bench, cli, invariants, reference
from c128a.targets import load_target


def test_throughput_reports_examples_per_second_and_every_phase():
    originals = (batch.Batch.tensors, reference.build_c128a_topk_metadata,
                 invariants.check_matches_oracle)
    report = bench.run_throughput(
        load_target("reference"), torch.device("cpu"), "matches_oracle",
        max_tokens=64, examples=4,
    )
    assert report["examples"] == 4
    assert report["examples_per_s"] > 0
    assert set(report["phases"]) == set(bench.THROUGHPUT_PHASES)
    assert all(seconds >= 0 for seconds in report["phases"].values())
    assert report["phases"]["draw"] > 0 and report["phases"]["kernel"] > 0
    assert (batch.Batch.tensors, reference.build_c128a_topk_metadata,
            invariants.check_matches_oracle) == originals


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
    for phase in bench.THROUGHPUT_PHASES:
        assert f"  {phase} " in printed
    saved = json.loads(out.read_text())
    assert saved["property"] == "adaptive_equals_full" and saved["examples"] == 3


def test_throughput_names_an_unknown_property(capsys, c128a_device):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--throughput", "--device", c128a_device.type, "--target", "reference",
                  "--property", "no_such_property", "--examples", "1"])
    assert exit_info.value.code == cli.USAGE_ERROR
    assert "no_such_property" in capsys.readouterr().err


def test_tiles_parse_with_and_without_a_register_cap():
    assert bench.parse_tiles("4x128x1024x4x16, 8x256x1024x8x0x32") == [
        (4, 128, 1024, 4, 16, 0),
        (8, 256, 1024, 8, 0, 32),
    ]
    assert bench.parse_tiles(None) == []


@pytest.mark.parametrize("bad", ["4x128x1024x4", "4x128x1024x4x16x32x1", "4x128xWIDEx4x16"])
def test_tiles_refuse_a_malformed_item(bad, capsys):
    with pytest.raises(SystemExit):
        bench.parse_tiles(bad)
    assert "4x128x1024x4x16" in capsys.readouterr().err
