"""Exit statuses mean the same for every subcommand: 0 every check held, 1 a
target failed a check, 2 a usage or set-up error, found before any work."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

import pytest

from c128a import cases, cli
from c128a.cli.fuzz import configure_parser, options_from_args
from c128a.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from c128a.runners.fuzz import FuzzOptions

MUTANT = "c128a.mutants:off_by_one_length"


def fuzz(tmp_path, device, *options) -> int:
    return cli.main([
        "fuzz", "--device", device.type, "--workers", "1", "--no-stateful", "--no-live",
        "--db", str(tmp_path / "db"), "--cases-dir", str(tmp_path / "cases"), *options,
    ])


@pytest.mark.slow
def test_fuzz_exit_statuses(tmp_path, capsys, c128a_device):
    assert fuzz(tmp_path, c128a_device, "--target", "reference", "--only", "views",
                "--max-examples", "4") == EXIT_OK
    assert fuzz(tmp_path, c128a_device, "--target", MUTANT, "--only", "matches_oracle",
                "--max-examples", "200", "--exitfirst") == EXIT_FAILED
    capsys.readouterr()
    assert fuzz(tmp_path, c128a_device, "--workers", "0") == EXIT_USAGE
    assert "--workers=0 must be >= 1" in capsys.readouterr().err
    assert fuzz(tmp_path, c128a_device, "--target", "no_such_module_c128a") == EXIT_USAGE
    assert "cannot import module 'no_such_module_c128a'" in capsys.readouterr().err


@pytest.mark.slow
def test_replay_exit_statuses(tmp_path, capsys, c128a_device):
    assert fuzz(tmp_path, c128a_device, "--target", MUTANT, "--only", "matches_oracle",
                "--max-examples", "200", "--exitfirst") == EXIT_FAILED
    [saved] = cases.case_files(tmp_path / "cases")
    replay = ["replay", str(saved), "--device", c128a_device.type]
    assert cli.main(replay) == EXIT_FAILED  # against the mutant it names
    assert cli.main([*replay, "--target", "reference"]) == EXIT_OK
    (tmp_path / "broken.json").write_text("{")
    capsys.readouterr()
    assert cli.main(["replay", str(tmp_path / "broken.json"), "--device", c128a_device.type]) == (
        EXIT_USAGE
    )
    assert "not JSON" in capsys.readouterr().err


def test_mutants_exit_statuses(capsys, c128a_device):
    row = ["mutants", "--device", c128a_device.type, "--property", "matches_oracle",
           "--max-examples", "2", "--markdown", "--expect-pass", "reference"]
    assert cli.main([*row, "--spec", MUTANT]) == EXIT_OK
    # A correct target run as a mutant survives: the run fails.
    assert cli.main([*row, "--spec", "c128a.contract.oracle"]) == EXIT_FAILED
    assert "mutant c128a.contract.oracle survived every property" in capsys.readouterr().out


@pytest.mark.parametrize(
    "options, message",
    [
        (["--spec", "no_such_module_c128a"], "cannot import module 'no_such_module_c128a'"),
        (["--property", "no_such_property"], "unknown --property no_such_property"),
        (["--mutants-from", "no_such_module_c128a:MUTANTS"], "--mutants-from"),
        (["--max-examples", "0"], "--max-examples=0 must be >= 1"),
    ],
)
def test_mutants_usage_errors_come_before_any_row(capsys, c128a_device, options, message):
    status = cli.main(["mutants", "--device", c128a_device.type, *options])
    captured = capsys.readouterr()
    assert status == EXIT_USAGE
    assert message in captured.err
    assert "kill matrix" not in captured.out  # no row ran


def test_bench_exit_statuses(capsys, c128a_device):
    throughput = ["bench", "--throughput", "--device", c128a_device.type, "--examples", "3",
                  "--max-tokens", "16"]
    assert cli.main([*throughput, "--target", "reference"]) == EXIT_OK
    assert cli.main([*throughput, "--target", MUTANT, "--examples", "60"]) == EXIT_FAILED
    capsys.readouterr()
    assert cli.main([*throughput, "--property", "nope"]) == EXIT_USAGE
    assert cli.main(["bench", "--device", c128a_device.type, "--groups", "nope"]) == EXIT_USAGE
    assert "--groups nope" in capsys.readouterr().err


@pytest.mark.parametrize("seconds", ["inf", "nan", "0"])
def test_bench_throughput_seconds_must_be_finite_and_positive(capsys, monkeypatch, seconds):
    """--seconds inf ran forever; refused before anything runs (exit 2)."""
    def must_not_run(*args, **kwargs):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr("c128a.cli.bench.run_throughput", must_not_run)
    assert cli.main(["bench", "--throughput", "--device", "cpu", "--target", "reference",
                     "--seconds", seconds]) == EXIT_USAGE
    assert f"--seconds={float(seconds)} must be a finite number > 0" in capsys.readouterr().err


def test_every_fuzz_option_has_a_flag_and_a_config_key(tmp_path):
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    flags = {action.dest for action in parser._actions}
    names = {f.name for f in fields(FuzzOptions)}
    assert names <= flags, names - flags
    config = tmp_path / "all.toml"
    config.write_text(
        "[fuzz]\nlive = false\nonly = ['views']\nminutes = 2\nstateful = false\n"
        "example-timeout = 5\n"
    )
    options = options_from_args(parser.parse_args(["--config", str(config), "--minutes", "3"]))
    assert (options.live, options.only, options.minutes, options.stateful) == (
        False, ("views",), 3.0, False
    )
    assert options.example_timeout == 5.0
    assert json.dumps(options.only)  # plain values, picklable for the workers


def test_fuzz_says_when_more_examples_ran_than_max_examples(tmp_path, capsys, c128a_device):
    """--max-examples bounds what Hypothesis generates; each worker's first
    round of a property also runs its historical steps. The report counts
    every example and the summary says why there are more. (Before: 82
    examples for --max-examples 40 on two workers, unexplained.)"""
    from c128a.checks import PROPERTIES

    assert fuzz(tmp_path, c128a_device, "--target", "reference", "--only", "matches_oracle",
                "--max-examples", "5", "--seed", "1",
                "--report", str(tmp_path / "report.json")) == EXIT_OK
    report = json.loads((tmp_path / "report.json").read_text())
    historical = len(PROPERTIES["matches_oracle"].examples)
    assert historical > 0
    assert report["max_examples"] == 5
    assert report["totals"]["examples"] == 5 + historical, report["totals"]
    err = capsys.readouterr().err
    assert f"examples: {5 + historical} ran for --max-examples 5" in err
    assert "historical steps" in err
