"""Bad input to the command line: malformed case files, cases that cannot be
replayed, targets that crash or hang, bad ``--config`` files and options.
Each is refused with exit status 2 and one line naming what is wrong (or, for
a target that still crashes or hangs, reported with exit status 1), and the
other files on the same command line still run."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest

from c128a import cases, cli
from c128a.cli.fuzz import configure_parser, options_from_args
from c128a.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from c128a.runners.fuzz import FuzzOptions, load_config_file
from c128a.targets import TARGET_ENV

from helpers import (
    a_fifo,
    a_file,
    child_environment,
    cli_command,
    importable_here_and_in_children,
    on_trigger_source,
    run_cli,
    wait_until,
)
from test_cases import MUTANT_SPEC, PROPERTIES_SPEC, THRESHOLD, make_case

INT64_RANGE = "[-9,223,372,036,854,775,808, 9,223,372,036,854,775,807]"
INT32_RANGE = "[-2,147,483,648, 2,147,483,647]"

# A stand-in target that crashes, or hangs, only on the trigger position (the
# one make_case() uses) and is the oracle otherwise: the replay's child
# process meets the crash, the replay itself goes on with the next case.
STANDIN_MODULE = "standin_crash_c128a_test"
STANDIN_SOURCE = f'''
import os
import signal
import time
from types import SimpleNamespace

from c128a.contract import oracle

{on_trigger_source(THRESHOLD)}

exits = _on_trigger(lambda: os._exit(9))
segfaults = _on_trigger(lambda: os.kill(os.getpid(), signal.SIGSEGV))
hangs = _on_trigger(lambda: time.sleep(10**6))


def _interrupt_always(*args):
    raise KeyboardInterrupt


interrupts = SimpleNamespace(build_c128a_topk_metadata=_interrupt_always)
'''


@pytest.fixture(autouse=True)
def no_target_from_the_environment(monkeypatch):
    """Each test says where its target comes from; $C128A_TARGET does not leak in."""
    monkeypatch.delenv(TARGET_ENV, raising=False)


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("standin")
    (folder / f"{STANDIN_MODULE}.py").write_text(STANDIN_SOURCE)
    return folder


@pytest.fixture
def standin(standin_dir, monkeypatch) -> Path:
    """The stand-in target importable here and in a replay's child process."""
    return importable_here_and_in_children(standin_dir, monkeypatch)


def good_file(tmp_path: Path, position: int = 5, **overrides) -> Path:
    """A matches_oracle case that passes on the reference target."""
    values = dict(property="matches_oracle", target="reference")
    values.update(overrides)
    path, _ = cases.write_case(make_case(position, **values), tmp_path / "good")
    return path


def raw_file(tmp_path: Path, name: str, content: bytes | dict) -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


def edited(edit) -> dict:
    data = make_case(property="matches_oracle", target="reference").to_json()
    edit(data)
    return data


def replay(device, *args) -> int:
    return cli.main(["replay", *map(str, args), "--device", device.type])


# ---------------------------------------------------------------- A: exit statuses


def test_replay_exit_status_says_passes_fails_or_cannot_replay(tmp_path, capsys, c128a_device):
    """replay exits 0 when the case passes now, 1 when it still fails, 2 when it cannot replay."""
    path, _ = cases.write_case(make_case(), tmp_path)
    options = ["--properties", PROPERTIES_SPEC]
    assert replay(c128a_device, path, *options, "--target", "reference") == EXIT_OK
    assert "PASSES now" in capsys.readouterr().out
    assert replay(c128a_device, path, *options, "--target", MUTANT_SPEC) == EXIT_FAILED
    assert "STILL FAILS" in capsys.readouterr().out
    blob_only, _ = cases.write_case(
        make_case(property="matches_oracle", batch=None, reproduce_blob="garbage!!!"), tmp_path
    )
    assert replay(c128a_device, blob_only, "--target", "reference") == EXIT_USAGE
    assert "CANNOT REPLAY" in capsys.readouterr().out


@pytest.mark.parametrize(
    "blob, reason",
    [
        ("garbage!!!", "Invalid base64"),
        ("AXicY2BgAAAABAAB", "Invalid zlib"),
        ("AXic\u00e9t\u00e9", "not base64 text"),
        # Well formed, but no choices: the test runs out of them at its first draw.
        ("AA==", "The shape of the test data has changed"),
    ],
)
def test_a_garbage_blob_without_inputs_cannot_replay(tmp_path, capsys, c128a_device, blob, reason):
    """A case with a garbage reproduce_blob, or one that does not fit the test,
    and no batch exits 2 with the reason, never a verdict."""
    case = make_case(property="matches_oracle", target="reference", batch=None, reproduce_blob=blob)
    path, _ = cases.write_case(case, tmp_path)
    assert replay(c128a_device, path) == EXIT_USAGE
    out = capsys.readouterr().out
    assert "CANNOT REPLAY here" in out and reason in out
    assert "STILL FAILS" not in out and "PASSES" not in out


