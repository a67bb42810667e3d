"""Case files: writing, validating, replaying, and ``c128a replay``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from c128a import cases, cli
from c128a.cases import store
from c128a.checks import Property
from c128a.contract import oracle
from c128a.failures import CaseError, InvariantViolation
from c128a.files import readable_json
from c128a.runners.fuzz.casebook import CaseBook
from c128a.step import Batch, build
from helpers import fill_to_the_last_byte, small_tmpfs

THRESHOLD = 1000


def lens_match_reference(target, batch: Batch, device) -> None:
    expected = build(oracle, batch, device)
    actual = build(target, batch, device)
    want, got = expected.views[1], actual.views[1]
    if not torch.equal(want, got):
        row = int((want != got).nonzero()[0, 0])
        raise InvariantViolation(
            "lens",
            f"decode_lens row {row}: expected {int(want[row])}, actual {int(got[row])} "
            f"(position {batch.positions[row]}, request {batch.token_to_req_indices[row]}, "
            f"W={batch.width})"
        )


STANDIN_PROPERTIES = {"lens": Property("lens", None, lens_match_reference)}


def _lens_off_by_one(*args):
    views = oracle.build_c128a_topk_metadata(*args)
    views[1][args[0][: args[2]] >= THRESHOLD] += 1
    return views


# Importable by spec, for `c128a replay` in a subprocess-free CLI call.
lens_mutant = SimpleNamespace(build_c128a_topk_metadata=_lens_off_by_one)
MUTANT_SPEC = f"{__name__}:lens_mutant"
PROPERTIES_SPEC = f"{__name__}:STANDIN_PROPERTIES"


def one_token_batch(position: int) -> Batch:
    return Batch(
        positions=(position,),
        num_decode_tokens=1,
        token_to_req_indices=(0,),
        block_table=(tuple(range(64)),),
        slot_mapping=(position,),
        max_model_len=128 * 128,
        capacity=128,
        width=128,
        buffer_rows=1,
        block_table_row_stride=80,
        labels=("decode only",),
    )


def make_case(position: int = THRESHOLD, **overrides) -> cases.Case:
    values = dict(property="lens", target=MUTANT_SPEC, kind="failure",
                  failure="AssertionError: decode_lens differs", batch=one_token_batch(position),
                  device="cpu", seed=7, reproduce_blob="AXicY2BgAAAABAAB")
    values.update(overrides)
    return cases.new_case(**values)


def test_case_round_trips_through_json(tmp_path):
    case = make_case()
    path, new = cases.write_case(case, tmp_path)
    assert new and path.name == cases.case_filename(case)
    assert path.name.startswith("lens-")
    loaded = cases.load_case(path)
    assert loaded == case
    data = json.loads(path.read_text())
    assert data["format"] == cases.CASE_FORMAT
    assert data["batch"]["block_table_row_stride"] == 80
    assert set(data["versions"]) == {"c128a", "torch", "triton", "hypothesis", "python"}


@given(st.integers(0, 128 * 128 - 1), st.text(max_size=20))
def test_same_inputs_give_one_file_whatever_the_message(position, message):
    first = make_case(position)
    again = make_case(position, failure=message, seed=99)
    assert cases.case_filename(first) == cases.case_filename(again)
    assert cases.case_filename(first) != cases.case_filename(make_case(position + 1))


def test_a_saved_failure_is_not_written_twice(tmp_path):
    path, new = cases.write_case(make_case(), tmp_path)
    again, new_again = cases.write_case(make_case(failure="other words"), tmp_path)
    assert (new, new_again) == (True, False) and again == path
    assert "other words" not in path.read_text()


def test_cases_of_another_kind_or_target_get_files_of_their_own(tmp_path):
    """A crash of one target on the inputs another target failed on is a case
    of its own: saved new beside the other, never "already saved"."""
    failure = make_case()
    others = [make_case(target="reference", kind="crash"), make_case(kind="crash"),
              make_case(target="reference")]
    saved = [cases.write_case(case, tmp_path) for case in (failure, *others)]
    assert [new for _, new in saved] == [True] * 4
    assert len({path for path, _ in saved}) == 4
    for (path, _), case in zip(saved, (failure, *others)):
        loaded = cases.load_case(path)
        assert (loaded.kind, loaded.target) == (case.kind, case.target)
    # The same case again (kind, target, property, inputs) is still saved once.
    again = make_case(kind="crash", failure="worker 0 died (signal SIGKILL)")
    assert cases.write_case(again, tmp_path) == (saved[2][0], False)
    assert len(cases.case_files(tmp_path)) == 4


def test_a_case_saved_under_its_former_name_is_found_not_saved_again(tmp_path):
    """Before kind and target were part of a case's name, a case with inputs
    was named by its property, inputs and variant: such a file still counts
    as the same case saved, and another target's case on those inputs goes
    beside it."""
    case = make_case()
    former = tmp_path / cases.former_case_filename(case)
    former.write_text(json.dumps(case.to_json()))
    assert cases.write_case(make_case(failure="other words"), tmp_path) == (former, False)
    assert cases.load_case(former) == case
    other, new = cases.write_case(make_case(target="reference"), tmp_path)
    assert new and other != former
    assert sorted(cases.case_files(tmp_path)) == sorted([former, other])


def _malformed(tmp_path: Path, edit) -> Path:
    data = make_case().to_json()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d.update(format="c128a-case/0"), "format"),
        (lambda d: d.pop("property"), "property"),
        (lambda d: d.update(kind="boom"), "kind"),
        (lambda d: d.update(batch=None, reproduce_blob=None), "batch"),
        (lambda d: d["batch"].pop("positions"), "batch.positions"),
        (lambda d: d["batch"].update(positions=[1, "2"]), "batch.positions[1]"),
        (lambda d: d["batch"].update(width=128.0), "batch.width"),
        (lambda d: d["batch"].update(block_table=[[1, 2], [3]]), "batch.block_table"),
        (lambda d: d["batch"].update(colour="red"), "batch.colour"),
        (lambda d: d.update(seed="7"), "seed"),
    ],
)
def test_malformed_case_names_the_file_and_the_field(tmp_path, edit, field):
    path = _malformed(tmp_path, edit)
    with pytest.raises(CaseError) as raised:
        cases.load_case(path)
    assert raised.value.field == field
    assert str(path) in str(raised.value) and repr(field) in str(raised.value)


def test_a_file_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "torn.json"
    path.write_text('{"format": "c128a-case/1", ')
    with pytest.raises(CaseError, match="torn.json.*not JSON"):
        cases.load_case(path)


def test_replay_reports_the_diff_and_passes_once_fixed():
    case = make_case()
    still = cases.replay_case(case, lens_mutant, "cpu", properties=STANDIN_PROPERTIES)
    assert not still.passed
    assert "expected 7, actual 8" in still.report and "position 1000" in still.report
    fixed = cases.replay_case(case, SimpleNamespace(
        build_c128a_topk_metadata=oracle.build_c128a_topk_metadata), "cpu",
        properties=STANDIN_PROPERTIES)
    assert fixed.passed


def test_replay_of_an_unknown_property_names_the_field():
    with pytest.raises(CaseError, match="'property'.*'gone'"):
        cases.replay_case(make_case(property="gone"), lens_mutant, "cpu",
                          properties=STANDIN_PROPERTIES)


def test_replay_command_exit_status_and_output(tmp_path, capsys, c128a_device):
    path, _ = cases.write_case(make_case(), tmp_path)

    # The case names a test module: replay imports it only when asked to.
    assert cli.main(["replay", str(path), "--device", c128a_device.type, "--properties", PROPERTIES_SPEC]) == 2
    assert "would import module 'test_cases'" in capsys.readouterr().err

    assert cli.main(["replay", str(path), "--device", c128a_device.type, "--target", MUTANT_SPEC,
                     "--properties", PROPERTIES_SPEC]) == 1
    out = capsys.readouterr().out
    assert "STILL FAILS" in out and "expected 7, actual 8" in out
    assert f"target:   {MUTANT_SPEC} (from --target)" in out

    assert cli.main(["replay", str(path), "--device", c128a_device.type, "--target", "reference",
                     "--properties", PROPERTIES_SPEC]) == 0
    assert "PASSES now" in capsys.readouterr().out


def test_replay_command_runs_the_other_files_past_a_malformed_one(tmp_path, capsys, c128a_device):
    bad = _malformed(tmp_path, lambda d: d["batch"].pop("capacity"))
    good, _ = cases.write_case(make_case(), tmp_path)
    status = cli.main(["replay", str(bad), str(good), "--device", c128a_device.type, "--target", "reference",
                       "--properties", PROPERTIES_SPEC])
    captured = capsys.readouterr()
    assert status == 2
    assert "bad.json" in captured.err and "'batch.capacity'" in captured.err
    assert "PASSES now" in captured.out


@pytest.mark.slow
def test_regression_tests_isolate_a_malformed_file(pytester):
    """The conformance suite's case replay on a folder of one's own
    (--c128a-cases) with one good and one broken case."""
    folder = pytester.mkdir("my-cases")
    good = make_case(property="matches_oracle", target="reference")
    cases.write_case(good, folder)
    broken = good.to_json()
    del broken["batch"]["capacity"]
    (folder / "broken.json").write_text(json.dumps(broken))

    result = pytester.runpytest_subprocess(
        "--pyargs", "c128a.conformance.test_regressions", "--c128a-cases", "my-cases",
        "--c128a-device=cpu", "--c128a-target=reference", "-k", "my-cases",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "c128a regression cases: 3 in the package, 2 in my-cases",
        "*my-cases/broken.json*field 'batch.capacity': missing*",
    ])


def test_a_failing_conformance_property_saves_the_step_it_reports(tmp_path, c128a_device):
    """What c128a/conformance/test_properties.py prints below a diff: the
    case file of the reported step, which replays to the same diff."""
    from hypothesis import settings

    from c128a.checks import PROPERTIES
    from c128a.conformance.saved_failures import FailingSteps, save_failure
    from c128a.failures import ContractViolation
    from c128a.targets import load_target

    spec = "c128a.mutants:packed_stride"
    target = load_target(spec)
    steps = FailingSteps()
    with pytest.raises(ContractViolation) as raised:
        PROPERTIES["views"].test(target, c128a_device, around=steps,
                                 settings=settings(max_examples=5, database=None))()
    batch = steps.step_of(raised.value)
    assert batch is not None
    note = save_failure(raised.value, batch, "views", target, c128a_device, tmp_path)
    [path] = tmp_path.glob("views-*.json")
    assert note.splitlines() == [
        f"case file: {path}",
        f"rerun: c128a replay {path} --target {spec} --device {c128a_device.type}",
    ]
    outcome = cases.replay_case(cases.load_case(path), target, c128a_device)
    assert not outcome.passed
    assert str(raised.value).splitlines()[0] in outcome.report


# ---------------------------------------------------------------- a file in a case's place


LFS_POINTER = ("version https://git-lfs.github.com/spec/v1\n"
               "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
               "size 1893\n")


def _merge_conflict(path: Path) -> None:
    """The case and another one in a conflict's markers, as a merge leaves a
    committed cases folder."""
    ours = readable_json(make_case().to_json())
    theirs = readable_json(make_case(failure="other words").to_json())
    path.write_text(f"<<<<<<< HEAD\n{ours}\n=======\n{theirs}\n>>>>>>> other-branch\n")


FILES_IN_THE_WAY = {
    "an empty object": (lambda path: path.write_text("{}\n"), "no case (field 'format'"),
    "a dangling symlink": (lambda path: path.symlink_to(path.parent / "moved-away.json"),
                           "a symbolic link to"),
    "a Git LFS pointer": (lambda path: path.write_text(LFS_POINTER), "a Git LFS pointer"),
    "a merge conflict": (_merge_conflict, "merge-conflict markers"),
    "another case": (lambda path: path.write_text(json.dumps(make_case(2000).to_json())),
                     "another case (failure of lens on"),
    "a folder": (lambda path: path.mkdir(), "is a directory"),
}


def _snapshot(path: Path):
    """What is at ``path``, to see that it is left as it was."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return ("folder", sorted(p.name for p in path.iterdir()))
    return ("file", path.read_bytes())


