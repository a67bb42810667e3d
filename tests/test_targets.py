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


# ---------------------------------------------------------------- a spec that names nothing


@pytest.mark.parametrize("value", ["", "   ", "\t"])
def test_an_empty_spec_is_refused_naming_where_it_came_from(monkeypatch, value):
    # Before: '' fell through to the default target, which then passed.
    monkeypatch.setenv(TARGET_ENV, "reference")
    with pytest.raises(TargetSpecError) as refused:
        resolve_spec(value)
    message = str(refused.value)
    assert message.startswith(f"--c128a-target={value!r} names no target") and "\n" not in message
    assert f"leave --c128a-target out to test the default, {DEFAULT_TARGET}" in message


def test_an_empty_target_variable_is_refused(monkeypatch):
    monkeypatch.setenv(TARGET_ENV, "")
    with pytest.raises(TargetSpecError, match=rf"^\${TARGET_ENV}='' names no target.* unset "
                                              rf"{TARGET_ENV} to test the default"):
        resolve_spec(None)


@pytest.mark.parametrize("subcommand, option", [("fuzz", "--target"), ("mutants", "--spec")])
def test_an_empty_spec_on_the_command_line_exits_2_in_one_line(
    tmp_path, capsys, monkeypatch, c128a_device, subcommand, option
):
    from test_bad_input_cli import command_for

    from c128a import cli
    from c128a.failures import EXIT_USAGE

    monkeypatch.delenv(TARGET_ENV, raising=False)
    status = cli.main([*command_for(subcommand, tmp_path, c128a_device), option, ""])
    captured = capsys.readouterr()
    assert status == EXIT_USAGE, captured
    [line] = captured.err.splitlines()
    assert f"{option}='' names no target" in line, line


# ---------------------------------------------------------------- declarations of the wrong type


def _kernel():
    """A plain function: not a @triton.jit one."""


WRONG_DECLARATIONS = [
    ("jit_functions", _kernel, "jit_functions = <function _kernel", "function",
     "a tuple or list, each item a @triton.jit function"),
    ("jit_functions", (_kernel,), "jit_functions[0] = <function _kernel", "function",
     "a @triton.jit function"),
    ("consumers", 7, "consumers = 7", "int", "a tuple or list, each item a "
     "c128a.step.consumer_inputs.Consumer"),
    ("consumers", ("global_topk",), "consumers[0] = 'global_topk'", "str",
     "a c128a.step.consumer_inputs.Consumer"),
    ("consumer_gaps", ["combine_swa"], "consumer_gaps = ['combine_swa']", "list",
     "a dict of consumer name -> why it is unavailable"),
    ("launchers", "my_launcher", "launchers = 'my_launcher'", "str", "a tuple or list"),
    ("launchers", (object(),), "launchers[0] = <object object", "object", "a keyed launcher"),
    ("validates_input", "no", "validates_input = 'no'", "str", "True or False"),
    ("full_width_decode_views", 1, "full_width_decode_views = 1", "int", "True or False"),
    ("padding_rows", 7, "padding_rows=7", "int", "the string 'slots' or 'inert'"),
    ("active_topk_width", 128, "active_topk_width is not callable (128", "int", "a function"),
    ("capacity_width", "640", "capacity_width is not callable ('640'", "str", "a function"),
    ("build_c128a_topk_metadata", 42, "build_c128a_topk_metadata is not callable (42", "int",
     "the builder"),
]


@pytest.mark.parametrize("name, value, shown, type_name, rule", WRONG_DECLARATIONS,
                         ids=[f"{w[0]}-{w[3]}" for w in WRONG_DECLARATIONS])
def test_a_declaration_of_the_wrong_type_is_refused_in_one_line(
    monkeypatch, name, value, shown, type_name, rule
):
    # Before: a TypeError traceback (jit_functions = my_kernel), or a value
    # taken for another (validates_input = "no" is true).
    from c128a.contract import oracle

    declared = {"build_c128a_topk_metadata": oracle.build_c128a_topk_metadata, name: value}
    module = types.ModuleType("c128a_test_wrong_declaration")
    vars(module).update(declared)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(TargetSpecError) as refused:
        load_target(module.__name__)
    message = str(refused.value)
    assert message.startswith(f"target {module.__name__!r}: {shown}"), message
    assert f"type {type_name}" in message and f"must be {rule}" in message, message
    assert "\n" not in message


def test_declarations_of_the_right_type_load():
    from c128a.step.consumer_inputs import ORACLE_CONSUMERS

    target = load_target_from({"consumers": list(ORACLE_CONSUMERS),
                               "consumer_gaps": {"combine_swa": "not in this release"},
                               "validates_input": False, "jit_functions": None})
    assert target.consumers == ORACLE_CONSUMERS and not target.validates_input
    assert target.consumer_gaps == (("combine_swa", "not in this release"),)
    assert target.jit_functions == ()


def load_target_from(declared: dict):
    from c128a.contract import oracle
    from c128a.targets import Target

    namespace = types.SimpleNamespace(build_c128a_topk_metadata=oracle.build_c128a_topk_metadata,
                                      **declared)
    return Target.from_object("namespace", namespace)