@pytest.mark.parametrize("prop", ["matches_oracle", cases.SERVING_LOOP])
@pytest.mark.slow
def test_a_crash_case_with_nothing_to_replay_from_exits_2(tmp_path, capsys, c128a_device, prop):
    """A crash case with no batch, blob or seed exits 2 (through its child process) with the reason."""
    case = make_case(property=prop, target="reference", kind="crash", batch=None,
                     reproduce_blob=None, seed=None)
    path, _ = cases.write_case(case, tmp_path)
    assert replay(c128a_device, path) == EXIT_USAGE
    out = capsys.readouterr().out
    assert "CANNOT REPLAY here" in out and "no reproduce_blob" in out
    assert "STILL" not in out


# ---------------------------------------------------------------- B: malformed files

MALFORMED = [
    pytest.param(b"\xff\xfe{", "<file>", "not UTF-8 text", id="not-utf8"),
    pytest.param(b"[" * 100_000, "<file>", "nested too deeply", id="deep-list"),
    pytest.param(b'{"a": ' * 100_000, "<file>", "nested too deeply", id="deep-object"),
    pytest.param(edited(lambda d: d["batch"].update(buffer_rows=-1)),
                 "batch.buffer_rows", "-1 is outside [1, 65,536]", id="negative-buffer-rows"),
    pytest.param(edited(lambda d: d["batch"].update(capacity=-128)),
                 "batch.capacity", "-128 is outside [1, 65,536]", id="negative-capacity"),
    pytest.param(edited(lambda d: d["batch"].update(positions=[2**70])),
                 "batch.positions[0]", f"outside {INT64_RANGE}", id="position-beyond-int64"),
    pytest.param(edited(lambda d: d["batch"].update(slot_mapping=[-(2**63) - 1])),
                 "batch.slot_mapping[0]", f"outside {INT64_RANGE}", id="slot-beyond-int64"),
    pytest.param(edited(lambda d: d["batch"].update(token_to_req_indices=[2**31])),
                 "batch.token_to_req_indices[0]", f"outside {INT32_RANGE}", id="request-beyond-int32"),
    pytest.param(edited(lambda d: d["batch"]["block_table"][0].__setitem__(3, 2**31)),
                 "batch.block_table[0][3]", f"outside {INT32_RANGE}", id="page-beyond-int32"),
    pytest.param(edited(lambda d: d["batch"].update(width=2**31)),
                 "batch.width", f"outside {INT32_RANGE}", id="width-beyond-int32"),
    pytest.param(edited(lambda d: d["batch"].update(prefill_extra_columns="3")),
                 "batch.prefill_extra_columns", "must be an integer, got a string", id="extra-str"),
    pytest.param(edited(lambda d: d["batch"].update(prefill_extra_columns=1.5)),
                 "batch.prefill_extra_columns", "must be an integer, got a number 1.5",
                 id="extra-float"),
    pytest.param(edited(lambda d: d["batch"].update(prefill_extra_columns=3.0)),
                 "batch.prefill_extra_columns", "must be an integer, got a number 3.0",
                 id="extra-integral-float"),
    pytest.param(edited(lambda d: d.update(round_examples=-1)),
                 "round_examples", "-1 is outside [1, ", id="negative-round-examples"),
    pytest.param(edited(lambda d: d["batch"].update(prior_width=100)),
                 "batch.prior_width", "prior_width=100 must be 0", id="prior-width-unaligned"),
    pytest.param(edited(lambda d: d["batch"].update(prior_width=256)),
                 "batch.prior_width", "up to widest_width=128", id="prior-width-too-wide"),
]


@pytest.mark.parametrize("content, field, rule", MALFORMED)
def test_a_malformed_file_exits_2_and_the_next_file_still_runs(
    tmp_path, capsys, c128a_device, content, field, rule
):
    """A malformed file is a CaseError naming the field and the rule (exit 2); the next file runs."""
    bad = raw_file(tmp_path, "bad.json", content)
    with pytest.raises(cases.CaseError) as raised:
        cases.load_case(bad)
    assert (raised.value.field, rule in raised.value.rule) == (field, True), raised.value
    status = replay(c128a_device, bad, good_file(tmp_path), "--target", "reference")
    captured = capsys.readouterr()
    assert status == EXIT_USAGE
    [line] = [line for line in captured.err.splitlines() if "bad.json" in line]
    assert f"field {field!r}" in line and rule in line
    assert "Traceback" not in captured.err
    assert "result:   PASSES now" in captured.out


@pytest.mark.parametrize(
    "edit, field, maximum",
    [
        pytest.param(lambda b: b.update(capacity=10**9), "batch.capacity", "65,536",
                     id="capacity"),
        pytest.param(lambda b: b.update(buffer_rows=10**9), "batch.buffer_rows", "65,536",
                     id="buffer-rows"),
        pytest.param(lambda b: b.update(buffer_rows=65_536, capacity=8192, width=8192),
                     "batch.buffer_rows", "67,108,864", id="buffer-elements"),
    ],
)
def test_sizes_far_beyond_the_contract_fail_fast(tmp_path, capsys, c128a_device, edit, field,
                                                  maximum):
    """A huge capacity or buffer_rows is refused before anything is allocated, naming the maximum."""
    bad = raw_file(tmp_path, "huge.json", edited(lambda d: edit(d["batch"])))
    start = time.perf_counter()
    status = replay(c128a_device, bad, "--target", "reference")
    assert time.perf_counter() - start < 5
    err = capsys.readouterr().err
    assert status == EXIT_USAGE
    assert f"field {field!r}" in err and maximum in err


