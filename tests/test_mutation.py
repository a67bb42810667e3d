"""Mutation testing's machinery (``c128a mutate``), on a tiny subject.

The mutator on small sources; the known-mutants file; the verdict's rules;
then real runs of ``tests/mutation_subject.py`` (nine mutants of one small
kernel-like function, torch only): each mutant in a child process, one
that crashes the interpreter, one that hangs, one that survives, one that
is equivalent, the rest killed; a subject that fails its own control; and
a run stopped by SIGTERM. The measurement of the project's kernels is not
here (README, "Mutation testing of the kernels").
"""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import pytest

from c128a.cli import main
from c128a.failures import HarnessError, UsageError
from c128a.runners.mutation import (
    DEFAULT_KNOWN,
    KERNEL_SUBJECTS,
    KINDS,
    MutationConfig,
    MutationRun,
    Result,
    Verdict,
    mutants_of,
    read_known,
)
from c128a.runners.mutation.known import KnownMutant
from c128a.runners.mutation.report import CRASHED, ERROR, KILLED, NOT_RUN, SURVIVED, TIMED_OUT
from helpers import (
    TESTS, assert_all_ended, descendants, importable_here_and_in_children, needs_proc, wait_until,
)

SUBJECT = "mutation_subject:SUBJECT"
CRASHES, KEEPS_START, TOO_FEW_SWEEPS, NO_SWEEP, SWEEPS_BACK = (
    "tiny-2728c57c", "tiny-2d013482", "tiny-0d57ced9", "tiny-e7b7f614", "tiny-e1aae901")
ONE_MORE_SWEEP, HANGS, UNREACHED, ZEROES = (
    "tiny-b9317e3c", "tiny-eea7f010", "tiny-686df551", "tiny-90fa66a6")
EXPECTED = {
    CRASHES: CRASHED, KEEPS_START: KILLED, TOO_FEW_SWEEPS: KILLED, NO_SWEEP: KILLED,
    SWEEPS_BACK: KILLED, ONE_MORE_SWEEP: SURVIVED, HANGS: TIMED_OUT, UNREACHED: SURVIVED,
    ZEROES: KILLED,
}
EXAMPLES = 10

KERNEL = '''
import triton


def host(x):
    return x + 1


@triton.jit(do_not_specialize=("n",))
def kernel(ptr, n, flag, BLOCK: tl.constexpr):
    """Not mutated: a docstring."""
    offsets = tl.arange(0, BLOCK)
    mask = (offsets < n) & (offsets >= 0)
    values = tl.load(ptr + offsets, mask=mask, other=0)
    shifted = tl.load(
        ptr + offsets + 1, mask=mask, other=0,
    )
    if flag:
        values = tl.minimum(values, -1)
    tl.store(ptr + offsets, tl.where(values == 0, 1, values), mask=mask)
'''


@pytest.fixture
def tiny_subject(monkeypatch):
    importable_here_and_in_children(TESTS, monkeypatch)


def known_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "known.txt"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the mutator


