"""The pipeline checks can fail (marker ``consumers``): the consumer mutants
are killed and the project's targets survive; a wheel without a consumer
loads with that consumer named as missing. The checks themselves run on the
selected target in ``c128a/conformance/`` (``test_properties.py``,
``test_consumers.py``).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from c128a.checks import PROPERTIES
from c128a.checks.consumers import consumers_of
from c128a.mutants import MUTANTS
from c128a.runners.killmatrix import kill_matrix
from c128a.step.consumer_inputs import CONSUMER_NAMES
from c128a.targets import load_target
from c128a.targets.vllm_release import cache_folder, cached_wheel

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


# triton, the default target, runs both properties in this session's
# conformance suite (c128a/conformance), with more examples than the matrix.
@pytest.mark.parametrize("spec", ["reference-inert"])
def test_correct_target_survives(c128a_device, spec):
    for prop, outcome in _outcomes(load_target(spec), c128a_device, PIPELINE).items():
        assert not outcome.killed and not outcome.errored, (prop, outcome.message)


def test_there_is_a_mutant_of_each_kind():
    kinds = {MUTANTS[name].bug_class for name in CONSUMER_MUTANTS}
    assert {"packed stride", "padding tokens"} <= kinds, kinds


CACHE_UTILS = "vllm/models/deepseek_v4/common/ops/cache_utils.py"
RELEASE_FOLDER = cache_folder("0.34.0")  # read before a test's vllm_cache moves $C128A_CACHE


def _edited_wheel(tmp_path, edit) -> Path:
    """A copy of the cached 0.34.0 wheel holding its DeepSeek-V4 sources,
    each passed through ``edit(member, data)`` (None: left out)."""
    source = cached_wheel(RELEASE_FOLDER, "0.34.0")
    if source is None:
        pytest.skip(f"no cached vLLM 0.34.0 wheel under {RELEASE_FOLDER}")
    wheel = tmp_path / "wheels" / source.name
    wheel.parent.mkdir()
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(wheel, "w") as new:
        for member in old.namelist():
            if member.startswith("vllm/models/deepseek_v4/") and member.endswith(".py"):
                data = edit(member, old.read(member))
                if data is not None:
                    new.writestr(member, data)
    return wheel


def test_a_consumer_missing_from_a_release_is_named(tmp_path, vllm_cache):
    """A wheel whose cache_utils.py lacks combine_topk_swa_indices: the
    target loads, the other consumers with it, and the gap names the function."""
    def rename_combine(member, data):
        if member != CACHE_UTILS:
            return data
        return data.replace(b"def combine_topk_swa_indices(",
                            b"def renamed_combine_topk_swa_indices(")

    target = load_target(f"vllm-release:{_edited_wheel(tmp_path, rename_combine)}")
    gaps = dict(target.consumer_gaps)
    assert set(gaps) == {"combine_swa"}, gaps
    assert "combine_topk_swa_indices" in gaps["combine_swa"]
    assert [c.name for c in target.consumers] == ["global_topk", "mixed_sparse",
                                                  "short_context_fill"]


def test_a_release_without_the_consumers_file_names_each(tmp_path, vllm_cache):
    """A wheel with no cache_utils.py: its three consumers are named as
    missing, with the file, and a second load finds the cache current."""
    wheel = _edited_wheel(tmp_path, lambda member, data: None if member == CACHE_UTILS else data)
    for _ in range(2):
        gaps = dict(load_target(f"vllm-release:{wheel}").consumer_gaps)
        assert set(gaps) == {"global_topk", "mixed_sparse", "combine_swa"}, gaps
        assert all(CACHE_UTILS in reason and "not in" in reason for reason in gaps.values()), gaps


def test_the_project_targets_have_the_oracle_consumers():
    assert [c.name for c in consumers_of(load_target("triton"))] == list(CONSUMER_NAMES)


@pytest.mark.parametrize("block_size", [1, 2, 4096, 8192])
def test_consumer_block_tables_keep_slot_ids_within_32_bits(block_size):
    """The consumers' block tables hold page numbers whose slot ids (page x
    B + offset) fit int32 at any B up to C = 8,192: at B = 8,192 they once
    overflowed, and the oracle's consumer published a negative slot id that
    vLLM's `mixed_sparse` did not (found on the H200, gpu profile)."""
    from c128a.step.consumer_inputs import _table

    pages = _table(64, 300, salt=11, block_size=block_size).to(torch.int64)
    assert int(pages.min()) >= 1
    assert int(pages.max()) * block_size + block_size - 1 < 2**31