@pytest.mark.parametrize("plant, named", FILES_IN_THE_WAY.values(), ids=FILES_IN_THE_WAY)
def test_a_file_in_a_cases_place_is_left_and_the_case_takes_another_name(tmp_path, plant,
                                                                         named):
    """A file at a case's name counts as the case saved only when it reads
    back as the same case. Anything else there stays as it is, and the case
    is saved new under the next name, which says why. (Before: any file there
    was "already saved", and the case was never written.)"""
    case = make_case()
    taken = tmp_path / cases.case_filename(case)
    plant(taken)
    before = _snapshot(taken)
    path, new = cases.write_case(case, tmp_path)
    assert new and path == tmp_path / taken.name.replace(".json", "-2.json")
    assert _snapshot(taken) == before
    loaded = cases.load_case(path)
    assert cases.case_identity(loaded) == cases.case_identity(case) and loaded.batch == case.batch
    # Found again: the copy under the other name is the case, saved once;
    # why its own name was passed over is said.
    again = cases.save_case(make_case(failure="again"), tmp_path)
    assert (again.path, again.new) == (path, False)
    [why] = again.passed_over
    assert why.startswith(f"{taken.name} holds ") and named in why, why


def test_a_file_that_reads_back_as_the_same_case_is_the_case_saved(tmp_path):
    """The same case written by another run (another message, another
    layout, linked from elsewhere) is already saved; no second file."""
    case = make_case()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(make_case(failure="other words", seed=3).to_json()))
    folder = tmp_path / "cases"
    folder.mkdir()
    (folder / cases.case_filename(case)).symlink_to(elsewhere)
    assert cases.write_case(case, folder) == (folder / cases.case_filename(case), False)
    assert len(list(folder.iterdir())) == 1