def test_a_prior_width_the_builder_refuses_is_the_cases_fault_not_the_targets(
    tmp_path, capsys, c128a_device
):
    """history_independent builds a step at ``prior_width`` before the case's
    own: one the builder refuses is a malformed case (exit 2, naming the
    file, the field and the rule), never the target's failure. (Before: the
    case replayed and the reference itself was blamed, exit 1.)"""
    bad = raw_file(tmp_path, "prior.json", edited(lambda d: (
        d.update(property="history_independent"), d["batch"].update(prior_width=100))))
    status = replay(c128a_device, bad, "--target", "reference")
    captured = capsys.readouterr()
    assert status == EXIT_USAGE
    [line] = captured.err.splitlines()
    assert str(bad) in line and "field 'batch.prior_width'" in line
    assert "a multiple of 128" in line
    assert "STILL FAILS" not in captured.out


def test_a_case_error_names_the_file_once(tmp_path, capsys, c128a_device):
    bad = raw_file(tmp_path, "bad.json", edited(lambda d: d["batch"].update(width="x")))
    assert replay(c128a_device, bad, "--target", "reference") == EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert line.count(str(bad)) == 1 and line.count("bad.json") == 1, line
    assert line == f"error: {bad}: field 'batch.width': must be an integer, got a string 'x'"


# ---------------------------------------------------------------- C: no import from a case alone


def test_replay_never_imports_a_module_only_the_case_names(tmp_path, capsys, monkeypatch,
                                                           c128a_device):
    """A case naming a foreign module is refused (exit 2, pass --target) and the module is never imported."""
    marker = tmp_path / "imported.marker"
    (tmp_path / "evil_module_c128a_test.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\nthing = None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path, _ = cases.write_case(
        make_case(property="matches_oracle", target="evil_module_c128a_test:thing"), tmp_path
    )
    assert replay(c128a_device, path) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "'evil_module_c128a_test'" in err
    assert "pass --target evil_module_c128a_test:thing" in err and f"${TARGET_ENV}" in err
    assert not marker.exists()
    assert "evil_module_c128a_test" not in sys.modules

    monkeypatch.setenv(TARGET_ENV, "reference")
    assert replay(c128a_device, path) == EXIT_OK
    out = capsys.readouterr().out
    assert f"target:   reference (from ${TARGET_ENV})" in out and "PASSES now" in out
    assert not marker.exists()


# ---------------------------------------------------------------- D: crashes and hangs


@pytest.mark.parametrize(
    "attr, death", [("exits", "its child process exited 9"), ("segfaults", "its child process died of SIGSEGV")]
)
@pytest.mark.slow
def test_a_crash_case_that_crashes_again_is_reported_and_the_next_file_runs(
    tmp_path, capsys, c128a_device, standin, attr, death
):
    """A crash case whose target dies again reports the crash (exit 1); the next file still runs."""
    crash, _ = cases.write_case(
        make_case(property="matches_oracle", target="reference", kind="crash"), tmp_path
    )
    status = replay(c128a_device, crash, good_file(tmp_path), "--target",
                    f"{STANDIN_MODULE}:{attr}")
    out = capsys.readouterr().out
    assert status == EXIT_FAILED
    assert f"case:     {crash}\nresult:   STILL CRASHES: {death}" in out
    assert "result:   PASSES now" in out.split("STILL CRASHES")[1]


@pytest.mark.slow
def test_a_hang_case_that_hangs_again_is_killed_at_the_timeout(tmp_path, capsys, c128a_device,
                                                                standin):
    """A hang case whose target hangs again is killed at --timeout and reported (exit 1)."""
    hang, _ = cases.write_case(
        make_case(property="matches_oracle", target="reference", kind="hang"), tmp_path
    )
    start = time.perf_counter()
    status = replay(c128a_device, hang, good_file(tmp_path), "--target", f"{STANDIN_MODULE}:hangs",
                    "--timeout", "3")
    seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    assert status == EXIT_FAILED
    assert "result:   STILL HANGS: the hang case ran past --timeout=3 s" in out
    assert "result:   PASSES now" in out.split("STILL HANGS")[1]
    # The target would hang for days: well under a minute means it was killed.
    # Not tighter: two child start-ups on a loaded machine take many seconds.
    assert seconds < 60


# ---------------------------------------------------------------- E: fuzz --config


def fuzz(tmp_path, device, *options) -> int:
    """``c128a fuzz`` set up so that nothing long could run."""
    return cli.main([
        "fuzz", "--device", device.type, "--target", "reference", "--max-examples", "1",
        "--workers", "1", "--cases-dir", str(tmp_path / "cases"),
        "--report", str(tmp_path / "r.json"), "--db", "none", "--no-live", *options,
    ])