def test_mutants_change_one_expression_of_a_kernel_each():
    mutants = mutants_of(KERNEL, "k")
    changes = {(m.kind, m.mutation) for m in mutants}
    assert {
        ("operator", "ptr + offsets -> ptr - offsets"),
        ("operator", "tl.minimum(values, -1) -> tl.maximum(values, -1)"),
        ("comparison", "offsets < n -> offsets <= n"),
        ("comparison", "offsets < n -> offsets >= n"),
        ("comparison", "values == 0 -> values != 0"),
        ("constant", "-1 -> 0"),
        ("constant", "-1 -> -2"),
        ("mask", "mask -> None"),
        # other= goes with the mask: Triton does not compile one without the other.
        ("mask", "tl.load(ptr + offsets, mask=mask, other=0) -> tl.load(ptr + offsets)"),
        ("mask", "tl.load(ptr + offsets + 1, mask=mask, other=0) -> tl.load(ptr + offsets + 1)"),
        ("mask", "(offsets < n) & (offsets >= 0) -> offsets < n"),
        ("mask", "tl.where(values == 0, 1, values) -> values"),
        ("condition", "flag -> not flag"),
    } <= changes
    assert {m.kind for m in mutants} == set(KINDS)
    assert all(m.function == "kernel" for m in mutants)  # not the host code
    docstring = KERNEL.splitlines().index('    """Not mutated: a docstring."""') + 1
    assert not any(m.line == docstring for m in mutants)
    assert not any("BLOCK" in m.original and m.kind == "constant" for m in mutants)
    for mutant in mutants:  # one expression changed, every line where it was
        assert mutant.source != KERNEL
        assert mutant.source.count("\n") == KERNEL.count("\n")
        assert mutant.source.splitlines()[mutant.line - 1] != KERNEL.splitlines()[mutant.line - 1]
    assert len({m.id for m in mutants}) == len(mutants) == len({m.source for m in mutants})
    assert not any("other=" in m.replacement and "mask" not in m.replacement for m in mutants)


def test_an_edit_elsewhere_keeps_every_mutants_id():
    before = mutants_of(KERNEL, "k")
    edited = KERNEL.replace("    offsets = tl.arange", "    extra = n * 2\n    offsets = tl.arange")
    after = {m.id: m for m in mutants_of(edited, "k")}
    for mutant in before:
        assert after[mutant.id].mutation == mutant.mutation
        assert after[mutant.id].line == mutant.line + 1


def test_the_project_kernels_have_mutants_of_every_kind():
    for name, subject in KERNEL_SUBJECTS.items():
        mutants = mutants_of(subject.path().read_text(), name)
        assert {m.kind for m in mutants} >= {"operator", "comparison", "constant", "mask"}, name
        assert len({m.id for m in mutants}) == len(mutants)
    # Every id the project's list names is a mutant the kernels have.
    everything = {m.id for name, s in KERNEL_SUBJECTS.items()
                  for m in mutants_of(s.path().read_text(), name)}
    assert set(read_known(DEFAULT_KNOWN)) <= everything


# ---------------------------------------------------------------- the list and the verdict


def test_known_file_lines_are_checked(tmp_path):
    good = known_file(tmp_path, "# a comment\n\ntiny-b9317e3c equivalent: one more empty sweep\n"
                                "tiny-686df551 survives: no step has a million tokens\n")
    known = read_known(good)
    assert known["tiny-b9317e3c"].kind == "equivalent"
    assert known["tiny-686df551"].reason == "no step has a million tokens"
    for text, says in (
        ("tiny-b9317e3c equivalent\n", "is not 'ID KIND: reason'"),
        ("tiny-b9317e3c equivalent:   \n", "is not 'ID KIND: reason'"),
        ("tiny-b9317e3c killed: no\n", "kind='killed' is not one of equivalent, survives"),
        ("tiny-b9317e3c survives: a\ntiny-b9317e3c survives: b\n", "listed already on line 1"),
    ):
        with pytest.raises(UsageError, match=f"known.txt:[12]: .*{says}"):
            read_known(known_file(tmp_path, text))
    with pytest.raises(UsageError, match="no such file"):
        read_known(tmp_path / "missing.txt")


def _verdict(statuses: dict[str, str], known: dict[str, str], generated=None) -> Verdict:
    mutants = {m.id: m for m in mutants_of((TESTS / "mutation_subject.py").read_text(), "tiny",
                                           ("mutable",))}
    results = [Result(mutants[i], status=s, run="tiny", property="matches_oracle")
               for i, s in statuses.items()]
    entries = {i: KnownMutant(i, kind, "why", n) for n, (i, kind) in enumerate(known.items(), 1)}
    return Verdict(results, entries, set(mutants) if generated is None else generated)