def test_a_shrunk_case_whose_name_is_taken_is_saved_before_its_first_copy_goes(tmp_path):
    """The failure as first found is saved at once; its shrunk case's name
    holds a file that is no case (each kind at once: the case passes over
    every one). The shrunk case is saved under the next free name and said;
    only then does the first copy go. (Before: the shrunk case was "already
    saved", the first copy was deleted, and the failure was nowhere.)"""
    said = []
    book = CaseBook(tmp_path, say=lambda text, case: said.append(text))
    first, shrunk = make_case(5000, reproduce_blob=None), make_case()
    names = [cases.case_filename(shrunk).replace(".json", suffix)
             for suffix in (".json", "-2.json", "-3.json", "-4.json")]
    plants = [plant for plant, _ in list(FILES_IN_THE_WAY.values())[:4]]
    for name, plant in zip(names, plants):
        plant(tmp_path / name)
    assert book.found(0, first) is True
    assert book.shrunk(0, shrunk) == 0
    [entry] = book.entries
    saved = tmp_path / cases.case_filename(shrunk).replace(".json", "-5.json")
    assert entry["path"] == str(saved) and entry["new"] and entry["shrunk"]
    assert cases.case_identity(cases.load_case(saved)) == cases.case_identity(shrunk)
    assert not (tmp_path / cases.case_filename(first)).exists()
    assert [name in entry["name_taken"] for name in names] == [True] * 4
    [line] = said
    assert line.startswith(f"failure case saved as {saved}: {names[0]} holds no case")


