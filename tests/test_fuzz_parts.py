"""The fuzz runner's parts, one at a time, in this process: the worker
protocol, the in-flight record and the case made of it, the case book.
The real-process behaviour of the whole is in test_fuzz.py and
test_fuzz_faults.py."""

from __future__ import annotations

import dataclasses
import io
import pickle
import queue
import shutil

import pytest
from rich.console import Console

from c128a.failures import EXIT_USAGE
from c128a.runners import cases
from c128a.runners.fuzz import protocol
from c128a.runners.fuzz.inflight import (
    InflightFile,
    InflightRecord,
    case_from_inflight,
    read_inflight,
)
from c128a.runners.fuzz.supervisor import Supervisor
from test_cases import make_case, one_token_batch
from test_fuzz import make_config

EXAMPLE_MESSAGES = {
    protocol.Ready: protocol.Ready(3),
    protocol.Progress: protocol.Progress(
        3, examples=12, labels={"decode only": 12}, reach={"tokens: 1": 12},
        per_property={"lens": 12}, running="lens", time={"target": 0.5, "draw": 0.25},
    ),
    protocol.Found: protocol.Found(3, make_case(reproduce_blob=None)),
    protocol.Failure: protocol.Failure(3, make_case()),
    protocol.SuiteError: protocol.SuiteError(3, "lens: the suite itself failed: KeyError"),
    protocol.Fatal: protocol.Fatal(3, "ImportError: no module named x"),
    protocol.Done: protocol.Done(3),
}


def test_every_message_kind_has_an_example_here():
    assert set(EXAMPLE_MESSAGES) == set(protocol.MESSAGES)
    kinds = [message.kind for message in protocol.MESSAGES]
    assert len(set(kinds)) == len(kinds)


@pytest.mark.parametrize("kind", protocol.MESSAGES, ids=lambda kind: kind.kind)
def test_a_message_crosses_the_process_boundary_whole(kind):
    message = EXAMPLE_MESSAGES[kind]
    copy = pickle.loads(pickle.dumps(message))
    assert type(copy) is kind and copy == message
    assert copy.worker == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.worker = 4


@pytest.fixture
def supervisor(tmp_path):
    made = Supervisor(make_config(tmp_path), Console(file=io.StringIO()))
    yield made
    shutil.rmtree(made.run_dir, ignore_errors=True)


def sent(supervisor: Supervisor, *messages) -> None:
    """Worker 0 sent ``messages``: the supervisor handles them."""
    channel = queue.Queue()
    for message in messages:
        channel.put(message)
    supervisor.slots[0].channel = channel
    supervisor.drain(0)


def test_the_supervisor_has_one_handler_for_each_message_kind(supervisor):
    assert set(supervisor.handlers) == set(protocol.MESSAGES)


@pytest.mark.parametrize("unknown", [
    ("progress", 0, {"examples": 5}),  # the positional form: no longer a message
    {"kind": "done"},
    "done",
])
def test_a_message_of_no_known_kind_ends_the_run_as_an_error_of_the_suite(supervisor, unknown):
    sent(supervisor, unknown, EXAMPLE_MESSAGES[protocol.Progress])
    report = supervisor.report()
    [error] = report["errors"]
    assert error.startswith("worker 0 sent a message the suite does not know: ")
    assert repr(unknown)[:40] in error
    assert report["status"] == "errors" and report["exit_status"] == EXIT_USAGE
    assert report["totals"]["examples"] == 12  # the messages after it are handled


def test_progress_messages_add_up(supervisor):
    progress = EXAMPLE_MESSAGES[protocol.Progress]
    sent(supervisor, protocol.Ready(0), progress, progress)
    report = supervisor.report()
    assert report["totals"]["examples"] == 24 and report["errors"] == []
    assert report["per_property"] == {"lens": 24}
    assert report["coverage"] == {"decode only": 24}
    assert report["totals"]["time_detail"]["target"] == 1.0
    assert supervisor.stats[0].running == "lens" and supervisor.slots[0].ready


