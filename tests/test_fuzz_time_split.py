"""Where a fuzz run's time goes: the accounting (``c128a.phases``) and the
report's ``time_split``, from a short real run of the suite's own properties."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from c128a import cli, phases
from c128a.checks import Property
from c128a.failures import InvariantViolation
from c128a.runners.fuzz import FuzzConfig, time_lines
from c128a.runners.fuzz.worker import Worker
from test_fuzz import small_batches


class FakeClock:
    """The phases' clock, moving only when told to."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(phases, "_now", fake)
    return fake


def test_timer_charges_each_phase_its_own_time_and_the_rest_of_the_check_to_other(clock):
    timer = phases.ExampleTimer()
    timer.begin(drawn=0.25)  # the example was drawn before its check
    clock.advance(1.0)  # the check's own code
    with phases.phase("target"):
        clock.advance(2.0)
        with phases.phase("validation"):
            clock.advance(0.5)
    with phases.phase("oracle"):
        clock.advance(3.0)
    phases.measured("comparison")(lambda: clock.advance(4.0))()
    timer.end(drawn=0.25)
    assert phases._running is None  # the clock runs only inside the window
    assert timer.take() == pytest.approx(
        {"draw": 0.25, "other": 1.0, "target": 2.0, "validation": 0.5, "oracle": 3.0,
         "comparison": 4.0}
    )
    assert timer.take() == {}  # taken: the next message starts from zero


def test_timer_moves_draws_made_inside_the_window_from_other_to_draw(clock):
    timer = phases.ExampleTimer()
    timer.begin(drawn=0.5)  # a state machine: its data drawn before __init__
    clock.advance(3.0)  # rules run, and draw their arguments (2.0 s of the 3.0 s)
    timer.end(drawn=2.5)
    assert timer.take() == pytest.approx({"draw": 2.5, "other": 1.0})


def test_a_cancelled_window_charges_only_its_finished_phases(clock):
    timer = phases.ExampleTimer()
    timer.begin()
    with phases.phase("target"):
        clock.advance(1.0)
    clock.advance(5.0)
    timer.cancel()
    assert phases._running is None and not timer.open
    timer.end(drawn=9.0)  # nothing open: nothing happens
    timer.charge("inflight", 0.125)
    assert timer.take() == pytest.approx({"target": 1.0, "inflight": 0.125})


def test_without_a_window_phases_cost_nothing_and_charge_nothing(clock):
    timer = phases.ExampleTimer()
    with phases.phase("target"):
        clock.advance(1.0)
    assert timer.take() == {}


def test_split_folds_phases_into_buckets_and_supervision_is_the_rest():
    seconds = {"draw": 1.0, "validation": 0.5, "target": 2.0, "oracle": 3.0, "tensors": 0.25,
               "buffers": 0.25, "comparison": 0.5, "other": 1.0, "inflight": 0.75,
               "startup": 2.0}
    split = phases.split(seconds, wall=20.0)
    assert list(split) == list(phases.BUCKETS)
    assert split == pytest.approx(
        {"drawing": 1.0, "target": 2.5, "oracle": 3.0, "checks": 2.0, "supervision": 11.5}
    )
    assert sum(split.values()) == pytest.approx(20.0)
    assert sum(phases.shares(split).values()) == pytest.approx(1.0)
    # Phases beyond the wall (a clock mismatch) never make supervision negative.
    assert phases.split({"target": 5.0}, wall=4.0)["supervision"] == 0.0
    assert set(phases.BUCKET_OF) == set(phases.PHASES)  # every phase has a bucket
    assert phases.shares(dict.fromkeys(phases.BUCKETS, 0.0)) == dict.fromkeys(phases.BUCKETS, 0.0)