def test_the_score_leaves_out_equivalents_and_counts_hangs_and_crashes():
    verdict = _verdict(EXPECTED, {ONE_MORE_SWEEP: "equivalent", UNREACHED: "survives"})
    counts = verdict.counts()
    assert (counts["detected"], counts["equivalent"], counts["survived"]) == (7, 1, 1)
    assert verdict.score() == 7 / 8
    assert verdict.problems() == [] and verdict.exit_status() == 0


def test_the_verdict_is_strict():
    # A survivor nobody listed, a listed equivalent that is killed, a listed
    # mutant the subject no longer has, a fault of the suite, mutants not run.
    verdict = _verdict(
        {**EXPECTED, ZEROES: KILLED, NO_SWEEP: NOT_RUN},
        {ZEROES: "equivalent", "tiny-00000000": "survives"},
    )
    problems = "\n".join(verdict.problems())
    assert f"{ONE_MORE_SWEEP} survived, and is not listed" in problems
    assert f"{ZEROES} is listed as equivalent (line 1) but was killed" in problems
    assert "tiny-00000000 is listed as survives (line 2) but no subject has it" in problems
    assert "1 mutants did not run" in problems
    assert verdict.exit_status() == 1
    assert _verdict({**EXPECTED, UNREACHED: ERROR}, {ONE_MORE_SWEEP: "equivalent"}).exit_status() == 2
    # A listed mutant that times out is what the list says (slow, not wrong);
    # one that crashes contradicts it.
    slow = _verdict(EXPECTED, {HANGS: "equivalent", ONE_MORE_SWEEP: "equivalent",
                               UNREACHED: "survives"})
    assert (slow.counts()["detected"], slow.counts()["equivalent"], slow.score()) == (6, 2, 6 / 7)
    assert slow.problems() == []
    crashed = _verdict(EXPECTED, {CRASHES: "survives", ONE_MORE_SWEEP: "equivalent",
                                  UNREACHED: "survives"})
    assert crashed.problems() == [f"{CRASHES} is listed as survives (line 1) but crashed "
                                  f"({crashed.results[0].detail}): remove it from the list"]
    # Another subject's entry is not judged by a run of this one.
    other = _verdict(EXPECTED, {ONE_MORE_SWEEP: "equivalent", UNREACHED: "survives",
                                "adaptive-00000000": "equivalent"})
    assert other.stale() and not dataclasses.replace(other, subjects={"tiny"}).stale()


# ---------------------------------------------------------------- real runs


@pytest.mark.slow  # real children, one a mutant, and a hang that lasts its time limit
def test_each_mutant_is_judged_in_a_child_of_its_own(tiny_subject, tmp_path):
    """Crashed, timed out, survived, equivalent and killed, each as it is."""
    known = known_file(tmp_path, f"{ONE_MORE_SWEEP} equivalent: one more sweep over no token\n"
                                 f"{KEEPS_START} equivalent: listed wrongly, to be caught\n")
    lines = []
    run = MutationRun(MutationConfig(
        subjects=(SUBJECT,), known=known, workers=2, factor=4, min_limit_s=4,
        max_examples=EXAMPLES, say=lines.append,
    ))
    verdict, header = run.run()
    statuses = {r.mutant.id: r.status for r in verdict.results}
    assert statuses == EXPECTED, "\n".join(lines)
    assert len(lines) == 1 + len(EXPECTED)  # the control, then a line a mutant
    assert lines[0].startswith("control tiny: every property passed")
    by_id = {r.mutant.id: r for r in verdict.results}
    assert "(killed by SIGABRT) during matches_oracle on tiny" in by_id[CRASHES].detail
    assert (by_id[HANGS].property, by_id[HANGS].run) == ("matches_oracle", "tiny")
    assert by_id[ZEROES].property == "matches_oracle" and "decode_lens" in by_id[ZEROES].detail
    assert verdict.score() == 7 / 8
    problems = "\n".join(verdict.problems())
    assert f"{UNREACHED} survived, and is not listed" in problems
    assert f"{KEEPS_START} is listed as equivalent (line 2) but was killed" in problems
    assert verdict.exit_status() == 1
    assert header["control_s"]["tiny"]["tiny"]["matches_oracle"] > 0


