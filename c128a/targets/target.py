"""A target: the implementation under test, and what it declares about itself."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from ..contract import BUILD_FUNCTION, DEFAULT_PADDING_ROWS, BuildArgs, check_padding_rows, policy
from ..failures import TargetSpecError, is_runner_stop, one_line

OPTIONAL_POLICY = ("active_topk_width", "capacity_width")
DECLARED_FIXED_WIDTH = "declared by the target"


@dataclass(frozen=True)
class Target:
    """The builder under test, its width policy (the project's where it brings
    none), and its declarations: ``validates_input`` (bad input raises
    ``ValueError``), ``full_width_decode_views`` (decode views at W = C,
    contiguous), ``padding_rows`` (what a padding token's decode row holds:
    ``slots`` or ``inert``, :mod:`c128a.contract.padding_rows`),
    ``jit_functions`` (its Triton JIT functions, where it names them: for
    counting compiled variants), ``consumers`` (the kernels an engine runs
    on its views, :class:`~c128a.step.consumer_inputs.Consumer`; none: the
    oracle's, :data:`~c128a.step.consumer_inputs.ORACLE_CONSUMERS`),
    ``consumer_gaps`` ((consumer, why it is unavailable) for each one of
    the target's source lacks), ``launchers`` (its builder's keyed
    launchers, :mod:`c128a.kernels.launch_keys`, for the compile-key check)
    and ``fixed_width`` (its engine calls it at W = C only, on buffers of C
    columns: its policy is :func:`~c128a.contract.policy.capacity_only`,
    and every check draws W = C; ``fixed_width_origin`` says who said so)."""

    spec: str
    build_c128a_topk_metadata: Callable
    active_topk_width: Callable[..., int] = policy.active_topk_width
    capacity_width: Callable[[int, int], int] = policy.capacity_width
    validates_input: bool = True
    full_width_decode_views: bool = False
    uses_project_policy: bool = True
    jit_functions: tuple = ()
    padding_rows: str = DEFAULT_PADDING_ROWS
    consumers: tuple = ()
    consumer_gaps: tuple = ()
    launchers: tuple = ()
    fixed_width: bool = False
    fixed_width_origin: str = ""

    def __post_init__(self) -> None:
        # Every way to a Target (from_object, its overrides, dataclasses.replace) passes here.
        check_padding_rows(self.padding_rows, f"target {self.spec!r}")

    def __str__(self) -> str:
        return self.spec

    @classmethod
    def from_object(cls, spec: str, obj, **overrides) -> "Target":
        """The target ``obj`` describes (a module, a class instance, a
        namespace): its ``build_c128a_topk_metadata`` and the optional
        attributes; ``overrides`` replace what ``obj`` declares. The one
        constructor every loader uses."""
        build = _attribute(obj, BUILD_FUNCTION, spec)
        if build is None:
            raise TargetSpecError(f"target {spec!r} ({obj!r}) has no attribute {BUILD_FUNCTION!r}")
        if not callable(build):
            raise TargetSpecError(
                f"target {spec!r}: {BUILD_FUNCTION} is not callable ({build!r}, type "
                f"{type(build).__name__}); it must be the builder, in vLLM's signature")
        mismatch = signature_mismatch(build)
        if mismatch is not None:
            raise TargetSpecError(f"target {spec!r}: {mismatch}")
        own_policy = {}
        for name in OPTIONAL_POLICY:
            value = _attribute(obj, name, spec)
            if value is not None and not callable(value):
                raise TargetSpecError(
                    f"target {spec!r}: {name} is not callable ({value!r}, type "
                    f"{type(value).__name__}); it must be a function, as "
                    f"c128a.contract.policy.{name} is")
            if value is not None:
                own_policy[name] = value
        fixed_width = overrides.get("fixed_width", _attribute(obj, "fixed_width", spec, False))
        if fixed_width:
            if "active_topk_width" in own_policy:
                raise TargetSpecError(
                    f"target {spec!r} declares fixed_width=True and its own active_topk_width: "
                    "declare one (a fixed-width builder's policy is W = C)"
                )
            own_policy["active_topk_width"] = policy.capacity_only
        values = dict(
            spec=spec,
            build_c128a_topk_metadata=build,
            validates_input=_flag(obj, "validates_input", spec, True),
            full_width_decode_views=_flag(obj, "full_width_decode_views", spec, False),
            jit_functions=_sequence(obj, "jit_functions", spec, _is_jit_function,
                                    "a @triton.jit function (one the target launches)"),
            padding_rows=_padding_rows(obj, spec),
            consumers=_sequence(obj, "consumers", spec, _is_consumer,
                                "a c128a.step.consumer_inputs.Consumer"),
            consumer_gaps=_consumer_gaps(obj, spec),
            launchers=_sequence(obj, "launchers", spec, _is_keyed_launcher,
                                "a keyed launcher (an object with get_warmup_keys or "
                                "warmed_launch_keys)"),
            uses_project_policy=not own_policy,
            fixed_width=bool(fixed_width),
            fixed_width_origin=DECLARED_FIXED_WIDTH if fixed_width else "",
            **own_policy,
        )
        values.update(overrides)
        return cls(**values)


def widths_of(target) -> str:
    """The widths every check draws W from for ``target``, and why."""
    if getattr(target, "fixed_width", False):
        origin = getattr(target, "fixed_width_origin", "") or DECLARED_FIXED_WIDTH
        return f"W = C only, a fixed-width builder ({origin})"
    if not getattr(target, "uses_project_policy", True):
        return "those the target's own width policy returns"
    return "the project's policy, and any width the contract allows"


def signature_mismatch(build) -> str | None:
    """Why ``build`` cannot be called with vLLM's eleven arguments by name
    (what vLLM's engine passes; the suite passes them in vLLM's order),
    naming the parameters that differ; None when it can, when its signature
    cannot be read, or when it takes ``*args`` (a wrapper passing them on)."""
    try:
        signature = inspect.signature(build)
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values()):
        return None
    try:
        signature.bind(**{name: None for name in BuildArgs._fields})
        return None
    except TypeError:
        pass
    parameters = signature.parameters.values()
    by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {p.name for p in parameters if p.kind in by_name}
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    lacks = [name for name in BuildArgs._fields if name not in named and not any_keyword]
    requires = [
        p.name for p in parameters
        if p.name not in BuildArgs._fields and p.default is p.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    parts = ([f"no parameter for {', '.join(lacks)}"] if lacks else []) + (
        [f"requires {', '.join(requires)}, which vLLM does not pass"] if requires else [])
    return (
        f"{BUILD_FUNCTION}{signature} does not take vLLM's eleven arguments by name: {'; '.join(parts) or 'they do not bind'}; vLLM calls "
        f"{BUILD_FUNCTION}({', '.join(BuildArgs._fields)}=8192)"
    )


def _attribute(obj, name: str, spec: str, default=None):
    """``obj.name`` (``default`` where absent); an attribute whose reading
    raises (a property, a module ``__getattr__``) makes a bad spec, not a
    failure of the target."""
    try:
        return getattr(obj, name, default)
    except BaseException as exc:  # noqa: BLE001 - the target object's own code raised
        if is_runner_stop(exc):
            raise
        raise TargetSpecError(
            f"target {spec!r}: reading its attribute {name!r} raised {one_line(exc)}; "
            "fix the target object or name another"
        ) from exc


def _wrong_type(spec: str, name: str, value, must: str) -> TargetSpecError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return TargetSpecError(
        f"target {spec!r}: {name} = {shown} (type {type(value).__name__}); it must be {must}"
    )


def _flag(obj, name: str, spec: str, default: bool) -> bool:
    """A True/False declaration: anything else (the string "no", which is
    true) would silently mean another thing than was meant."""
    value = _attribute(obj, name, spec, default)
    if not isinstance(value, bool):
        raise _wrong_type(spec, name, value, f"True or False (default {default})")
    return value


def _sequence(obj, name: str, spec: str, is_item: Callable[[object], bool], item: str) -> tuple:
    """A declaration of several things: a tuple or list of them (None: none)."""
    value = _attribute(obj, name, spec)
    if value is None:
        return ()
    if not isinstance(value, (tuple, list)):
        raise _wrong_type(spec, name, value,
                          f"a tuple or list, each item {item}: {name} = (x,) for one")
    for index, each in enumerate(value):
        if not is_item(each):
            raise _wrong_type(spec, f"{name}[{index}]", each, item)
    return tuple(value)


def _consumer_gaps(obj, spec: str) -> tuple:
    """``consumer_gaps``: a dict of consumer name -> why it is unavailable."""
    value = _attribute(obj, "consumer_gaps", spec)
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise _wrong_type(spec, "consumer_gaps", value,
                          "a dict of consumer name -> why it is unavailable (str: str)")
    return tuple(value.items())


def _is_jit_function(value) -> bool:
    # @triton.jit (compiled or interpreted), @triton.autotune and
    # @triton.heuristics all keep the Python function they wrap as ``fn``.
    return callable(value) and hasattr(value, "fn")


def _is_consumer(value) -> bool:
    from ..step.consumer_inputs import Consumer

    return isinstance(value, Consumer)


def _is_keyed_launcher(value) -> bool:
    return hasattr(value, "get_warmup_keys") or hasattr(value, "warmed_launch_keys")


def _declared(padding_rows):
    """What a target object's ``padding_rows`` attribute declares (None: nothing)."""
    return DEFAULT_PADDING_ROWS if padding_rows is None else padding_rows


def _padding_rows(obj, spec: str) -> str:
    value = _declared(_attribute(obj, "padding_rows", spec))
    if not isinstance(value, str):  # worded as check_padding_rows words a string it refuses
        raise TargetSpecError(f"target {spec!r}: padding_rows={value!r} (type "
                              f"{type(value).__name__}) must be the string 'slots' or 'inert'")
    return value


def held_to(target, padding_rows: str | None):
    """``target`` held to the ``padding_rows`` variant instead of the one it
    declares (None: as it declares). A :class:`Target` comes back with the
    field replaced; any other target object is read as one first."""
    declared = _declared(getattr(target, "padding_rows", None))
    if padding_rows is None or padding_rows == declared:
        return target
    if not isinstance(target, Target):
        target = Target.from_object(str(getattr(target, "spec", target)), target)
    return dataclasses.replace(target, padding_rows=padding_rows)
