"""The fuzz runner's parts, one at a time, in this process: the worker
protocol, the in-flight record and the case made of it, the case book.
The real-process behaviour of the whole is in test_fuzz.py and
test_fuzz_faults.py."""

from __future__ import annotations

import dataclasses
import io
import json
import multiprocessing
import os
import pickle
import queue
import shutil
import subprocess
import tempfile
import threading

import pytest
from rich.console import Console

from c128a import cases
from c128a.failures import EXIT_USAGE
from c128a.runners.fuzz import casebook, channel, protocol, rundir
from c128a.runners.fuzz.casebook import CaseBook
from c128a.runners.fuzz.inflight import (
    InflightFile,
    InflightRecord,
    case_from_inflight,
    read_inflight,
)
from c128a.runners.fuzz.supervisor import Supervisor
from c128a.runners.fuzz.worker import Worker
from test_cases import make_case, one_token_batch
from test_fuzz import MUTANT_SPEC, make_config

EXAMPLE_MESSAGES = {
    protocol.Ready: protocol.Ready(3),
    protocol.Progress: protocol.Progress(
        3, examples=12, labels={"decode only": 12}, reach={"tokens: 1": 12},
        per_property={"lens": 12}, running="lens", round=7, time={"target": 0.5, "draw": 0.25},
    ),
    protocol.Found: protocol.Found(3, make_case(reproduce_blob=None)),
    protocol.Shrinking: protocol.Shrinking(3, make_case()),
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
    handlers = supervisor.messages
    assert set(handlers.handlers) == set(protocol.MESSAGES)
    assert all(callable(getattr(handlers, name)) for name in handlers.handlers.values())


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


def test_the_report_counts_pair_cells_under_reach_pairs(supervisor):
    label = "pair padding x speculative decode: tail x 1 token a request"
    progress = dataclasses.replace(EXAMPLE_MESSAGES[protocol.Progress],
                                   reach={label: 5, "tokens T: 1": 5})
    sent(supervisor, protocol.Ready(0), progress)
    report = supervisor.report()
    pairs = report["reach_pairs"]["padding x speculative decode"]
    assert pairs["cells"]["tail x 1 token a request"] == 5
    assert "none x 1 token a request" in pairs["never drawn"]
    assert report["reach"]["tokens T"]["1"] == 5
    left_out = report["reach_pairs"]["tokens T x decode/prefill mix"]["cells"]["0 x decode only"]
    assert left_out.startswith("forbidden by the contract")


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


def unshrunk_and_shrunk():
    """A failure as first found (at 5000) and as shrunk (to 1000)."""
    return make_case(5000, reproduce_blob=None), make_case(1000)


def saved(tmp_path) -> list[str]:
    return sorted(path.name for path in cases.case_files(tmp_path / "cases"))


def test_the_book_saves_a_found_case_at_once_and_the_shrunk_one_replaces_it(tmp_path):
    book = CaseBook(tmp_path / "cases")
    first, shrunk = unshrunk_and_shrunk()
    assert book.found(0, first) is True
    assert saved(tmp_path) == [cases.case_filename(first)]
    assert [entry["shrunk"] for entry in book.entries] == [False]
    assert book.shrunk(0, shrunk) == 0  # the same failure, counted once
    assert saved(tmp_path) == [cases.case_filename(shrunk)]
    [entry] = book.entries
    assert entry["shrunk"] is True and entry["new"] is True
    assert entry["path"] == str(tmp_path / "cases" / cases.case_filename(shrunk))
    assert not book.has_unshrunk(0) and book.new_cases == 1


def test_a_found_case_that_was_minimal_gains_the_blob_in_place(tmp_path):
    book = CaseBook(tmp_path / "cases")
    first = make_case(1000, reproduce_blob=None)
    book.found(0, first)
    assert book.shrunk(0, make_case(1000)) == 0
    [entry] = book.entries
    assert entry["shrunk"] is True
    assert cases.load_case(entry["path"]).reproduce_blob == make_case().reproduce_blob


def test_a_failure_found_again_is_already_saved_and_counted_once(tmp_path):
    book = CaseBook(tmp_path / "cases")
    first, shrunk = unshrunk_and_shrunk()
    assert book.found(0, first) and book.shrunk(0, shrunk) == 0
    # Another worker (or the database) finds it again: nothing new.
    assert book.found(1, first) is False and book.shrunk(1, shrunk) == 0
    # A third one shrinks another first example to the same failure: its copy goes.
    other = make_case(7000, reproduce_blob=None)
    assert book.found(2, other) is True
    assert book.shrunk(2, shrunk) == -1
    assert saved(tmp_path) == [cases.case_filename(shrunk)] and len(book.entries) == 1


def test_a_shrunk_failure_without_an_early_report_is_recorded_then(tmp_path):
    book = CaseBook(tmp_path / "cases")
    assert book.shrunk(0, make_case()) == 1
    [entry] = book.entries
    assert entry["shrunk"] is True and entry["new"] is True


def same_failure_of_another_kind_and_target(book: CaseBook) -> bool:
    """Whether ``book`` tells one failure's inputs apart when the kind or the
    target differs (each is saved as its own new case)."""
    case = make_case()
    return (book.found(0, case)
            and book.found(1, dataclasses.replace(case, target="reference"))
            and book.found(2, dataclasses.replace(case, kind="crash")))


def test_a_failure_of_another_kind_or_target_is_not_a_duplicate(tmp_path, monkeypatch):
    book = CaseBook(tmp_path / "cases")
    assert same_failure_of_another_kind_and_target(book)
    assert len(saved(tmp_path)) == 3 and all(entry["new"] for entry in book.entries)
    # A book that knew a failure by its property and inputs alone (the names
    # before kind and target were part of them) fails the check.
    monkeypatch.setattr(casebook, "case_filename", cases.former_case_filename)
    assert not same_failure_of_another_kind_and_target(CaseBook(tmp_path / "other"))


def test_a_case_cut_short_stays_the_first_example_with_the_last_one_tried(tmp_path):
    book = CaseBook(tmp_path / "cases")
    first, _ = unshrunk_and_shrunk()
    book.found(0, first)
    last = one_token_batch(3000).to_json()
    book.cut_short(0, "the run ended", last_tried=last)
    [entry] = book.entries
    assert entry["shrunk"] is False and entry["last_tried"] == last
    assert entry["note"] == ("shrinking was cut short (the run ended); the case is the first "
                             "failing example")
    assert saved(tmp_path) == [cases.case_filename(first)] and not book.has_unshrunk(0)


def test_the_smallest_example_sent_replaces_the_first_when_the_stop_ends_shrinking(
    supervisor, tmp_path
):
    """A worker sends its first failing example, then smaller ones as it
    shrinks, then ends at the run's stop: the smaller ones are held, not
    saved, and the last replaces the first, saying shrinking was cut short."""
    first, smaller, smallest = (make_case(7000, reproduce_blob=None), make_case(5000),
                                make_case(3000))
    sent(supervisor, protocol.Ready(0), protocol.Found(0, first),
         protocol.Shrinking(0, smaller), protocol.Shrinking(0, smallest))
    assert saved(tmp_path) == [cases.case_filename(first)]
    supervisor.request_halt("the deadline")
    sent(supervisor, protocol.Done(0))
    report = supervisor.report()
    [entry] = report["cases"]
    assert saved(tmp_path) == [cases.case_filename(smallest)]
    assert entry["shrunk"] is False and entry["note"] == (
        "shrinking was cut short (the deadline ended it); the case is the smallest failing "
        "example found by then")
    assert report["totals"]["failures"] == 1 and supervisor.halt.is_set()


def test_a_shrunk_failure_ends_what_was_held_of_its_shrinking(supervisor, tmp_path):
    (first, shrunk), smaller = unshrunk_and_shrunk(), make_case(3000)
    sent(supervisor, protocol.Ready(0), protocol.Found(0, first),
         protocol.Shrinking(0, smaller), protocol.Failure(0, shrunk), protocol.Done(0))
    [entry] = supervisor.report()["cases"]
    assert saved(tmp_path) == [cases.case_filename(shrunk)] and entry["shrunk"] is True
    assert supervisor.losses.best == {}


def test_a_run_with_no_example_is_not_clean_and_says_why(supervisor):
    """No example ran (the workers were still starting): never `clean`."""
    supervisor.slots[0].process = object()  # spawned, never ready
    supervisor.request_halt("the deadline")
    report = supervisor.report()
    assert report["status"] == "nothing checked" and report["exit_status"] == EXIT_USAGE
    assert report["nothing_checked"].startswith("no worker was ready before the run stopped")


def test_a_case_that_cannot_be_written_is_kept_whole_in_its_entry(tmp_path):
    (tmp_path / "cases").write_text("a file where the folder should be")
    recorded = []
    book = CaseBook(tmp_path / "cases", on_record=lambda: recorded.append(True))
    case = make_case()
    book.found(0, case)
    [entry] = book.entries
    assert entry["path"] is None and entry["new"] is False
    assert entry["not_written"].startswith(f"{tmp_path / 'cases'}: ")
    assert cases.Case.from_json(entry["case"]) == case
    assert recorded == [True]  # --exitfirst stops at an unwritten case too


def refusing_book(tmp_path, *fallbacks):
    """A book whose cases folder is a file (every write refused), with
    ``fallbacks``; what it says goes to ``book.said``."""
    (tmp_path / "cases").write_text("a file where the folder should be")
    said = []
    book = CaseBook(tmp_path / "cases", fallbacks=list(fallbacks),
                    say=lambda text, case: said.append((text, case)))
    book.said = said
    return book


def test_a_refused_case_goes_at_once_to_the_first_fallback_that_takes_it(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file: no folder can be made under it")
    book = refusing_book(tmp_path, blocked / "unwritten", tmp_path / "unwritten")
    first, shrunk = unshrunk_and_shrunk()
    book.found(0, first)
    [entry] = book.entries
    [copy] = (tmp_path / "unwritten").iterdir()
    assert entry["saved_elsewhere"] == str(copy) and cases.load_case(copy) == first
    [(text, whole)] = book.said
    assert f"saved instead as {copy}" in text and whole is None
    book.shrunk(0, shrunk)  # the shrunk case replaces the copy, as it replaces a saved one
    assert [path.name for path in (tmp_path / "unwritten").iterdir()] == [
        cases.case_filename(shrunk)]
    assert book.entries[0]["shrunk"] is True and book.unwritten == book.entries


def test_a_case_no_folder_takes_is_said_whole_at_once(tmp_path):
    book = refusing_book(tmp_path)
    case = make_case()
    book.found(0, case)
    [(text, whole)] = book.said
    assert "nor elsewhere (no fallback folder): here it is whole" in text and whole == case
    assert cases.Case.from_json(book.entries[0]["case"]) == case


def test_a_refused_case_reaches_the_cases_folder_once_it_takes_it(tmp_path):
    book = refusing_book(tmp_path, tmp_path / "unwritten")
    case = make_case()
    book.found(0, case)
    book.retry_unwritten()  # still a file: nothing changes
    assert book.entries[0]["path"] is None and len(book.unwritten) == 1
    (tmp_path / "cases").unlink()
    (tmp_path / "cases").mkdir()
    book.retry_unwritten()
    [entry] = book.entries
    assert entry["path"] == str(tmp_path / "cases" / cases.case_filename(case)) and entry["new"]
    assert "case" not in entry and "not_written" not in entry and entry["written_late"]
    assert list((tmp_path / "unwritten").iterdir()) == [] and book.unwritten == []


def test_a_lost_input_is_listed_with_nothing_saved(tmp_path):
    book = CaseBook(tmp_path / "cases")
    book.lost("crash", "worker 0 died (exit 3) running this input (before its first example)")
    assert book.entries == [{"path": None, "property": None, "kind": "crash", "new": False,
                             "failure": "worker 0 died (exit 3) running this input (before "
                                        "its first example)"}]
    assert book.new_cases == 0 and not (tmp_path / "cases").exists()


def test_a_worker_sends_only_protocol_messages_and_its_cases_survive_the_crossing(
        tmp_path, c128a_device):
    """A real round against a mutant, in this process (so on the session's
    device): what the worker puts on its channel is protocol messages only,
    each whole after pickling, and the found and shrunk cases load back as the
    supervisor will read them."""
    config = make_config(tmp_path, target=MUTANT_SPEC, max_examples=200,
                         device=c128a_device.type)
    channel = queue.Queue()
    worker = Worker(0, 0, config, channel, threading.Event(), str(tmp_path / "inflight.json"),
                    None)
    worker.property_round(worker.properties[0], seed=3, examples=200)
    worker.progress.flush()
    messages = []
    while not channel.empty():
        messages.append(channel.get())
    assert messages and all(isinstance(message, protocol.MESSAGES) for message in messages)
    assert all(pickle.loads(pickle.dumps(message)) == message for message in messages)
    [found] = [m for m in messages if isinstance(m, protocol.Found)]
    [shrunk] = [m for m in messages if isinstance(m, protocol.Failure)]
    for case in (found.case, shrunk.case):
        assert cases.Case.from_json(case.to_json()) == case
        assert case.kind == "failure" and case.target == MUTANT_SPEC and case.batch is not None
    assert shrunk.case.reproduce_blob and not found.case.reproduce_blob


# ---------------------------------------------------------------- the channel


@pytest.fixture
def channel_pair():
    """A worker's channel, both ends in this process: (writer, reader)."""
    reading, writing = multiprocessing.Pipe(duplex=False)
    reader = channel.ChannelReader(reading)
    yield channel.ChannelWriter(writing), reader
    reader.close()


def received(reader: channel.ChannelReader) -> list:
    messages = []
    while True:
        try:
            messages.append(reader.get_nowait())
        except queue.Empty:
            return messages


def test_every_message_kind_crosses_a_real_channel_whole(channel_pair):
    writer, reader = channel_pair
    for message in EXAMPLE_MESSAGES.values():
        writer.put(message)
    assert received(reader) == list(EXAMPLE_MESSAGES.values())


def test_a_frame_arriving_in_pieces_is_read_once_whole(channel_pair):
    """Half a frame is no message yet, and no error: the rest comes later."""
    writer, reader = channel_pair
    payload = pickle.dumps(protocol.Done(1))
    frame = channel.HEADER.pack(channel.FRAME_MAGIC, len(payload)) + payload
    os.write(writer.fileno(), frame[:7])
    assert received(reader) == []
    os.write(writer.fileno(), frame[7:])
    assert received(reader) == [protocol.Done(1)]


@pytest.mark.parametrize("data, problem", [
    (b"garbage", "bytes that are not a frame"),
    (channel.FRAME_MAGIC + (channel.MAX_FRAME_BYTES + 1).to_bytes(4, "big"), "MAX_FRAME_BYTES"),
    (channel.FRAME_MAGIC + (3).to_bytes(4, "big") + b"abc", "does not unpickle"),
    # A valid pickle that would call a function: a frame is data.
    (channel.FRAME_MAGIC + len(pickle.dumps(os.getpid)).to_bytes(4, "big")
     + pickle.dumps(os.getpid), "which no message holds"),
], ids=["garbage", "too-long", "not-pickle", "names-a-function"])
def test_what_is_not_a_frame_of_a_message_is_a_channel_error(channel_pair, data, problem):
    writer, reader = channel_pair
    os.write(writer.fileno(), data)
    with pytest.raises(channel.ChannelError, match=problem):
        reader.get_nowait()


def test_a_channel_ended_inside_a_frame_says_so(channel_pair):
    writer, reader = channel_pair
    os.write(writer.fileno(), channel.FRAME_MAGIC + (100).to_bytes(4, "big") + b"x" * 10)
    writer.close()
    assert received(reader) == []
    assert reader.unfinished_frame() == (
        "the channel ended inside a frame announcing 100 bytes, of which 10 came")


# ---------------------------------------------------------------- the run's temporary folder


def test_only_a_run_folder_whose_owner_is_gone_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = rundir.make_run_dir()
    gone = rundir.make_run_dir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    owner = json.loads((gone / rundir.OWNER_FILE).read_text())
    (gone / rundir.OWNER_FILE).write_text(json.dumps({**owner, "pid": dead.pid}))
    elsewhere = rundir.make_run_dir()  # another pid namespace: not ours to judge
    (elsewhere / rundir.OWNER_FILE).write_text(
        json.dumps({**owner, "pid": dead.pid, "pid_namespace": "pid:[1]"}))
    unowned = tmp_path / f"{rundir.PREFIX}being-made"
    unowned.mkdir()
    assert rundir.remove_stale_run_dirs() == [gone]
    assert mine.is_dir() and elsewhere.is_dir() and unowned.is_dir()