@pytest.mark.parametrize(
    "text, words",
    [
        ("fuzz = 3\n", ["fuzz = 3 must be a table", "[fuzz]"]),
        ("[fuzzz]\nminutes = 1\n", ["unknown fuzzz at the top level", "[fuzz]"]),
        ("[fuzz]\nonly = [1]\n", ["fuzz.only=[1]", "must be a str, got an integer"]),
        ("[fuzz]\nonly = [['views']]\n", ["fuzz.only", "must be a str, got a list"]),
        ("[fuzz]\nminutes = 'soon'\n", ["fuzz.minutes", "must be a number, got a string"]),
        ("[fuzz]\nlive = 'no'\n", ["fuzz.live", "must be a bool, got a string"]),
        # A rule broken in the file names the file and the key as written
        # there, not a command-line option the user never typed (before:
        # "--minutes=inf must be ...", "--max-tokens=0 must be >= 1", ...).
        ("[fuzz]\nminutes = inf\n",
         ["--config ", "fuzz.toml: fuzz.minutes=inf must be a finite number > 0"]),
        ("[fuzz]\nmax-tokens = 0\n", ["fuzz.toml: fuzz.max-tokens=0 must be >= 1"]),
        ("[fuzz]\nchunk = 0\n", ["fuzz.toml: fuzz.chunk=0 must be >= 1"]),
        ("[fuzz]\nonly = ['nope']\n", ["fuzz.toml: fuzz.only names unknown properties nope"]),
        ("[fuzz]\nprofile = 'nightly'\n", ["fuzz.toml: fuzz.profile='nightly' is not one of"]),
        ("[fuzz\n", ["not TOML"]),
        # Two spellings of one option: before, both were accepted and the last won.
        ("[fuzz]\nmax-examples = 1\nmax_examples = 500\n",
         ["fuzz.max-examples and fuzz.max_examples set the same option", "keep one"]),
        ("[fuzz]\nexample_timeout = 5\nexample-timeout = 9\n",
         ["fuzz.example_timeout and fuzz.example-timeout set the same option"]),
    ],
)
def test_a_bad_config_file_exits_2_before_any_worker(tmp_path, capsys, c128a_device, text, words):
    """A bad --config file exits 2 with one line naming the key and the rule, before any worker starts."""
    config = tmp_path / "fuzz.toml"
    config.write_text(text)
    assert fuzz(tmp_path, c128a_device, "--config", str(config)) == EXIT_USAGE
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("c128a fuzz: ") and all(word in line for word in words), line
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "r.json").exists()


def test_a_list_option_of_the_wrong_type_is_refused_when_the_file_is_read(tmp_path):
    """A list option whose elements are not strings is a UsageError from load_config_file itself."""
    config = tmp_path / "fuzz.toml"
    config.write_text("[fuzz]\nonly = ['views', 2]\n")
    with pytest.raises(UsageError, match=r"fuzz\.only=\['views', 2\]: must be a str"):
        load_config_file(str(config))


def test_every_fuzz_option_can_be_set_in_the_config_file(tmp_path):
    """Every FuzzOptions field, live included, is read back from the [fuzz] table of --config."""
    expected = FuzzOptions(
        target="reference", padding_rows="inert", device="cpu", minutes=2.5, max_examples=3, max_tokens=16, seed=5,
        workers=2, db="none", cases_dir="cases", report="r.json", example_timeout=7.0,
        exitfirst=True, profile="ci", chunk=4, only=("views", "matches_oracle"), stateful=False,
        properties="c128a.checks:PROPERTIES", machine="c128a.replay:serving_loop_machine",
        live=False,
    )
    lines = ["[fuzz]"]
    for spec in fields(FuzzOptions):
        value = getattr(expected, spec.name)
        value = list(value) if isinstance(value, tuple) else value
        lines.append(f"{spec.name.replace('_', '-')} = {json.dumps(value)}")
    assert all(getattr(expected, spec.name) is not None for spec in fields(FuzzOptions))
    config = tmp_path / "all.toml"
    config.write_text("\n".join(lines) + "\n")
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    assert options_from_args(parser.parse_args(["--config", str(config)])) == expected
    # The command line wins over the file, --live and --no-live alike.
    options = options_from_args(parser.parse_args(["--config", str(config), "--live"]))
    assert options.live is True and options.minutes == 2.5


# ---------------------------------------------------------------- F: mutants and option names


def test_a_bad_spec_among_several_exits_2_before_any_row(capsys, c128a_device):
    """c128a mutants with one bad --spec among good ones exits 2 at once, printing no row."""
    start = time.perf_counter()
    status = cli.main([
        "mutants", "--device", c128a_device.type, "--property", "matches_oracle",
        "--max-examples", "1", "--markdown", "--spec", "c128a.mutants:off_by_one_length",
        "--spec", "no_such_module_x:y", "--spec", "reference",
    ])
    seconds = time.perf_counter() - start
    captured = capsys.readouterr()
    assert status == EXIT_USAGE
    assert "cannot import module 'no_such_module_x'" in captured.err
    assert "(target from --spec)" in captured.err
    assert captured.out == ""
    assert seconds < 10


@pytest.mark.parametrize("option", ["--minutes", "--example-timeout"])
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0"])
def test_fuzz_time_options_must_be_finite_and_positive(tmp_path, capsys, c128a_device, option,
                                                       value):
    """c128a fuzz refuses a time option that is not a finite number > 0 (exit 2)."""
    assert fuzz(tmp_path, c128a_device, option, value) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{option}={float(value)} must be a finite number > 0" in err