# ---------------------------------------------------------------- a module or build raising


class TargetsOwnStop(BaseException):
    """A class of a target's own, not an Exception."""


RAISING_MODULES = {
    "importorskip": ("import pytest\npytest.importorskip('no_such_module_c128a_test')\n",
                     "raised Skipped: could not import 'no_such_module_c128a_test'"),
    "generator-exit": ("raise GeneratorExit('closing')\n", "raised GeneratorExit: closing"),
    "own-class": ("class Stop(BaseException):\n    pass\nraise Stop('stopped')\n",
                  "raised Stop: stopped"),
    "system-exit": ("raise SystemExit(0)\n", "raised SystemExit: 0"),
}


@pytest.mark.parametrize("kind", RAISING_MODULES)
def test_a_module_raising_a_base_exception_at_import_does_not_load(tmp_path, monkeypatch, kind):
    # Before: the exception escaped (pytest: INTERNALERROR, exit 3; the CLI: a traceback).
    source, raised = RAISING_MODULES[kind]
    name = f"base_exception_{kind.replace('-', '_')}_c128a_test"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TargetSpecError) as refused:
        load_target(name)
    message = str(refused.value)
    assert f"importing module {name!r} {raised}" in message and "\n" not in message, message


@pytest.mark.parametrize("raised", [
    pytest.param(lambda: pytest.skip("needs CUDA: the target's own words"), id="skipped"),
    pytest.param(lambda: (_ for _ in ()).throw(GeneratorExit("closing")), id="generator-exit"),
    pytest.param(lambda: (_ for _ in ()).throw(TargetsOwnStop("stopped")), id="own-class"),
])
def test_a_build_raising_a_base_exception_is_the_targets_fault(c128a_device, raised):
    # Before: pytest's Skipped skipped the check; the others escaped the checks.
    from c128a.failures import TargetRaised
    from c128a.step import build
    from c128a.strategies import HISTORICAL_BATCHES

    def build_c128a_topk_metadata(*args):
        raised()

    target = load_target_from({})
    target = types.SimpleNamespace(build_c128a_topk_metadata=build_c128a_topk_metadata,
                                   spec=target.spec)
    batch = HISTORICAL_BATCHES["upstream_two_decode_two_prefill"]
    with pytest.raises(TargetRaised, match=r"^\[target_raised\] the target's "
                                           r"build_c128a_topk_metadata raised \w+"):
        build(target, batch, c128a_device)


def test_a_stop_of_the_run_passes_through_the_targets_code():
    """Ctrl-C, a process ending on purpose and c128a's own stops (a signal
    handler's or a timer's, raised while the target runs) are the runner's
    to handle, never the target's failure nor a bad spec."""
    from c128a.cli.replay import ReplayInterrupted
    from c128a.failures import call_target, is_runner_stop

    for stop in (KeyboardInterrupt(), SystemExit(3), ReplayInterrupted(2)):
        def raising(stop=stop):
            raise stop

        with pytest.raises(type(stop)):
            call_target("target_raised", "build_c128a_topk_metadata", raising)
    assert is_runner_stop(ReplayInterrupted(2)) and is_runner_stop(KeyboardInterrupt())
    assert not is_runner_stop(TargetsOwnStop()) and not is_runner_stop(SystemExit(0))
    assert not is_runner_stop(GeneratorExit()) and not is_runner_stop(RuntimeError("c128a"))


# ---------------------------------------------------------------- what a build returns


@pytest.mark.parametrize("returned, words", [
    pytest.param(lambda views: None, "returned NoneType None, not the three views", id="none"),
    pytest.param(lambda views: [v.tolist() for v in views],
                 "returned global_decode as a list ([", id="lists"),
    pytest.param(lambda views: (None, None, None), "returned global_decode as a NoneType",
                 id="nones"),
    pytest.param(lambda views: tuple(v.long() for v in views),
                 "returned global_decode with dtype torch.int64, expected int32", id="int64"),
])
def test_every_check_meets_what_a_build_returns_as_the_views_violation(
    c128a_device, returned, words
):
    # Before: checks read a list or None as tensors (AttributeError inside the
    # suite's own code: its fault, not the target's).
    from c128a.checks import PROPERTIES
    from c128a.contract import oracle
    from c128a.failures import ContractViolation, InvariantViolation
    from c128a.strategies import HISTORICAL_BATCHES

    target = load_target_from({})
    target = types.SimpleNamespace(
        spec="returns-no-views", active_topk_width=target.active_topk_width,
        capacity_width=target.capacity_width,
        build_c128a_topk_metadata=lambda *args: returned(oracle.build_c128a_topk_metadata(*args)))
    batch = HISTORICAL_BATCHES["upstream_two_decode_two_prefill"]
    met = {}
    for name, prop in PROPERTIES.items():
        # The policy alone; bad input alone; no keyed launcher, so the oracle builds.
        if name in ("width_policy", "rejects_bad_input", "compile_keys"):
            continue
        with pytest.raises(ContractViolation) as raised:
            prop.replay(target, batch, c128a_device)
        met[name] = raised.value
    assert all(isinstance(exc, InvariantViolation) and exc.invariant == "views"
               and words in str(exc) for exc in met.values()), met