@pytest.mark.slow
def test_a_short_real_run_reports_where_each_workers_time_went(tmp_path, capsys, c128a_device):
    """Two workers, real properties (the serving loop included), the reference
    target on the CPU: every bucket present and the buckets add up to each
    worker's wall time."""
    status = cli.main([
        "fuzz", "--target", "reference", "--device", c128a_device.type, "--workers", "2",
        "--max-examples", "150", "--chunk", "10", "--seed", "11",
        "--only", "matches_oracle,history_independent,serving_loop", "--no-live",
        "--db", "none", "--cases-dir", str(tmp_path / "cases"),
        "--report", str(tmp_path / "report.json"),
    ])
    assert status == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["per_property"].get("serving_loop", 0) > 0
    for row in report["per_worker"]:
        split = row["time_split"]
        assert list(split) == list(phases.BUCKETS)
        assert all(seconds >= 0 for seconds in split.values()), split
        wall = row["elapsed_s"]
        assert 0 < wall <= report["elapsed_s"] + 0.5
        assert sum(split.values()) == pytest.approx(wall, rel=0.01, abs=0.01)
        measured = sum(seconds for name, seconds in split.items() if name != "supervision")
        assert measured <= wall  # supervision was not clipped to zero
        assert sum(row["time_share"].values()) == pytest.approx(1.0, abs=1e-3)
        assert row["time_detail"]["startup"] > 0
    totals = report["totals"]
    assert totals["worker_s"] == pytest.approx(
        sum(row["elapsed_s"] for row in report["per_worker"]), abs=0.01
    )
    for name in phases.BUCKETS:
        assert totals["time_split"][name] == pytest.approx(
            sum(row["time_split"][name] for row in report["per_worker"]), abs=0.01
        )
        assert totals["time_split"][name] > 0, name  # each bucket saw some time
    assert sum(totals["time_split"].values()) == pytest.approx(totals["worker_s"], rel=0.01)
    shown = capsys.readouterr().err
    assert "time: drawing " in shown and " · supervision " in shown
    assert "  per example: drawing " in shown
    assert "  worker 1 (" in shown
    assert time_lines(report)[0] in shown


# ---------------------------------------------------------------- a worker's rounds, in process

CHECK_SECONDS = 1.0  # what each timed check's target phase takes, on the fake clock
calls: list[int] = []  # tokens of each example the check ran


def slow_target_fails_at_two_tokens(target, batch, device) -> None:
    calls.append(batch.num_tokens)
    with phases.phase("target"):
        phases._now.advance(CHECK_SECONDS)
    if batch.num_tokens >= 2:
        raise InvariantViolation("two_tokens", f"{batch.num_tokens} tokens")


TIMED_PROPERTIES = {
    "two_tokens": Property("two_tokens", small_batches, slow_target_fails_at_two_tokens),
}


def drawing_machine(target, device):
    """Each rule draws a list (Hypothesis times the draw) and runs a target phase."""

    class Steps(RuleBasedStateMachine):
        @rule(values=st.lists(st.integers(), min_size=20, max_size=20))
        def step(self, values):
            with phases.phase("target"):
                phases._now.advance(CHECK_SECONDS)

    return Steps


class Channel:
    def __init__(self):
        self.messages = []

    def put(self, message) -> None:
        self.messages.append(message)

    def time(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for message in self.messages:
            if message.kind == "progress":
                for name, seconds in message.time.items():
                    total[name] = total.get(name, 0.0) + seconds
        return total


def in_process_worker(tmp_path, device, **overrides) -> Worker:
    values = dict(
        target="reference", device=device.type, workers=1, seed=5, db="none",
        cases_dir=str(tmp_path / "cases"), chunk=40, properties=f"{__name__}:TIMED_PROPERTIES",
        machine=f"{__name__}:drawing_machine", live=False,
    )
    values.update(overrides)
    return Worker(0, 0, FuzzConfig(**values), Channel(), threading.Event(),
                  str(tmp_path / "inflight.json"), None)


def test_a_round_times_its_examples_up_to_the_first_failure_and_not_the_shrinking(
    tmp_path, clock, c128a_device
):
    worker = in_process_worker(tmp_path, c128a_device, only=("two_tokens",), stateful=False)
    calls.clear()
    worker.property_round(worker.properties[0], seed=1, examples=40)
    worker.progress.flush()
    kinds = [message.kind for message in worker.channel.messages]
    assert "found" in kinds and "failure" in kinds
    first_failure = next(i for i, tokens in enumerate(calls) if tokens >= 2)
    assert len(calls) > first_failure + 1  # it shrank
    spent = worker.channel.time()
    # Timed: every example up to the first failing one; shrinking is supervision.
    assert spent["target"] == pytest.approx(CHECK_SECONDS * (first_failure + 1))
    assert spent["draw"] > 0 and spent["inflight"] > 0
    assert worker.progress.total == len(calls)
    assert phases._running is None and not worker.timer.open


def test_a_machine_round_charges_its_rule_draws_to_drawing(tmp_path, clock, c128a_device):
    worker = in_process_worker(tmp_path, c128a_device, only=("serving_loop",), stateful=True)
    worker.machine_round(seed=2, examples=3)
    worker.progress.flush()
    spent = worker.channel.time()
    assert spent["draw"] > 0  # Hypothesis's own timing of the rule draws
    assert spent["target"] >= CHECK_SECONDS and spent["target"] % CHECK_SECONDS == 0
    # The rules' own time on the fake clock is all target: nothing else is
    # left in the window but real-time draws, which were moved out of it.
    assert spent.get("other", 0.0) == 0.0
    assert phases._running is None and not worker.timer.open