def test_an_unshrunk_copy_stays_until_its_shrunk_case_is_on_the_disk(tmp_path):
    """The disk fills after the first failing example was saved: the shrunk
    case cannot be written (nor anywhere else), so the first copy stays on
    the disk beside the report's whole case; once the disk has room the
    shrunk case is written there, and only then the first copy goes."""
    with small_tmpfs(tmp_path / "disk") as disk:
        book = CaseBook(disk / "cases")
        first, shrunk = make_case(5000, reproduce_blob=None), make_case()
        book.found(0, first)
        first_copy = disk / "cases" / cases.case_filename(first)
        fill_to_the_last_byte(disk)
        assert book.shrunk(0, shrunk) == 0
        [entry] = book.entries
        assert entry["path"] is None and "No space left" in entry["not_written"]
        assert cases.Case.from_json(entry["case"]) == shrunk
        assert entry["unshrunk_kept"] == str(first_copy)
        assert cases.load_case(first_copy) == first
        (disk / "filler").unlink()
        book.retry_unwritten()
        [entry] = book.entries
        assert entry["path"] == str(disk / "cases" / cases.case_filename(shrunk))
        assert cases.load_case(entry["path"]) == shrunk
        assert not first_copy.exists() and "unshrunk_kept" not in entry


@pytest.mark.slow
def test_a_fuzz_run_keeps_its_finding_past_files_in_its_cases_name(tmp_path):
    """A real fuzz run on a mutant whose shrunk case's name, and the next
    three, hold an empty object, a dangling symlink, a Git LFS pointer and a
    merge conflict: the run saves the case under the fifth name, says so in
    its report, and leaves each of those files as it was; the case replays
    to the failure."""
    from test_fuzz import MUTANT_SPEC as FUZZ_MUTANT, lens_mutant as fuzz_mutant, make_config
    from test_fuzz import STANDIN_PROPERTIES as FUZZ_PROPERTIES
    from c128a.contract import padding_rows_of
    from c128a.runners import fuzz

    shrunk = cases.new_case(
        property="matches_reference", target=FUZZ_MUTANT, kind="failure", failure="",
        padding_rows=padding_rows_of(fuzz_mutant),
        batch=Batch(positions=(1000,), num_decode_tokens=1, token_to_req_indices=(0,),
                    block_table=(tuple(range(64)),), slot_mapping=(1000,), max_model_len=16384,
                    capacity=128, width=128, buffer_rows=1),
    )
    folder = tmp_path / "cases"
    folder.mkdir()
    names = [cases.case_filename(shrunk).replace(".json", suffix)
             for suffix in (".json", "-2.json", "-3.json", "-4.json")]
    for name, (plant, _) in zip(names, list(FILES_IN_THE_WAY.values())[:4]):
        plant(folder / name)
    before = [_snapshot(folder / name) for name in names]
    report = fuzz.run_fuzz(make_config(tmp_path, target=FUZZ_MUTANT, max_examples=300,
                                       exitfirst=True, db="none"))
    assert report["exit_status"] == 1, report
    [entry] = report["cases"]
    assert entry["path"] == str(folder / names[0].replace(".json", "-5.json")), entry
    assert entry["new"] and entry["shrunk"] and names[3] in entry["name_taken"], entry
    saved = cases.load_case(entry["path"])
    assert cases.case_identity(saved) == cases.case_identity(shrunk)
    assert [_snapshot(folder / name) for name in names] == before
    # The first failing example's copy went once the shrunk case was saved.
    assert sorted(cases.case_files(folder)) == sorted(
        [folder / name for name in names] + [Path(entry["path"])])
    outcome = cases.replay_case(saved, fuzz_mutant, "cpu", properties=FUZZ_PROPERTIES)
    assert outcome.verdict == cases.FAILS, outcome.report