@pytest.mark.parametrize(
    "command",
    [
        ["fuzz", "--max-examples", "1", "--workers", "1", "--db", "none", "--no-live"],
        ["mutants", "--property", "matches_oracle", "--max-examples", "1"],
        ["bench", "--throughput", "--examples", "1"],
    ],
)
def test_usage_messages_name_the_cli_option(tmp_path, capsys, c128a_device, command):
    """A bad target is reported against the CLI's --target, never pytest's --c128a-target."""
    status = cli.main([*command, "--device", c128a_device.type, "--target", "no_such_module_c128a"])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE
    assert "cannot import module 'no_such_module_c128a'" in err
    assert "(target from --target)" in err and "--c128a-target" not in err


def test_replay_usage_messages_name_the_cli_option(tmp_path, capsys, c128a_device):
    """replay reports a bad --target, and a case's bad target, against the CLI's --target."""
    path, _ = cases.write_case(make_case(property="matches_oracle"), tmp_path)
    assert replay(c128a_device, path, "--target", "no_such_module_c128a") == EXIT_USAGE
    err = capsys.readouterr().err
    assert "(target from --target)" in err and "--c128a-target" not in err
    assert replay(c128a_device, path) == EXIT_USAGE  # the case names test_cases: not imported
    err = capsys.readouterr().err
    assert "pass --target" in err and "--c128a-target" not in err


# ---------------------------------------------------------------- G: code that raises before the run

RAISES_AT_IMPORT = "raises_at_import_c128a_test"
RAISES_ON_ATTRIBUTE = "raises_on_attribute_c128a_test"


