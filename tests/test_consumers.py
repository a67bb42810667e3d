"""The pipeline checks can fail (marker ``consumers``): the consumer mutants
are killed and the project's targets survive; a wheel without a consumer
loads with that consumer named as missing. The checks themselves run on the
selected target in ``c128a/conformance/`` (``test_properties.py``,
``test_consumers.py``).
"""

from __future__ import annotations

import zipfile

import pytest

from c128a.checks import PROPERTIES
from c128a.checks.consumers import consumers_of
from c128a.mutants import MUTANTS
from c128a.runners.killmatrix import kill_matrix
from c128a.step.consumers import CONSUMER_NAMES
from c128a.targets import load_target

pytestmark = pytest.mark.consumers

CONSUMER_MUTANTS = [name for name, m in MUTANTS.items() if "consumers" in m.killed_by]
MATRIX_EXAMPLES = 10


PIPELINE = ("consumers", "consumers_replay")


def _outcomes(target, device, names):
    properties = {name: PROPERTIES[name] for name in names}
    return kill_matrix([target], device, properties, MATRIX_EXAMPLES)[str(target.spec)]


@pytest.mark.parametrize("name", CONSUMER_MUTANTS)
def test_consumer_mutant_is_killed(c128a_device, name):
    mutant = MUTANTS[name]
    for prop, outcome in _outcomes(load_target(mutant.spec), c128a_device,
                                   mutant.killed_by).items():
        assert outcome.killed, f"mutant {name} ({mutant.description}) survived {prop}: {outcome.cell()}"


@pytest.mark.parametrize("spec", ["triton", "reference-inert"])
def test_correct_target_survives(c128a_device, spec):
    for prop, outcome in _outcomes(load_target(spec), c128a_device, PIPELINE).items():
        assert not outcome.killed and not outcome.errored, (prop, outcome.message)


def test_there_is_a_mutant_of_each_kind():
    kinds = {MUTANTS[name].bug_class for name in CONSUMER_MUTANTS}
    assert {"packed stride", "padding tokens"} <= kinds, kinds


def test_a_consumer_missing_from_a_release_is_named(tmp_path, monkeypatch):
    """A wheel whose cache_utils.py lacks combine_topk_swa_indices: the
    target loads, the other consumers with it, and the gap names the function."""
    source = _cached_wheel("0.34.0")
    wheel = tmp_path / "wheels" / source.name
    wheel.parent.mkdir()
    member = "vllm/models/deepseek_v4/common/ops/cache_utils.py"
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(wheel, "w") as new:
        for item in old.infolist():
            if item.filename.startswith("vllm/models/deepseek_v4/") and item.filename.endswith(".py"):
                data = old.read(item.filename)
                if item.filename == member:
                    data = data.replace(b"def combine_topk_swa_indices(",
                                        b"def renamed_combine_topk_swa_indices(")
                new.writestr(item.filename, data)
    monkeypatch.setenv("C128A_CACHE", str(tmp_path / "cache"))
    target = load_target(f"vllm-release:{wheel}")
    gaps = dict(target.consumer_gaps)
    assert set(gaps) == {"combine_swa"}, gaps
    assert "combine_topk_swa_indices" in gaps["combine_swa"]
    assert [c.name for c in target.consumers] == ["global_topk", "mixed_sparse",
                                                  "short_context_fill"]


def test_a_release_without_the_consumers_file_names_each(tmp_path, monkeypatch):
    """A wheel with no cache_utils.py: its three consumers are named as
    missing, with the file, and a second load finds the cache current."""
    source = _cached_wheel("0.34.0")
    wheel = tmp_path / "wheels" / source.name
    wheel.parent.mkdir()
    member = "vllm/models/deepseek_v4/common/ops/cache_utils.py"
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(wheel, "w") as new:
        for name in old.namelist():
            if name.startswith("vllm/models/deepseek_v4/") and name.endswith(".py") \
                    and name != member:
                new.writestr(name, old.read(name))
    monkeypatch.setenv("C128A_CACHE", str(tmp_path / "cache"))
    for _ in range(2):
        gaps = dict(load_target(f"vllm-release:{wheel}").consumer_gaps)
        assert set(gaps) == {"global_topk", "mixed_sparse", "combine_swa"}, gaps
        assert all(member in reason and "not in" in reason for reason in gaps.values()), gaps


def _cached_wheel(version: str):
    from c128a.targets.vllm_release import cache_folder

    wheels = sorted(cache_folder(version).glob(f"vllm-{version}-*.whl"))
    if not wheels:
        pytest.skip(f"no cached vLLM {version} wheel under {cache_folder(version)}")
    return wheels[0]


def test_the_project_targets_have_the_oracle_consumers():
    assert [c.name for c in consumers_of(load_target("triton"))] == list(CONSUMER_NAMES)