# ---------------------------------------------------------------- a case larger than replay reads


@pytest.fixture
def small_case_limit(monkeypatch) -> int:
    """The one limit on a case's size, made 1 MiB: the writer and the reader
    both follow it (it is defined once)."""
    monkeypatch.setattr(store, "MAX_CASE_BYTES", 1 << 20)
    return 1 << 20


def test_a_case_with_a_huge_message_is_saved_in_a_form_replay_reads(tmp_path, small_case_limit):
    """A target's failure message larger than a case file may be: the case
    is saved with the message's middle cut (saying so), within the limit the
    reader reads, and replays to the failure. (Before: the file was written
    whole and `c128a replay` refused it as larger than it reads.)"""
    message = "x" * small_case_limit + "the end"
    case = make_case(failure=f"TargetRaised: {message}")
    path, new = cases.write_case(case, tmp_path)
    assert new and path.stat().st_size <= small_case_limit
    loaded = cases.load_case(path)
    assert loaded.batch == case.batch and cases.case_filename(loaded) == path.name
    assert loaded.failure.startswith("TargetRaised: xxx") and loaded.failure.endswith("the end")
    assert "characters cut here: the case would have been larger than MAX_CASE_BYTES" in (
        loaded.failure)
    outcome = cases.replay_case(loaded, lens_mutant, "cpu", properties=STANDIN_PROPERTIES)
    assert outcome.verdict == cases.FAILS
    # Found again: the same case, already saved.
    assert cases.write_case(case, tmp_path) == (path, False)


def test_a_case_no_form_of_which_fits_is_kept_whole_in_the_report(tmp_path, monkeypatch):
    """Where even the cut form is larger than the limit, the case is not
    written half: the run keeps it whole in its report entry and says why."""
    monkeypatch.setattr(store, "MAX_CASE_BYTES", 1000)
    book = CaseBook(tmp_path / "cases")
    case = make_case()
    book.found(0, case)
    [entry] = book.entries
    assert entry["path"] is None and "more than MAX_CASE_BYTES=1,000" in entry["not_written"]
    assert cases.Case.from_json(entry["case"]) == case
    assert list((tmp_path / "cases").glob("*.json")) == []
