"""Target specs: resolution order, loading, and the errors a user sees."""

import sys
import types

import pytest

from c128a.contract import policy
from c128a.failures import TargetSpecError, TargetUnavailable
from c128a.targets import DEFAULT_TARGET, TARGET_ENV, load_target, resolve_spec


def test_option_wins_over_environment(monkeypatch):
    monkeypatch.setenv(TARGET_ENV, "reference")
    assert resolve_spec("triton") == ("triton", "--c128a-target")


def test_environment_used_without_option(monkeypatch):
    monkeypatch.setenv(TARGET_ENV, "reference")
    assert resolve_spec(None) == ("reference", f"${TARGET_ENV}")


def test_default_without_option_or_environment(monkeypatch):
    monkeypatch.delenv(TARGET_ENV, raising=False)
    assert resolve_spec(None) == (DEFAULT_TARGET, "default")


def test_builtin_targets_load():
    for spec in ("triton", "reference"):
        target = load_target(spec)
        assert callable(target.build_c128a_topk_metadata)
        assert target.active_topk_width is policy.active_topk_width
        assert target.validates_input


def test_vllm_is_unavailable_not_an_error_when_not_installed():
    if "vllm" in sys.modules or _importable("vllm"):
        pytest.skip("vLLM is installed here; the unavailable path cannot be shown")
    with pytest.raises(TargetUnavailable, match="vllm"):
        load_target("vllm")


def _importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.fixture
def module_target(monkeypatch):
    """A throwaway importable module that follows the contract by delegation."""
    from c128a.contract import oracle as reference

    module = types.ModuleType("c128a_test_plugin_target")
    module.build_c128a_topk_metadata = reference.build_c128a_topk_metadata
    namespace = types.SimpleNamespace(
        build_c128a_topk_metadata=reference.build_c128a_topk_metadata,
        active_topk_width=lambda max_seq_len, ratio, capacity: capacity,
        validates_input=False,
    )
    module.impl = namespace
    module.not_callable = types.SimpleNamespace(build_c128a_topk_metadata=42)
    module.missing = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_module_spec_uses_module_itself_and_project_policy(module_target):
    target = load_target(module_target.__name__)
    assert target.build_c128a_topk_metadata is module_target.build_c128a_topk_metadata
    assert target.capacity_width is policy.capacity_width
    assert target.uses_project_policy


def test_module_attr_spec_takes_optional_policy_and_flags(module_target):
    target = load_target(f"{module_target.__name__}:impl")
    assert target.active_topk_width(100, 128, 640) == 640
    assert target.capacity_width is policy.capacity_width
    assert not target.validates_input
    assert not target.uses_project_policy


@pytest.mark.parametrize(
    "attr, message",
    [
        ("missing", "has no attribute 'build_c128a_topk_metadata'"),
        ("not_callable", "build_c128a_topk_metadata is not callable"),
        ("nope", "has no attribute 'nope'"),
    ],
)
def test_broken_specs_name_what_is_missing(module_target, attr, message):
    with pytest.raises(TargetSpecError, match=message):
        load_target(f"{module_target.__name__}:{attr}")


def test_unimportable_module_is_a_usage_error():
    with pytest.raises(TargetSpecError, match="cannot import module 'no_such_module_c128a'"):
        load_target("no_such_module_c128a:thing")