def test_a_subject_that_fails_its_own_control_ends_the_run(tiny_subject):
    run = MutationRun(MutationConfig(subjects=("mutation_subject:HELD_TO_INERT",), known=None,
                                     max_examples=EXAMPLES, say=lambda line: None))
    with pytest.raises(HarnessError, match="the unmutated tiny .* fails its own control: "
                                           "matches_oracle on tiny held to inert: killed"):
        run.run()


def test_usage_errors_are_one_line(tiny_subject, tmp_path, capsys):
    for args, says in (
        (["--subject", "nope"], "--subject 'nope' is neither one of adaptive, baseline"),
        (["--subject", SUBJECT, "--mutant", "tiny-00000000"], "--mutant tiny-00000000: no such"),
        (["--subject", SUBJECT, "--known", str(known_file(tmp_path, "x\n"))], "is not 'ID KIND"),
        (["--subject", SUBJECT, "--sample", "0"], "--sample=0 must be >= 1"),
        (["--subject", SUBJECT, "--timeout", "0"], "--timeout=0.0 must be > 0"),
    ):
        assert main(["mutate", *args]) == 2
        error = capsys.readouterr().err
        assert says in error and error.count("\n") == 1, error


@pytest.mark.slow  # a real c128a process, which imports torch
@needs_proc
def test_a_signal_stops_the_run_and_its_children(tiny_subject, cli_process, tmp_path):
    output = tmp_path / "report"
    process = cli_process("mutate", "--subject", SUBJECT, "--mutant", HANGS, "--timeout", "300",
                          "--max-examples", EXAMPLES, "--output", output, path=(TESTS,))
    process.wait_for_error("control tiny: every property passed", 120)
    children = wait_until(lambda: descendants(process.pid), 30, "a child judging the mutant")
    process.process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 128 + signal.SIGTERM
    assert_all_ended(children, what="children of the stopped run still running")
    report = json.loads((output / "mutation-report.json").read_text())
    assert [m["status"] for m in report["mutants"]] == [NOT_RUN]
    assert "1 mutants did not run (interrupted by SIGTERM)" in report["problems"]


def test_a_cuda_fault_of_a_mutant_is_its_crash(c128a_device):
    """torch raises AcceleratorError at the next synchronisation after a
    kernel faulted, with the context lost: for a mutant, a crash of its
    kernel (the child exits, the parent counts it crashed), as a segfault is
    on the CPU. The kill matrix's outcome says which errors are CUDA faults
    (raised, or the cause of what was raised); other errors stay faults of
    the suite."""
    import torch

    from c128a.checks import PROPERTIES, Property
    from c128a.runners.killmatrix import ci_settings, run_property
    from c128a.targets import load_target

    def raising(exc):
        def check(target, batch, device):
            raise exc
        return Property("raising", PROPERTIES["views"].strategy, check)

    def wrapped(target, batch, device):
        try:
            raise RuntimeError("CUDA error: device-side assert triggered")
        except RuntimeError as exc:
            raise HarnessError("the oracle's gather failed") from exc

    target = load_target("reference")
    faults = [
        raising(torch.AcceleratorError("CUDA error: an illegal memory access was encountered")),
        raising(RuntimeError("CUDA error: device-side assert triggered")),
        Property("wrapped", PROPERTIES["views"].strategy, wrapped),
    ]
    others = [raising(HarnessError("the harness's own invariant broke")),
              raising(AssertionError("expected no CUDA error"))]
    for prop in faults + others:
        outcome = run_property(prop, target, c128a_device, ci_settings(1))
        assert outcome.errored and not outcome.killed, (prop.name, outcome)
        assert outcome.cuda_fault == (prop in faults), (prop.name, outcome)
