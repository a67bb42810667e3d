"""Proof that the suite can fail: every mutant is killed, correct targets survive.

Runs the properties of :data:`c128a.checks.PROPERTIES` through the kill
matrix (the ``ci`` profile: derandomized, so the same examples every run),
with :data:`MATRIX_EXAMPLES` generated examples per (target, property) pair
after the contract's historical batches. Each project mutant must be killed
by every property it names; each independently written mutant
(``tests/independent``) by at least one; the project's targets and the
independent correct target must survive every property. Only a contract
violation is a kill: a fault of the suite itself shows as an error.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from c128a.checks import PROPERTIES, Property
from c128a.failures import HarnessError
from c128a.mutants import MUTANTS
from c128a.runners.killmatrix import first_kill, kill_matrix, markdown_table
from c128a.targets import Target, load_target

MATRIX_EXAMPLES = 10
"""Generated examples a row gets, unless a mutant declares more (a fault in
a rare pair cell, :func:`~c128a.runners.killmatrix.examples_for`)."""
INDEPENDENT = Path(__file__).parent / "independent"
INDEPENDENT_MISSING = f"{INDEPENDENT} is missing: no independently written targets to run"


def _independent_modules():
    """(independent_mutants, independent_c128a), or None when the folder is missing."""
    if not (INDEPENDENT / "independent_mutants.py").is_file():
        return None
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(INDEPENDENT))
        return (
            importlib.import_module("independent_mutants"),
            importlib.import_module("independent_c128a"),
        )


INDEPENDENT_MODULES = _independent_modules()
INDEPENDENT_NAMES = sorted(INDEPENDENT_MODULES[0].MUTANTS) if INDEPENDENT_MODULES else []


def outcomes(target, device, names):
    """{property name: Outcome} of ``target`` under the matrix settings."""
    properties = {name: PROPERTIES[name] for name in names}
    return kill_matrix([target], device, properties, MATRIX_EXAMPLES)[str(target.spec)]


def survivors(target, device, names):
    return sorted(name for name, o in outcomes(target, device, names).items() if not o.killed)


def kills(target, device, names):
    """Properties a target fails, by a contract violation or by any other error."""
    return {
        name: o.message
        for name, o in outcomes(target, device, names).items()
        if o.killed or o.errored
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MUTANTS))
def test_project_mutant_is_killed_by_its_invariants(c128a_device, name):
    mutant = MUTANTS[name]
    survived = survivors(load_target(mutant.spec), c128a_device, mutant.killed_by)
    assert not survived, f"mutant {name} ({mutant.description}) survived {survived}"


@pytest.mark.slow
@pytest.mark.parametrize("property_name", list(PROPERTIES))
# triton, the default target, runs every property in this session's
# conformance suite (c128a/conformance), with more examples than the matrix.
@pytest.mark.parametrize("spec", ["reference", "triton-inert", "reference-inert"])
def test_correct_target_survives(c128a_device, spec, property_name):
    killed = kills(load_target(spec), c128a_device, [property_name])
    assert not killed, f"correct target {spec} was killed: {killed}"


def test_every_bug_class_and_invariant_has_a_mutant():
    assert len(MUTANTS) >= 10
    targeted = {name for mutant in MUTANTS.values() for name in mutant.killed_by}
    assert targeted == set(PROPERTIES), set(PROPERTIES) - targeted
    assert all(mutant.bug_class and mutant.description for mutant in MUTANTS.values())
    for name in ("packed_stride", "spill_past_width"):
        assert callable(load_target(f"c128a.mutants:{name}").build_c128a_topk_metadata)


def test_a_fault_of_the_harness_is_an_error_not_a_kill(c128a_device):
    """A harness assert deliberately triggered: the cell says error, not killed."""

    def broken_check(target, batch, device):
        raise HarnessError("the harness's own invariant broke (deliberately)")

    def plain_assert(target, batch, device):
        assert batch.num_tokens < 0, "a bare assert in a check is not a contract violation"

    properties = {
        "harness_fault": Property("harness_fault", PROPERTIES["views"].strategy, broken_check),
        "bare_assert": Property("bare_assert", PROPERTIES["views"].strategy, plain_assert),
    }
    target = load_target("c128a.mutants:packed_stride")
    row = kill_matrix([target], c128a_device, properties, 2)[target.spec]
    for name, outcome in row.items():
        assert outcome.errored and not outcome.killed, (name, outcome)
        assert outcome.cell().startswith("error ("), outcome.cell()
    assert "error (HarnessError)" in markdown_table({target.spec: row})


@pytest.mark.slow
@pytest.mark.skipif(INDEPENDENT_MODULES is None, reason=INDEPENDENT_MISSING)
@pytest.mark.parametrize("name", INDEPENDENT_NAMES)
def test_independent_mutant_is_killed(c128a_device, monkeypatch, name):
    monkeypatch.syspath_prepend(str(INDEPENDENT))
    target = Target.from_object(f"independent_mutants:{name}", INDEPENDENT_MODULES[0].MUTANTS[name])
    assert first_kill(target, c128a_device, max_examples=MATRIX_EXAMPLES) is not None, (
        f"independent mutant {name} survived every property"
    )


@pytest.mark.slow
@pytest.mark.skipif(INDEPENDENT_MODULES is None, reason=INDEPENDENT_MISSING)
@pytest.mark.parametrize("property_name", list(PROPERTIES))
def test_independent_correct_target_survives(c128a_device, monkeypatch, property_name):
    monkeypatch.syspath_prepend(str(INDEPENDENT))
    target = Target.from_object("independent_c128a", INDEPENDENT_MODULES[1])
    killed = kills(target, c128a_device, [property_name])
    assert not killed, f"independent_c128a was killed: {killed}"
