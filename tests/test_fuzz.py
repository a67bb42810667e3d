"""The fuzz runner, end to end, with stand-in properties in spawned workers.

The stand-ins below are small on purpose: the runner's job (rounds, cases,
isolation, restarts, the shared database) is under test here, not the
kernel. Workers import them by name (``test_fuzz:STANDIN_PROPERTIES``), the
same way they import the real ``c128a.checks:PROPERTIES``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule
from rich.console import Console

from c128a import cases, cli
from c128a.checks import Property
from c128a.cli.fuzz import configure_parser, options_from_args
from c128a.contract import oracle
from c128a.failures import InvariantViolation, UsageError
from c128a.runners import fuzz
from c128a.step import Batch, build
from helpers import free_port

PLANT_ENV = "C128A_TEST_PLANTED_MARKER"
WIDTH = 128
PAGES = WIDTH // 2
THRESHOLD = 1000


def small_batches(target, max_tokens: int | None = None, budget=None) -> st.SearchStrategy[Batch]:
    """1-4 decode tokens (or up to max_tokens), one request each, at W = C = 128;
    shrinks to one token at 0."""
    max_tokens = 4 if max_tokens is None else max_tokens

    @st.composite
    def draw_batch(draw):
        positions = draw(
            st.lists(st.integers(0, WIDTH * 128 - 1), min_size=1, max_size=max(1, max_tokens))
        )
        count = len(positions)
        padded = draw(st.lists(st.booleans(), min_size=count, max_size=count))
        return Batch(
            positions=tuple(positions),
            num_decode_tokens=count,
            token_to_req_indices=tuple(range(count)),
            block_table=tuple(tuple(r * PAGES + k for k in range(PAGES)) for r in range(count)),
            slot_mapping=tuple(-1 if pad else p for p, pad in zip(positions, padded)),
            max_model_len=WIDTH * 128,
            capacity=WIDTH,
            width=WIDTH,
            buffer_rows=count,
            labels=(f"tokens={count}", "padding" if any(padded) else "no padding"),
        )

    return draw_batch()


def matches_reference(target, batch: Batch, device) -> None:
    expected = build(oracle, batch, device)
    actual = build(target, batch, device)
    for name, want, got in zip(("global_decode", "decode_lens", "prefill"),
                               expected.views, actual.views):
        if not torch.equal(want, got):
            raise InvariantViolation(
                "matches_reference", f"{name} differs: expected {want.tolist()} got {got.tolist()}"
            )


def _plant_once() -> bool:
    """True the first time in a test (across processes): the marker file is created."""
    marker = os.environ.get(PLANT_ENV)
    if not marker:
        return False
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


def crashes_once(target, batch, device) -> None:
    if _plant_once():
        os.kill(os.getpid(), signal.SIGKILL)


def hangs_once(target, batch, device) -> None:
    if _plant_once():
        time.sleep(3600)


def cuda_fault_once(target, batch, device) -> None:
    if _plant_once():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


STANDIN_PROPERTIES = {
    "cuda_fault_once": Property("cuda_fault_once", small_batches, cuda_fault_once),
    "matches_reference": Property("matches_reference", small_batches, matches_reference),
    "crashes_once": Property("crashes_once", small_batches, crashes_once),
    "hangs_once": Property("hangs_once", small_batches, hangs_once),
}
PROPERTIES_SPEC = f"{__name__}:STANDIN_PROPERTIES"


def _lens_off_by_one(*args):
    """A mutant: decode_lens one too long for tokens at positions >= THRESHOLD."""
    views = oracle.build_c128a_topk_metadata(*args)
    positions, num_decode = args[0], args[2]
    late = positions[:num_decode] >= THRESHOLD
    views[1][late] += 1
    return views


lens_mutant = SimpleNamespace(build_c128a_topk_metadata=_lens_off_by_one)
MUTANT_SPEC = f"{__name__}:lens_mutant"


def standin_machine(target, device):
    """A serving loop reduced to one rule: build a one-token step, compare with the oracle."""

    class OneTokenSteps(RuleBasedStateMachine):
        @rule(position=st.integers(0, WIDTH * 128 - 1))
        def step(self, position):
            batch = Batch(
                positions=(position,), num_decode_tokens=1, token_to_req_indices=(0,),
                block_table=(tuple(range(PAGES)),), slot_mapping=(position,),
                max_model_len=WIDTH * 128, capacity=WIDTH, width=WIDTH, buffer_rows=1,
            )
            matches_reference(target, batch, device)

    return OneTokenSteps


MACHINE_SPEC = f"{__name__}:standin_machine"


def make_config(tmp_path: Path, **overrides) -> fuzz.FuzzConfig:
    values = dict(
        target="reference",
        device="cpu",
        max_examples=30,
        seed=1234,
        workers=1,
        db=str(tmp_path / "db"),
        cases_dir=str(tmp_path / "cases"),
        report=str(tmp_path / "report.json"),
        example_timeout=60.0,
        chunk=10,
        only=("matches_reference",),
        stateful=False,
        properties=PROPERTIES_SPEC,
        machine=None,
        live=False,
    )
    values.update(overrides)
    return fuzz.FuzzConfig(**values)


@pytest.mark.slow
def test_clean_run_reports_counts_coverage_and_versions(tmp_path):
    report = fuzz.run_fuzz(make_config(tmp_path, workers=2, max_examples=40))
    assert report["exit_status"] == 0, report
    assert report["status"] == "clean"
    assert report["totals"]["examples"] >= 40
    assert [w["worker"] for w in report["per_worker"]] == [0, 1]
    assert all(w["examples"] >= 20 for w in report["per_worker"])
    assert report["per_property"]["matches_reference"] == report["totals"]["examples"]
    assert sum(v for k, v in report["coverage"].items() if k.startswith("tokens=")) == (
        report["totals"]["examples"]
    )
    assert set(report["versions"]) >= {"c128a", "torch", "triton", "hypothesis", "python"}
    for row in (*report["per_worker"], report["totals"]):
        assert set(row["time_split"]) == {"drawing", "target", "oracle", "checks", "supervision"}
        assert row["time_split"]["target"] > 0  # the stand-in's builds are the target's
    assert json.loads(Path(tmp_path / "report.json").read_text()) == report
    assert not list((tmp_path / "cases").glob("*.json"))


def test_time_limited_run_stops_by_itself_with_a_live_display(tmp_path):
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=140)
    report = fuzz.run_fuzz(make_config(tmp_path, max_examples=None, minutes=0.15, live=True),
                           console=console)
    assert report["exit_status"] == 0, report
    shown = screen.getvalue()
    assert "c128a fuzz: reference on cpu" in shown and "remaining" in shown
    assert "c128a fuzz summary" in shown
    assert "time: drawing" in shown  # the live display's and the summary's time split
    assert report["minutes"] == 0.15 and report["max_examples"] is None
    assert report["per_worker"][0]["state"] in ("done", "stopped")  # not killed


def test_mutant_failure_is_shrunk_saved_and_replayable(tmp_path):
    report = fuzz.run_fuzz(make_config(tmp_path, target=MUTANT_SPEC, exitfirst=True,
                                       max_examples=500))
    assert report["exit_status"] == 1
    assert report["totals"]["failures"] >= 1
    saved = cases.case_files(tmp_path / "cases")
    assert len(saved) == 1 and saved[0].name.startswith("matches_reference-")
    case = cases.load_case(saved[0])
    assert case.kind == "failure" and case.target == MUTANT_SPEC
    # Shrunk: one token, exactly at the first failing position.
    assert case.batch.positions == (THRESHOLD,)
    assert "decode_lens differs" in case.failure
    assert case.reproduce_blob and case.seed is not None

    mutant = SimpleNamespace(build_c128a_topk_metadata=_lens_off_by_one, spec=MUTANT_SPEC)
    still = cases.replay_case(case, mutant, "cpu", properties=STANDIN_PROPERTIES)
    assert not still.passed and "decode_lens differs" in still.report
    fixed = SimpleNamespace(build_c128a_topk_metadata=oracle.build_c128a_topk_metadata)
    assert cases.replay_case(case, fixed, "cpu", properties=STANDIN_PROPERTIES).passed


def test_machine_failure_is_saved_with_its_steps_and_replayed(tmp_path):
    report = fuzz.run_fuzz(make_config(tmp_path, target=MUTANT_SPEC, exitfirst=True,
                                       max_examples=200, chunk=50, only=("serving_loop",),
                                       stateful=True, machine=MACHINE_SPEC))
    assert report["exit_status"] == 1
    [saved] = cases.case_files(tmp_path / "cases")
    case = cases.load_case(saved)
    assert case.kind == "serving_loop" and case.batch is None
    assert "state.step(position=1000)" in case.steps
    still = cases.replay_case(case, lens_mutant, "cpu", machine_factory=standin_machine)
    assert not still.passed and "decode_lens differs" in still.report
    fixed = SimpleNamespace(build_c128a_topk_metadata=oracle.build_c128a_topk_metadata)
    assert cases.replay_case(case, fixed, "cpu", machine_factory=standin_machine).passed


def test_same_failure_is_saved_once(tmp_path):
    for _ in range(2):
        fuzz.run_fuzz(make_config(tmp_path, target=MUTANT_SPEC, exitfirst=True, max_examples=500))
    assert len(cases.case_files(tmp_path / "cases")) == 1


def test_crashed_worker_is_restarted_and_its_input_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(PLANT_ENV, str(tmp_path / "planted"))
    report = fuzz.run_fuzz(make_config(tmp_path, only=("crashes_once",), max_examples=20))
    assert report["totals"]["crashes"] == 1
    assert report["totals"]["restarts"] == 1
    assert report["exit_status"] == 1  # a crash is a failure
    assert report["per_worker"][0]["state"] == "done"  # the restarted worker finished the run
    [saved] = cases.case_files(tmp_path / "cases")
    case = cases.load_case(saved)
    assert case.kind == "crash" and case.property == "crashes_once"
    assert "SIGKILL" in case.failure
    # A SIGKILL the runner did not send says what else sends one (a GPU host's
    # out-of-memory killer ended four workers of one run).
    assert "not sent by the runner" in case.failure and "out-of-memory killer" in case.failure
    assert case.batch is not None


@pytest.mark.slow
def test_cuda_fault_ends_the_worker_at_once_and_keeps_the_faulting_input(tmp_path, monkeypatch):
    monkeypatch.setenv(PLANT_ENV, str(tmp_path / "planted"))
    report = fuzz.run_fuzz(make_config(tmp_path, only=("cuda_fault_once",), max_examples=20))
    assert report["totals"]["crashes"] == 1 and report["totals"]["failures"] == 0
    assert report["per_worker"][0]["state"] == "done"
    [saved] = cases.case_files(tmp_path / "cases")
    case = cases.load_case(saved)
    assert case.kind == "crash"
    assert "CUDA fault" in case.failure and "illegal memory access" in case.failure


@pytest.mark.slow
def test_hung_worker_is_killed_restarted_and_its_input_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(PLANT_ENV, str(tmp_path / "planted"))
    report = fuzz.run_fuzz(
        make_config(tmp_path, only=("hangs_once",), max_examples=20, example_timeout=2.0)
    )
    assert report["totals"]["hangs"] == 1
    assert report["totals"]["restarts"] == 1
    assert report["per_worker"][0]["state"] == "done"
    [saved] = cases.case_files(tmp_path / "cases")
    case = cases.load_case(saved)
    assert case.kind == "hang" and "--example-timeout" in case.failure


@pytest.mark.slow
def test_command_line_run_against_a_real_mutant_then_replay(tmp_path, capsys, c128a_device):
    """The whole loop with the real properties: fuzz a mutant, save, replay, fix."""
    status = cli.main([
        "fuzz", "--target", "c128a.mutants:off_by_one_length", "--device", c128a_device.type,
        "--exitfirst", "--max-examples", "300", "--workers", "1", "--seed", "3",
        "--only", "matches_oracle", "--no-stateful", "--no-live",
        "--db", str(tmp_path / "db"), "--cases-dir", str(tmp_path / "cases"),
        "--report", str(tmp_path / "report.json"),
    ])
    assert status == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["target"] == "c128a.mutants:off_by_one_length"
    assert report["totals"]["failures"] == 1
    [saved] = cases.case_files(tmp_path / "cases")
    capsys.readouterr()
    assert cli.main(["replay", str(saved), "--device", c128a_device.type]) == 1
    assert "matches_oracle" in capsys.readouterr().out
    assert cli.main(["replay", str(saved), "--device", c128a_device.type, "--target", "triton"]) == 0


def test_max_tokens_sizes_every_drawn_step(tmp_path):
    report = fuzz.run_fuzz(make_config(tmp_path, max_examples=40, max_tokens=2))
    assert report["exit_status"] == 0, report
    assert report["max_tokens"] == 2
    sizes = {k for k in report["coverage"] if k.startswith("tokens=")}
    assert sizes == {"tokens=1", "tokens=2"}


def test_a_property_that_got_no_example_makes_the_run_incomplete(tmp_path):
    """--max-examples is spent on the first property's round: the second
    got no example, so the run is not clean (status incomplete, exit 2),
    and the summary and report name it and say why. (Before: `clean`,
    exit 0.)"""
    console_file = io.StringIO()
    config = make_config(tmp_path, max_examples=5, chunk=10,
                         only=("matches_reference", "cuda_fault_once"))
    report = fuzz.run_fuzz(config, Console(file=console_file, width=200))
    assert report["per_property"] == {"matches_reference": 5}, report["per_property"]
    assert report["status"] == "incomplete" and report["exit_status"] == 2, report
    assert list(report["not_run"]) == ["cuda_fault_once"]
    assert "--max-examples 5 was spent" in report["not_run"]["cuda_fault_once"]
    printed = " ".join(console_file.getvalue().split())
    assert "not run: cuda_fault_once: no example: --max-examples 5 was spent" in printed


@pytest.mark.parametrize("machine, words", [
    ("os:getcwd", "--machine os:getcwd: calling it with (target, device) raised TypeError"),
    (f"{__name__}:PROPERTIES_SPEC", f"--machine {__name__}:PROPERTIES_SPEC is a str, not callable"),
    (f"{__name__}:small_batches", f"--machine {__name__}:small_batches returned LazyStrategy"),
], ids=["raises", "not-callable", "not-a-machine"])
def test_a_machine_that_is_not_a_factory_of_one_is_refused_before_any_worker(
    tmp_path, capsys, c128a_device, machine, words
):
    """--machine is loaded and called with the target before any worker
    starts: one that is not a machine factory is one line, exit 2, no run.
    (Before: the run started, and each worker aborted with a traceback.)"""
    status = cli.main([
        "fuzz", "--target", "reference", "--device", c128a_device.type, "--no-live", "--db",
        "none", "--workers", "1", "--max-examples", "3", "--only", "serving_loop",
        "--machine", machine, "--cases-dir", str(tmp_path / "cases"),
        "--report", str(tmp_path / "r.json"),
    ])
    err = capsys.readouterr().err
    assert status == 2, err
    [line] = err.splitlines()
    assert line.startswith("c128a fuzz: ") and words in line, line
    assert not (tmp_path / "r.json").exists()


def test_unknown_target_is_a_usage_error_before_any_worker_starts(tmp_path):
    """The target is loaded once, in a child, before the workers: one that
    does not load is a usage error, and no report is written."""
    with pytest.raises(UsageError, match="cannot import module 'no_such_module_c128a'"):
        fuzz.run_fuzz(make_config(tmp_path, target="no_such_module_c128a"))
    assert not (tmp_path / "report.json").exists()
    # The child that refused at once left the workers' fork server running.
    assert fuzz.run_fuzz(make_config(tmp_path, max_examples=3))["exit_status"] == 0


def test_config_file_fills_in_what_the_command_line_leaves_out(tmp_path):
    config = tmp_path / "nightly.toml"
    config.write_text('[fuzz]\nminutes = 480\nworkers = 3\ndb = "nightly-db"\nseed = 7\n')
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    options = options_from_args(parser.parse_args(["--config", str(config), "--seed", "9"]))
    assert options.minutes == 480 and options.workers == 3
    assert options.db == "nightly-db"
    assert options.seed == 9  # the command line wins
    resolved = fuzz.resolve(options, target="reference", device="cpu")
    assert resolved.cases_dir == "c128a-cases" and resolved.minutes == 480


def test_config_file_with_an_unknown_key_names_it(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[fuzz]\nminuets = 5\n")
    with pytest.raises(UsageError, match="bad.toml: unknown key fuzz.minuets"):
        fuzz.load_config_file(str(config))


def _must_not_run(config, console=None):
    raise AssertionError(f"the run started with {config}")


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("--minutes", "1e308",
         "--minutes=1e+308 must be a finite number > 0 and <= 10080 (a week)"),
        ("--minutes", "10081", "--minutes=10081.0 must be a finite number > 0 and <= 10080"),
        ("--minutes", "inf", "--minutes=inf must be a finite number > 0 and <= 10080"),
        ("--minutes", "nan", "--minutes=nan must be a finite number > 0 and <= 10080"),
        ("--example-timeout", "1e308",
         "--example-timeout=1e+308 must be a finite number > 0 and <= 86400 (a day)"),
        ("--workers", "10000", "--workers=10000 must be >= 1 and <= "),
        ("--workers", "0", "--workers=0 must be >= 1 and <= "),
        # Steps the case format refuses were drawn, and their cases saved without inputs.
        ("--max-tokens", "100000", "--max-tokens=100000 must be <= 65528: a saved case holds"),
    ],
)
def test_an_option_out_of_its_range_is_a_usage_error_before_the_run(
    tmp_path, capsys, monkeypatch, c128a_device, option, value, words
):
    """Exit 2 with one line naming the option, the value and the range; no
    run starts (--minutes 1e308 overflowed the status line, --workers 10000
    ended in tracebacks). In-process, so on the session's device: the kernels
    are already imported for it."""
    monkeypatch.setattr("c128a.cli.fuzz.run_fuzz", _must_not_run)
    status = cli.main([
        "fuzz", "--target", "reference", "--device", c128a_device.type, "--no-live", "--db",
        "none",
        "--cases-dir", str(tmp_path / "cases"), "--report", str(tmp_path / "r.json"),
        option, value,
    ])
    err = capsys.readouterr().err
    assert status == 2, err
    [line] = err.splitlines()
    assert line.startswith("c128a fuzz: ") and words in line, line


def test_the_bounds_of_minutes_and_workers_are_allowed():
    from c128a.runners.fuzz import config
    from c128a.gpu.pinning import usable_cores

    most = min(config.WORKERS_PER_CORE * usable_cores(), config.MAX_WORKERS)
    options = fuzz.FuzzOptions(minutes=config.MAX_MINUTES, workers=most,
                               example_timeout=config.MAX_EXAMPLE_TIMEOUT_S)
    resolved = fuzz.resolve(options, target="reference", device="cpu")
    assert (resolved.minutes, resolved.workers) == (7 * 24 * 60, most)
    with pytest.raises(UsageError, match=f"--workers={most + 1} must be >= 1 and <= {most}"):
        fuzz.resolve(fuzz.FuzzOptions(workers=most + 1), target="reference", device="cpu")


def test_seeds_differ_per_worker_round_and_restart():
    seeds = {fuzz.derive_seed(1, w, g, r) for w in range(3) for g in range(2) for r in range(5)}
    assert len(seeds) == 30
    assert fuzz.derive_seed(1, 0, 0, 0) == fuzz.derive_seed(1, 0, 0, 0)


# ---------------------------------------------------------------- shared Redis database


@pytest.fixture
def redis_url(tmp_path):
    server = shutil.which("redis-server")
    try:
        import redis
    except ImportError:
        redis = None
    missing = [
        reason
        for reason, absent in (
            ("redis-server is not installed (apt-get install redis-server)", server is None),
            ("the redis client is not installed (pip install -e '.[redis]')", redis is None),
        )
        if absent
    ]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{'; '.join(missing)}: CI must run the shared-database test")
        pytest.skip("; ".join(missing))

    port = free_port()
    process = subprocess.Popen(
        [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail(f"redis-server on 127.0.0.1:{port} did not answer")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_two_runs_sharing_redis_see_each_others_failures(tmp_path, redis_url):
    finder = make_config(tmp_path / "a", target=MUTANT_SPEC, exitfirst=True, max_examples=500,
                         db=redis_url)
    assert fuzz.run_fuzz(finder)["exit_status"] == 1

    # One example is not enough to find the bug from scratch ...
    alone = make_config(tmp_path / "b", target=MUTANT_SPEC, max_examples=1)
    assert fuzz.run_fuzz(alone)["exit_status"] == 0
    # ... but through the shared database the second run replays the first one's failure.
    sharing = make_config(tmp_path / "c", target=MUTANT_SPEC, max_examples=1, db=redis_url)
    assert fuzz.run_fuzz(sharing)["exit_status"] == 1
    [saved] = cases.case_files(tmp_path / "c" / "cases")
    assert cases.load_case(saved).batch.positions == (THRESHOLD,)


def test_the_in_flight_record_reads_back_whole_after_a_shorter_one(tmp_path):
    from c128a.runners.fuzz.inflight import InflightFile

    path = tmp_path / "worker-0.json"
    record = InflightFile(path)
    record.write({"property": "matches_oracle", "batch": {"positions": list(range(50))}})
    record.write({"property": "padding", "batch": None})
    # Written in place, padded with spaces: still one JSON document, the last one.
    assert json.loads(path.read_text()) == {"property": "padding", "batch": None}