@pytest.fixture
def raising_modules(tmp_path, monkeypatch) -> Path:
    """A module whose body raises, and one whose every attribute raises when read."""
    folder = tmp_path / "raising"
    folder.mkdir()
    (folder / f"{RAISES_AT_IMPORT}.py").write_text('raise RuntimeError("boom at import")\n')
    (folder / f"{RAISES_ON_ATTRIBUTE}.py").write_text(
        "def __getattr__(name):\n    raise RuntimeError(f'boom reading {name}')\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    return folder


SPEC_OPTIONS = [
    pytest.param("fuzz", "--target", "", id="fuzz-target"),
    pytest.param("fuzz", "--properties", ":PROPERTIES", id="fuzz-properties"),
    pytest.param("fuzz", "--machine", ":machine", id="fuzz-machine"),
    pytest.param("replay", "--target", "", id="replay-target"),
    pytest.param("replay", "--properties", ":PROPERTIES", id="replay-properties"),
    pytest.param("mutants", "--spec", "", id="mutants-spec"),
    pytest.param("mutants", "--mutants-from", ":MUTANTS", id="mutants-from"),
    pytest.param("bench", "--target", "", id="bench-target"),
]


def command_for(subcommand: str, tmp_path: Path, device) -> list[str]:
    """``subcommand`` set up so that nothing long could run, were the spec good."""
    device_options = ["--device", device.type]
    if subcommand == "fuzz":
        return ["fuzz", *device_options, "--max-examples", "1", "--workers", "1", "--db", "none",
                "--no-live", "--cases-dir", str(tmp_path / "cases")]
    if subcommand == "replay":
        return ["replay", str(good_file(tmp_path)), *device_options]
    if subcommand == "mutants":
        return ["mutants", *device_options, "--property", "matches_oracle", "--max-examples", "1",
                "--markdown", "--expect-pass", "reference"]
    return ["bench", "--throughput", *device_options, "--examples", "1", "--max-tokens", "16"]


@pytest.mark.parametrize(
    "module, raised",
    [
        pytest.param(RAISES_AT_IMPORT, "RuntimeError: boom at import", id="at-import"),
        pytest.param(RAISES_ON_ATTRIBUTE, "RuntimeError: boom reading", id="on-attribute"),
    ],
)
@pytest.mark.parametrize("subcommand, option, attribute", SPEC_OPTIONS)
def test_a_spec_whose_code_raises_is_a_usage_error(
    tmp_path, capsys, c128a_device, raising_modules, module, raised, subcommand, option, attribute
):
    """A spec whose module raises at import, or whose attribute raises when
    read, is a one-line usage error (exit 2) naming the option, the spec and
    what was raised; never a traceback and exit 1, "failures found"."""
    spec = f"{module}{attribute}"
    status = cli.main([*command_for(subcommand, tmp_path, c128a_device), option, spec])
    captured = capsys.readouterr()
    assert status == EXIT_USAGE, captured
    [line] = captured.err.splitlines()
    assert option in line and repr(spec) in line and raised in line, line
    assert "Traceback" not in captured.err
    assert "kill matrix" not in captured.out and "PASSES" not in captured.out


def test_replay_refuses_properties_that_are_not_a_mapping(tmp_path, capsys, c128a_device):
    """--properties naming something other than a dict (a module here) is a
    usage error (exit 2), not an AttributeError and exit 1."""
    status = replay(c128a_device, good_file(tmp_path), "--properties", "os:path")
    captured = capsys.readouterr()
    assert status == EXIT_USAGE
    [line] = captured.err.splitlines()
    assert "--properties 'os:path'" in line and "not a dict" in line
    assert "c128a.checks:PROPERTIES" in line and "Traceback" not in captured.err


# ---------------------------------------------------------------- H: cases that only seem to replay


def with_a_key_twice(data: dict, where: str, key: str, first_value) -> bytes:
    """``data`` as JSON with ``key`` given twice in the object at ``where``
    (the top level, or "batch"): ``first_value`` first, the real one last,
    which is the one json.loads keeps."""
    text = json.dumps(data)
    opening = "{" if where == "" else f'"{where}": {{'
    assert text.count(opening) == 1 or where == ""
    return text.replace(opening, f"{opening}{json.dumps(key)}: {json.dumps(first_value)}, ",
                        1).encode()


@pytest.mark.parametrize(
    "where, key, first_value",
    [
        pytest.param("", "property", "views", id="property"),
        pytest.param("batch", "width", 256, id="batch-width"),
    ],
)
def test_a_key_given_twice_is_a_malformed_case(tmp_path, capsys, c128a_device, where, key,
                                               first_value):
    """A case file with a key twice in one object (json keeps the last one
    silently) is malformed: exit 2 naming the file and the key; the next
    file still runs."""
    bad = raw_file(tmp_path, "twice.json", with_a_key_twice(edited(lambda d: None), where, key,
                                                             first_value))
    with pytest.raises(cases.CaseError) as raised:
        cases.load_case(bad)
    assert raised.value.field == key and "appears twice" in raised.value.rule
    status = replay(c128a_device, bad, good_file(tmp_path), "--target", "reference")
    captured = capsys.readouterr()
    assert status == EXIT_USAGE
    [line] = [line for line in captured.err.splitlines() if "twice.json" in line]
    assert f"field {key!r}" in line and "appears twice" in line
    assert captured.out.count("result:   PASSES now") == 1  # the good file only


def test_a_blob_whose_choices_do_not_fit_the_test_cannot_replay(tmp_path, capsys, c128a_device):
    """A failure case without a batch whose blob decodes (AAAA: two choices)
    but does not fit the test's draws: Hypothesis refuses it, or runs the
    simplest example in its place, which passes (which of the two depends on
    what the strategy draws first); that proves nothing, so exit 2, never
    "PASSES now". (A blob that fits still replays: test_fuzz_faults.py's
    test_target_policy_raising_is_a_failure_with_its_blob.)"""
    case = make_case(property="matches_oracle", target="reference", batch=None,
                     reproduce_blob="AAAA")
    path, _ = cases.write_case(case, tmp_path)
    assert replay(c128a_device, path) == EXIT_USAGE
    out = capsys.readouterr().out
    assert "result:   CANNOT REPLAY here" in out
    assert "the reproduce_blob cannot drive this test: " in out
    assert "PASSES" not in out and "STILL FAILS" not in out


def outside_contract_case(edit_batch) -> dict:
    data = edited(lambda d: d.update(
        outside_contract="max_compressed_tokens=100 must be a multiple of 128"
    ))
    edit_batch(data["batch"])
    return data


def test_outside_contract_excuses_the_width_and_capacity_only(tmp_path, capsys, c128a_device):
    """outside_contract excuses what a target's policy chose (an unaligned
    width); inputs malformed otherwise (a request with no block-table row)
    are a malformed case, exit 2, not a failure replayed against the oracle."""
    unaligned = raw_file(tmp_path, "unaligned.json",
                         outside_contract_case(lambda b: b.update(width=100)))
    assert cases.load_case(unaligned).batch.width == 100
    assert replay(c128a_device, unaligned, "--target", "reference") == EXIT_OK
    assert "result:   PASSES now" in capsys.readouterr().out

    bad = raw_file(tmp_path, "malformed.json", outside_contract_case(
        lambda b: b.update(width=100, token_to_req_indices=[3])
    ))
    with pytest.raises(cases.CaseError) as raised:
        cases.load_case(bad)
    assert raised.value.field == "batch"
    assert "token_to_req_indices[0]=3 but block_table has 1 rows" in raised.value.rule
    assert replay(c128a_device, bad, "--target", "reference") == EXIT_USAGE
    captured = capsys.readouterr()
    [line] = [line for line in captured.err.splitlines() if "malformed.json" in line]
    assert "field 'batch'" in line and "token_to_req_indices[0]=3" in line
    assert "STILL FAILS" not in captured.out


# ---------------------------------------------------------------- I: paths that are not files

@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["replay", "{fifo}", "--device", "cpu", "--target", "reference"],
                     id="replay-case"),
        pytest.param(["fuzz", "--config", "{fifo}", "--device", "cpu", "--target", "reference",
                      "--max-examples", "1", "--workers", "1", "--db", "none", "--no-live"],
                     id="fuzz-config"),
    ],
)
def test_a_named_pipe_is_refused_at_once(tmp_path, command):
    """A FIFO given as a case file or as --config is refused at once (exit
    2) naming the path: opening it would wait for a writer forever."""
    fifo = tmp_path / "case.fifo"
    os.mkfifo(fifo)
    # Start-up takes seconds; a hang is TimeoutExpired.
    done = run_cli(*[part.format(fifo=fifo) for part in command], cwd=tmp_path, timeout=30)
    assert done.returncode == EXIT_USAGE, done
    [line] = [line for line in done.stderr.splitlines() if str(fifo) in line]
    assert "is a named pipe (FIFO), not a regular file" in line
    assert "Traceback" not in done.stderr