def test_suite_errors_and_fatal_messages_reach_the_report(supervisor):
    sent(supervisor, EXAMPLE_MESSAGES[protocol.SuiteError], EXAMPLE_MESSAGES[protocol.Fatal])
    report = supervisor.report()
    assert report["errors"] == ["worker 0: lens: the suite itself failed: KeyError"]
    assert report["error"] == "worker 0: ImportError: no module named x"
    assert report["status"] == "aborted" and supervisor.stop.is_set()


def test_a_case_that_would_not_load_back_is_an_error_not_a_saved_case(supervisor, tmp_path):
    unreadable = dataclasses.replace(make_case(), kind="no such kind")
    sent(supervisor, protocol.Found(0, unreadable))
    report = supervisor.report()
    [error] = report["errors"]
    assert "worker 0 sent a case the suite cannot read" in error and "'kind'" in error
    assert report["cases"] == [] and not (tmp_path / "cases").exists()


def test_the_in_flight_record_reads_back_as_written(tmp_path):
    record = InflightRecord(property="lens", seed=7, batch=one_token_batch(1000),
                            profile="fuzz", padding_rows="inert")
    InflightFile(tmp_path / "worker-0.json").write(record.to_json())
    back = read_inflight(tmp_path / "worker-0.json")
    assert back == record and back.batch_json == record.batch.to_json()
    assert back.batch_problem is None


def test_an_in_flight_record_with_a_malformed_batch_keeps_it_and_says_why(tmp_path):
    path = tmp_path / "worker-0.json"
    written = {**InflightRecord(property="lens", seed=7).to_json(), "batch": {"positions": "x"}}
    InflightFile(path).write(written)
    record = read_inflight(path)
    assert record.batch is None and record.batch_json == {"positions": "x"}
    assert record.batch_problem and "field" in record.batch_problem


@pytest.mark.parametrize("text", ["", "[1, 2]", "{\"property\": "])
def test_no_in_flight_record_is_none(tmp_path, text):
    path = tmp_path / "worker-0.json"
    path.write_text(text)
    assert read_inflight(path) is None
    assert read_inflight(tmp_path / "missing.json") is None


def test_a_case_from_an_in_flight_record_keeps_all_it_knows():
    batch = one_token_batch(1000)
    record = InflightRecord(property="lens", seed=7, batch=batch, profile="fuzz")
    case = case_from_inflight(record, kind="crash", failure="worker 0 died (signal SIGKILL)",
                              target="reference", device="cpu", padding_rows="inert")
    assert (case.property, case.kind, case.target, case.device) == (
        "lens", "crash", "reference", "cpu")
    assert (case.batch, case.seed, case.profile) == (batch, 7, "fuzz")
    assert case.padding_rows == "inert"  # the run's variant: the record names none
    assert case.failure == "worker 0 died (signal SIGKILL)" and case.outside_contract is None
    assert case.versions and case.created
    assert cases.Case.from_json(case.to_json()) == case


def test_a_case_from_a_record_of_a_cuda_fault_says_the_fault_and_the_breach():
    wide = dataclasses.replace(one_token_batch(1000), capacity=32)
    record = InflightRecord(property="lens", seed=7, batch=wide, padding_rows="inert",
                            fault="RuntimeError: CUDA error: an illegal memory access")
    case = case_from_inflight(record, kind="crash", failure="worker 1 died (CUDA fault)",
                              target="reference", device="cuda", padding_rows="slots")
    assert case.failure == ("worker 1 died (CUDA fault): RuntimeError: CUDA error: an illegal "
                            "memory access")
    assert case.padding_rows == "inert"  # the record's variant first
    assert "wider than global_decode_buffer" in case.outside_contract


def test_a_case_from_a_serving_loop_record_is_its_round():
    record = InflightRecord(property=cases.SERVING_LOOP, seed=9, round_examples=4)
    case = case_from_inflight(record, kind=cases.SERVING_LOOP, failure="boom",
                              target="reference", device="cpu", reproduce_blob="AXic",
                              steps="state.step(tokens=2)")
    assert (case.round_examples, case.reproduce_blob, case.steps) == (4, "AXic",
                                                                     "state.step(tokens=2)")
    assert case.batch is None and case.outside_contract is None
    unknown = case_from_inflight(InflightRecord(), kind="hang", failure="hung",
                                 target="reference", device="cpu")
    assert unknown.property == "unknown"