def test_a_replay_child_never_imports_from_the_current_folder(tmp_path, capsys, monkeypatch,
                                                              c128a_device):
    """A crash case replays in a child process; a rich.py (a module the
    child imports) in the current folder must not run there, even with an
    empty PYTHONPATH entry, which means the current folder."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    marker = tmp_path / "rich-imported.marker"
    (folder / "rich.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
    )
    crash, _ = cases.write_case(
        make_case(property="matches_oracle", target="reference", kind="crash"), tmp_path
    )
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", "") + os.pathsep)
    status = replay(c128a_device, crash, "--target", "reference")
    out = capsys.readouterr().out
    assert not marker.exists(), "the replay's child imported rich.py from the current folder"
    assert status == EXIT_OK and "result:   PASSES now" in out


# ---------------------------------------------------------------- G: output files, up front


def _long_name(tmp_path: Path) -> Path:
    """A name the folder takes (255 bytes) but its temporary sibling, longer, does not."""
    return tmp_path / ("r" * 250 + ".json")


OUTPUT_PATHS = [
    pytest.param(lambda tmp: tmp / "missing" / "out.json", "does not exist", id="folder-missing"),
    pytest.param(lambda tmp: a_file(tmp) / "out.json", "is not a folder", id="folder-is-a-file"),
    pytest.param(lambda tmp: tmp, "is a directory", id="a-directory"),
    # Opening a FIFO to write waits for a reader: before, the run hung at its end.
    pytest.param(lambda tmp: a_fifo(tmp, "out.fifo"), "is a named pipe (FIFO)", id="a-fifo"),
    pytest.param(lambda tmp: Path("/proc/c128a-out.json"), "cannot be written", id="proc"),
]
BENCH_OUTPUTS = [
    *[pytest.param(option, *case.values, id=f"{option}-{case.id}")
      for option in ("--json", "--profile-out") for case in OUTPUT_PATHS],
    # --json is written whole beside its place first: a name of 255 bytes is
    # one its temporary file cannot have. (cProfile writes its stats in place.)
    pytest.param("--json", _long_name, "File name too long", id="--json-name-too-long"),
]


@pytest.mark.parametrize("option, make_path, words", BENCH_OUTPUTS)
def test_bench_output_files_are_checked_before_any_work(tmp_path, capsys, option, make_path,
                                                        words):
    """``c128a bench`` refuses an output file it could not write before it
    measures anything: exit 2, one line naming the option, the path and the
    rule. (Before: the throughput ran and printed, then an OSError traceback.)"""
    path = make_path(tmp_path)
    status = cli.main(["bench", "--throughput", "--examples", "1", "--device", "cpu",
                       "--target", "reference", option, str(path)])
    captured = capsys.readouterr()
    assert status == EXIT_USAGE
    [line] = captured.err.splitlines()
    assert line.startswith(f"c128a bench: {option}={path}: ") and words in line, line
    assert captured.out == ""  # nothing measured


@pytest.mark.parametrize("option, words", [
    ("--cases-dir", "--cases-dir='' is an empty path; name a folder"),
    ("--report", "--report='' is an empty path; name a file"),
    ("--db", "--db='' is an empty path; name a folder, redis://HOST:PORT/N, or none"),
])
def test_fuzz_refuses_an_empty_path(tmp_path, capsys, c128a_device, option, words, monkeypatch):
    """An empty path is refused (exit 2, one line), not taken as the current
    folder or, for --db, as no database. (Before: --cases-dir '' ran and
    saved cases in the current folder; --db '' ran without a database.)"""
    monkeypatch.chdir(tmp_path)
    assert fuzz(tmp_path, c128a_device, "--only", "views", "--no-stateful", option, "") == (
        EXIT_USAGE
    )
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert line.startswith("c128a fuzz: ") and words in line, line
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("value", [",", "", "views,", " , views"])
def test_fuzz_refuses_an_empty_property_name(tmp_path, capsys, c128a_device, value):
    """``--only`` with an empty name is refused (exit 2, one line). (Before:
    ``--only ,`` and ``--only ''`` ran every property; ``views,`` ran views.)"""
    assert fuzz(tmp_path, c128a_device, "--only", value) == EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("c128a fuzz: --only=") and "names an empty property" in line, line


@pytest.mark.parametrize("text", ["only = ','\n", "only = []\n", "only = ['views', '']\n"])
def test_a_config_file_with_an_empty_property_name_is_refused(tmp_path, capsys, c128a_device,
                                                              text):
    config = tmp_path / "fuzz.toml"
    config.write_text("[fuzz]\n" + text)
    assert fuzz(tmp_path, c128a_device, "--config", str(config)) == EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert "names an empty property" in line, line


@pytest.mark.parametrize("value", ["0", "-1"])
def test_bench_throughput_refuses_steps_of_no_token(capsys, value):
    """``--max-tokens 0`` drew steps of no token (mean 0 tokens) and timed
    nothing of the kernel's work: refused like a negative one (exit 2,
    before any example). (Before: 0 ran and printed examples/s.)"""
    status = cli.main(["bench", "--throughput", "--examples", "1", "--device", "cpu",
                       "--target", "reference", "--max-tokens", value])
    captured = capsys.readouterr()
    assert status == EXIT_USAGE and captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith(f"c128a bench: --max-tokens={value} must be >= 1"), line


@pytest.mark.parametrize("key, value, words", [
    ("target", "'no_such_module_c128a'", "(target from --config {config}: fuzz.target)"),
    ("cases_dir", "'{a_file}'", "--config {config}: fuzz.cases_dir {a_file} is a file"),
    ("report", "'{tmp}'", "--config {config}: fuzz.report {tmp} is a folder"),
])
def test_a_path_or_target_from_the_config_file_is_named_as_the_file_writes_it(
    tmp_path, capsys, c128a_device, key, value, words
):
    """The target and the paths a --config file sets are named by its key when
    refused. (Before: "(target from --target)", "--cases-dir ...", "--report ...".)"""
    config = tmp_path / "fuzz.toml"
    names = dict(config=config, a_file=a_file(tmp_path), tmp=tmp_path)
    config.write_text(f"[fuzz]\n{key} = {value.format(**names)}\n")
    status = cli.main(["fuzz", "--device", c128a_device.type, "--config", str(config),
                       "--max-examples", "1", "--workers", "1", "--db", "none", "--no-live",
                       *([] if key == "target" else ["--target", "reference"])])
    assert status == EXIT_USAGE
    [line] = capsys.readouterr().err.splitlines()
    assert words.format(**names) in line, line


# ---------------------------------------------------------------- H: interrupts


def _one_interrupted_line(done: subprocess.CompletedProcess, command: str) -> None:
    assert done.returncode == 130, done
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "interrupted" in line]
    assert line.startswith(f"c128a {command}: interrupted"), done.stderr


@pytest.mark.parametrize("command", [
    ["replay", "{case}", "--device", "cpu", "--target", f"{STANDIN_MODULE}:interrupts"],
    ["bench", "--throughput", "--examples", "3", "--device", "cpu", "--target",
     f"{STANDIN_MODULE}:interrupts", "--property", "matches_oracle"],
], ids=["replay", "bench"])
def test_a_target_raising_keyboard_interrupt_ends_with_one_line_and_130(tmp_path, standin,
                                                                         command):
    """A target raising KeyboardInterrupt: exit 130 and one line, no
    traceback. (Before: a traceback, and the process died by SIGINT.)"""
    path, _ = cases.write_case(make_case(property="matches_oracle", target="reference"),
                               tmp_path)
    done = run_cli(*[part.format(case=path) for part in command], cwd=tmp_path)
    _one_interrupted_line(done, command[0])


SLOW_IMPORT_MODULE = "slow_import_c128a_test"

# Stalls the first import of torch (which c128a's kernels and runners need)
# after saying so in a file, so that a real SIGINT lands in the middle of the
# command line's start-up.
STALL_TORCH_IMPORT = """
import sys, time
from pathlib import Path

class StallTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            Path({marker!r}).touch()
            time.sleep(60)
        return None

sys.meta_path.insert(0, StallTorch())
"""


def _as_from_a_shell() -> None:
    """In the child before it runs: SIGINT as a shell leaves it (default,
    not blocked), whatever a test run's worker process left set; a child
    that inherits SIGINT ignored or blocked never sees the signal sent."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _interrupted_once(marker: Path, tmp_path: Path, *args) -> subprocess.CompletedProcess:
    """``c128a ARGS`` as a child in ``tmp_path``, sent a real SIGINT once it
    has written ``marker`` (while it is stalled in its start-up)."""
    child = subprocess.Popen(
        cli_command(*args), cwd=tmp_path, env=child_environment(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_from_a_shell,
    )
    try:
        wait_until(lambda: marker.exists() or child.poll() is not None, 60,
                   f"the child to write {marker.name}", interval=0.05)
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def test_ctrl_c_while_the_command_line_imports_torch_ends_with_one_line_and_130(tmp_path):
    """SIGINT while ``c128a`` imports torch, before any subcommand runs: exit
    130 and one line. (Before: a traceback from ``import c128a.cli``.)"""
    marker = tmp_path / "importing-torch"
    (tmp_path / "sitecustomize.py").write_text(STALL_TORCH_IMPORT.format(marker=str(marker)))
    done = _interrupted_once(marker, tmp_path, "fuzz", "--help")
    assert done.returncode == 130, done
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "c128a: interrupted (Ctrl-C) while starting", done.stderr


def test_ctrl_c_while_fuzz_loads_its_target_ends_with_one_line_and_130(tmp_path):
    """SIGINT while ``c128a fuzz`` imports its target (start-up, before the
    run handles signals): exit 130 and one line. (Before: a traceback.)"""
    marker = tmp_path / "importing"
    (tmp_path / f"{SLOW_IMPORT_MODULE}.py").write_text(
        "import time\nfrom pathlib import Path\n"
        f"Path({str(marker)!r}).touch()\ntime.sleep(60)\n"
    )
    done = _interrupted_once(
        marker, tmp_path, "fuzz", "--device", "cpu", "--target", f"{SLOW_IMPORT_MODULE}:anything",
        "--max-examples", "1", "--workers", "1", "--db", "none", "--no-live",
        "--cases-dir", tmp_path / "cases")
    _one_interrupted_line(done, "fuzz")
