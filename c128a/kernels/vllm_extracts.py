"""vLLM's C128A builder from a release's source, without vLLM.

:func:`make_extract` reads the text of a vLLM module that defines
``build_c128a_topk_metadata`` (``vllm/models/deepseek_v4/sparse_mla.py`` in
0.33 and 0.34) and selects, with :mod:`ast`, the top-level definitions the
function needs, transitively: the function itself, the launcher object it
calls and its class (with its ``@triton.jit`` kernel), the Triton kernels
and helpers they name, and the module-level constants they read. Every other
name they use must be a builtin, a standard-library import (kept), or one of
the stand-ins of :mod:`c128a.kernels.vllm_shims` (``triton``, ``tl``,
``torch``, ``cdiv``, ``current_platform``, vLLM's launch helpers); anything
else is reported as a change of the source's layout, naming what is missing.

:func:`write_extract` writes the selection, verbatim and in source order,
under a header saying where it came from and recording the file's digest, to
a real ``.py`` file (Triton's JIT reads a kernel's source back from its
file); :func:`extract_fault` says why a file is not to be trusted (its
digest, the names it must define), and :func:`load_extract`
imports that file with :mod:`importlib` and returns the target namespace:
``build_c128a_topk_metadata``, ``jit_functions`` (the extract's Triton
functions), ``validates_input = False`` (vLLM checks with ``assert``) and
``full_width_decode_views`` (vLLM returns full-width decode views on
compute capability 12.x).

:func:`bare_launch` gives, for a loaded extract's builder, the launch inside
it without the builder's asserts and views, and (:meth:`BareLaunch.prepare`)
the Triton kernel launch alone with the arguments that launch computes (what
``c128a bench`` times).

The spec ``vllm-release:VERSION|PATH`` (:mod:`c128a.targets.vllm_release`)
finds the source and the cache; this module runs the extract, so it is
imported only after the device is chosen.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Callable

from triton.runtime.jit import KernelInterface

from ..contract import BUILD_FUNCTION, BuildArgs
from . import vllm_shims

EXTRACT_FORMAT = "2"
"""Bump when the extract's layout or the stand-ins change: cached extracts
of another format are rebuilt. 2: the header records the extract's digest."""
HEADER_PREFIX = "# c128a-"
FORMAT_KEY = "extract-format"
DIGEST_KEY = "extract-sha256"
"""The header line :func:`write_extract` adds: the sha256 of the file
without that line, so that a copy cut short or an edit is noticed."""
SUPPLIED_ROOTS = frozenset({"vllm", "torch", "triton"})
"""Modules whose names an extract may take from the stand-ins."""


class ExtractError(Exception):
    """The source cannot be reduced to a loadable extract: the function is
    missing, or the definitions it needs name something neither vLLM's file
    nor the stand-ins define. ``missing`` says what."""

    def __init__(self, message: str, missing: tuple[str, ...] = ()):
        self.missing = missing
        super().__init__(message)


@dataclass(frozen=True)
class Extract:
    """The selected definitions of one source, ready to be written."""

    text: str
    selected: tuple[str, ...]
    supplied: tuple[str, ...]
    kept_imports: tuple[str, ...]
    header: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- reading the source


def _bound_names(node: ast.AST) -> set[str]:
    """Every name bound anywhere inside ``node`` (arguments, assignments,
    definitions, loop and comprehension targets, imports, ``except``/``as``)."""
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, (ast.Store, ast.Del)):
            names.add(child.id)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
        elif isinstance(child, ast.arg):
            names.add(child.arg)
        elif isinstance(child, ast.alias):
            names.add((child.asname or child.name).split(".")[0])
        elif isinstance(child, ast.ExceptHandler) and child.name:
            names.add(child.name)
        elif isinstance(child, (ast.MatchAs, ast.MatchStar)) and child.name:
            names.add(child.name)
    return names


def _free_names(node: ast.AST) -> set[str]:
    """Names ``node`` reads that it does not bind itself (an over-approximation
    of what it binds, so a name both read and bound somewhere inside counts as
    its own), builtins left out."""
    read = {
        child.id
        for child in ast.walk(node)
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load)
    }
    return read - _bound_names(node) - set(dir(builtins))


def _defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [
            target.id
            for candidate in node.targets
            for target in ast.walk(candidate)
            if isinstance(target, ast.Name)
        ]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
        return [node.target.id]
    return []


@dataclass(frozen=True)
class _Import:
    module: str  # "" for ``import X``
    name: str
    asname: str | None

    @property
    def root(self) -> str:
        return (self.module or self.name).split(".")[0]

    def statement(self) -> str:
        alias = f" as {self.asname}" if self.asname else ""
        if self.module:
            return f"from {self.module} import {self.name}{alias}"
        return f"import {self.name}{alias}"

    def origin(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name


def _top_level(tree: ast.Module) -> tuple[dict[str, ast.stmt], dict[str, _Import], bool]:
    """(definitions by name, imports by bound name, whether the source uses
    ``from __future__ import annotations``) of the module's top level."""
    definitions: dict[str, ast.stmt] = {}
    imports: dict[str, _Import] = {}
    future = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if module == "__future__":
                future = future or any(alias.name == "annotations" for alias in node.names)
                continue
            for alias in node.names:
                imports[alias.asname or alias.name] = _Import(module, alias.name, alias.asname)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                name = alias.name if alias.asname else bound
                imports[bound] = _Import("", name, alias.asname)
        else:
            for name in _defined_names(node):
                definitions[name] = node
    return definitions, imports, future


def defines_builder(source: str) -> bool:
    """Whether ``source`` defines ``build_c128a_topk_metadata`` at its top level."""
    return defines_function(source, BUILD_FUNCTION)


def defines_function(source: str, name: str) -> bool:
    """Whether ``source`` defines function ``name`` at its top level."""
    if f"def {name}" not in source:
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
        for node in tree.body
    )


def _segment(lines: list[str], node: ast.stmt) -> str:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    return "".join(lines[first - 1 : node.end_lineno])


def make_extract(
    source: str,
    origin: str,
    header: dict[str, str] | None = None,
    roots: tuple[str, ...] = (BUILD_FUNCTION,),
    optional: bool = False,
) -> Extract:
    """The extract of ``roots`` (``build_c128a_topk_metadata`` by default)
    from ``source`` (the text of the vLLM module ``origin`` names, for
    messages and the header); :class:`ExtractError` when a root is missing
    or needs a name nothing supplies. With ``optional``, missing roots are
    left out and named in the header's ``missing`` line (an error only when
    every root is missing)."""
    try:
        tree = ast.parse(source, filename=origin)
    except SyntaxError as exc:
        raise ExtractError(f"{origin} does not parse: {exc}") from exc
    definitions, imports, future = _top_level(tree)
    found = [
        definitions[name] for name in roots
        if isinstance(definitions.get(name), (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    absent = tuple(
        name for name in roots
        if not isinstance(definitions.get(name), (ast.FunctionDef, ast.AsyncFunctionDef))
    )
    if absent and (not optional or not found):
        raise ExtractError(
            f"{origin} defines no top-level function {', '.join(absent)}", absent
        )
    wanted = ", ".join(roots)

    selected: dict[int, ast.stmt] = {}
    needed_imports: dict[str, _Import] = {}
    unknown: set[str] = set()
    pending = list(found)
    while pending:
        node = pending.pop()
        if id(node) in selected:
            continue
        selected[id(node)] = node
        for name in sorted(_free_names(node)):
            if name in definitions:
                pending.append(definitions[name])
            elif name in imports:
                needed_imports[name] = imports[name]
            else:
                unknown.add(name)

    kept: list[str] = []
    supplied: list[str] = []
    stdlib = sys.stdlib_module_names
    for name, imported in sorted(needed_imports.items()):
        if imported.root in stdlib:
            kept.append(imported.statement())
        elif imported.root in SUPPLIED_ROOTS and name in vllm_shims.SUPPLIED:
            supplied.append(name)
        else:
            unknown.add(f"{name} (from {imported.origin()})")
    if unknown:
        missing = tuple(sorted(unknown))
        raise ExtractError(
            f"the definitions {wanted} need in {origin} use names that neither "
            f"that file nor c128a's stand-ins define: {', '.join(missing)}; the source's "
            "layout changed (c128a.kernels.vllm_shims would need them)",
            missing,
        )

    nodes = sorted(selected.values(), key=lambda node: node.lineno)
    names = tuple(name for node in nodes for name in _defined_names(node))
    lines = source.splitlines(keepends=True)
    header = {
        FORMAT_KEY: EXTRACT_FORMAT,
        **(header or {}),
        "source": origin,
        "source-sha256": hashlib.sha256(source.encode()).hexdigest(),
        "selected": ", ".join(names),
        "supplied": ", ".join(sorted(supplied)),
        **({"missing": ", ".join(absent)} if absent else {}),
    }
    parts = [
        "".join(f"{HEADER_PREFIX}{key}: {value}\n" for key, value in header.items()),
        "# Generated by c128a (c128a/kernels/vllm_extracts.py) from the file above: vLLM's own\n"
        "# definitions, verbatim (Apache-2.0, the vLLM project), with the names they need\n"
        "# from the rest of vLLM supplied by c128a.kernels.vllm_shims. Do not edit: the\n"
        "# loader rebuilds it from the source.\n",
    ]
    if future:
        parts.append("from __future__ import annotations\n")
    parts.append("".join(f"{line}\n" for line in sorted(set(kept))))
    parts.append("".join(f"{vllm_shims.SUPPLIED[name]}\n" for name in sorted(supplied)))
    for node in nodes:
        parts.append(f"\n\n# {origin}, line {node.lineno}\n")
        parts.append(_segment(lines, node))
    text = "".join(parts).rstrip("\n") + "\n"
    return Extract(text, names, tuple(sorted(supplied)), tuple(sorted(set(kept))), header)


# ---------------------------------------------------------------- how the engine calls it

ENGINE_WIDTHS_KEY = "engine-widths"
"""The header line saying how the source's engine calls the builder
(:func:`engine_widths`): ``fixed: WHY`` or ``adaptive: WHY``."""
FIXED, ADAPTIVE = "fixed", "adaptive"
WIDTH_ARGUMENT = "max_compressed_tokens"


@dataclass(frozen=True)
class EngineWidths:
    """How vLLM's engine calls the builder: ``kind`` is ``fixed`` (at W = C
    only: an engine constant, set at start-up) or ``adaptive`` (a width it
    chooses per step, or no call found); ``reason`` says where and why."""

    kind: str
    reason: str

    def header_value(self) -> str:
        return f"{self.kind}: {self.reason}"

    @classmethod
    def from_header(cls, header: dict[str, str]) -> "EngineWidths | None":
        kind, _, reason = header.get(ENGINE_WIDTHS_KEY, "").partition(":")
        return cls(kind.strip(), reason.strip()) if kind.strip() in (FIXED, ADAPTIVE) else None


def _engine_calls(tree: ast.AST):
    """(enclosing function or None, call) for every call of the builder
    outside its own definition."""
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == BUILD_FUNCTION:
                return
            function = node
        if isinstance(node, ast.Call):
            callee = node.func
            name = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
            if name == BUILD_FUNCTION:
                found.append((function, node))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def _assigns_attribute(function, attribute: str) -> bool:
    """Whether ``function`` assigns ``self.<attribute>``."""
    return function is not None and any(
        isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        and node.attr == attribute and isinstance(node.value, ast.Name) and node.value.id == "self"
        for node in ast.walk(function)
    )


def engine_widths(sources) -> EngineWidths:
    """How the engine in ``sources`` ((origin, text) pairs: the files of a
    vLLM revision that call the builder) calls it: ``fixed`` where every
    call passes ``max_compressed_tokens=self.ATTR`` and the calling method
    never assigns ``self.ATTR`` (a value set at start-up: vLLM's buffers'
    width before #50004 and after its revert); ``adaptive`` where a call
    passes anything else (a width computed per step), or where no call is
    found (then every width the contract allows is checked)."""
    fixed, names = [], []
    for origin, text in sources:
        names.append(origin)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for function, call in _engine_calls(tree):
            where = f"{origin}:{call.lineno}"
            argument = next((k.value for k in call.keywords if k.arg == WIDTH_ARGUMENT), None)
            if argument is None and len(call.args) > len(BuildArgs._fields) - 1:
                argument = call.args[len(BuildArgs._fields) - 1]
            if argument is None:
                return EngineWidths(ADAPTIVE, f"the engine call at {where} passes no "
                                    f"{WIDTH_ARGUMENT} (the builder's default)")
            passed = ast.unparse(argument)
            if (isinstance(argument, ast.Attribute) and isinstance(argument.value, ast.Name)
                    and argument.value.id == "self"
                    and not _assigns_attribute(function, argument.attr)):
                method = function.name if function is not None else "its caller"
                fixed.append(f"the engine call at {where} passes {WIDTH_ARGUMENT}={passed}, "
                             f"which {method} never assigns (set at start-up)")
                continue
            return EngineWidths(ADAPTIVE, f"the engine call at {where} passes "
                                f"{WIDTH_ARGUMENT}={passed}, a width chosen per step")
    if fixed:
        more = f" (and {len(fixed) - 1} more such call(s))" if len(fixed) > 1 else ""
        return EngineWidths(FIXED, fixed[0] + more)
    return EngineWidths(ADAPTIVE, f"no engine call of {BUILD_FUNCTION} found in "
                        f"{', '.join(names) or 'the source'}: every width the contract allows")


# ---------------------------------------------------------------- the extract's file


def read_header(path: Path) -> dict[str, str]:
    """The ``# c128a-KEY: VALUE`` lines an extract starts with ({} when none)."""
    header: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if not line.startswith(HEADER_PREFIX):
                    break
                key, _, value = line[len(HEADER_PREFIX) :].partition(":")
                header[key.strip()] = value.strip()
    except (OSError, UnicodeDecodeError):
        return {}
    return header


def is_extract(path: Path) -> bool:
    return FORMAT_KEY in read_header(path)


def _without_digest(text: str) -> tuple[str, str | None]:
    """(``text`` less its header's digest line, the digest that line records)."""
    lines = text.splitlines(keepends=True)
    digest_line = f"{HEADER_PREFIX}{DIGEST_KEY}:"
    for index, line in enumerate(lines):
        if not line.startswith(HEADER_PREFIX):
            break
        if line.startswith(digest_line):
            return "".join(lines[:index] + lines[index + 1 :]), line[len(digest_line) :].strip()
    return text, None


def sealed(text: str) -> str:
    """``text`` (an extract's) with its digest as the header's last line."""
    text, _ = _without_digest(text)
    lines = text.splitlines(keepends=True)
    end = next(
        (i for i, line in enumerate(lines) if not line.startswith(HEADER_PREFIX)), len(lines)
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    return "".join([*lines[:end], f"{HEADER_PREFIX}{DIGEST_KEY}: {digest}\n", *lines[end:]])


def write_extract(extract: Extract, path: Path) -> Path:
    """Write ``extract``, sealed with its digest (:func:`sealed`), to
    ``path`` whole (aside, then renamed into place), unless ``path`` already
    holds exactly that text. An ``OSError`` leaves ``path`` as it was and
    nothing aside."""
    path = Path(path)
    text = sealed(extract.text)
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except (OSError, UnicodeDecodeError):
        pass
    aside = path.with_name(f".{path.name}.{id(extract):x}.tmp")
    try:
        aside.write_text(text, encoding="utf-8")
        aside.replace(path)
    except OSError:
        aside.unlink(missing_ok=True)
        raise
    return path


def extract_fault(path: Path, digest: bool, required: tuple[str, ...] = ()) -> str | None:
    """Why the extract at ``path`` cannot be trusted, or None: with
    ``digest``, its text differs from what :func:`write_extract` wrote (cut
    short, edited, or no digest recorded); always, it lacks a name its
    header's ``selected`` line or ``required`` lists, or one of those
    definitions reads a name the file neither defines nor imports (a
    NameError at the first call, which would be blamed on the target)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read ({exc})"
    if digest:
        body, recorded = _without_digest(text)
        if recorded is None:
            return (f"records no digest ({HEADER_PREFIX}{DIGEST_KEY}): it was not written "
                    "whole by c128a")
        actual = hashlib.sha256(body.encode()).hexdigest()
        if actual != recorded:
            return (f"differs from what was written (sha256={actual[:16]}..., recorded "
                    f"{recorded[:16]}...): cut short or edited since")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        return f"does not parse ({exc})"
    definitions, imports, _ = _top_level(tree)
    header = read_header(path)
    selected = [name.strip() for name in header.get("selected", "").split(",") if name.strip()]
    wanted = list(dict.fromkeys([*selected, *required]))
    absent = [name for name in wanted if name not in definitions]
    if absent:
        return f"defines no {', '.join(absent)} (names it must define: {', '.join(wanted)})"
    # Names bound by other top-level statements (an ``if`` or ``try`` block
    # in a hand-made extract) count as defined; a star import defines any.
    bound = set(imports).union(*(
        _bound_names(node) for node in tree.body
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ))
    if any(alias.name == "*" for node in tree.body if isinstance(node, ast.ImportFrom)
           for alias in node.names):
        return None
    unresolved: set[str] = set()
    seen: set[int] = set()
    pending = [definitions[name] for name in wanted]
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for name in _free_names(node):
            if name in definitions:
                pending.append(definitions[name])
            elif name not in bound:
                unresolved.add(name)
    if unresolved:
        return f"uses names it neither defines nor imports: {', '.join(sorted(unresolved))}"
    return None


_LOADED: dict[tuple[str, str], SimpleNamespace] = {}


def _jit_functions(module: ModuleType, names: list[str]) -> tuple:
    found = []
    for name in names:
        value = getattr(module, name, None)
        candidates = [value]
        if isinstance(value, type):
            candidates = [
                getattr(member, "__func__", member) for member in vars(value).values()
            ]
        found += [c for c in candidates if isinstance(c, KernelInterface) and c not in found]
    return tuple(found)


def import_extract(path: Path) -> ModuleType:
    """Import the extract at ``path`` as a module of its own (named after
    its path and content, so a rebuilt extract is a new module, and the same
    text in another cache folder is another module whose code names its own
    file); :class:`ExtractError` when it does not import."""
    path = Path(path).resolve()
    digest = hashlib.sha256(str(path).encode() + b"\0" + path.read_bytes()).hexdigest()
    module_name = f"c128a_vllm_extract_{digest[:16]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ExtractError(
            f"the extract {path} does not import: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def load_extract(path: Path) -> SimpleNamespace:
    """Import the extract at ``path`` (once per file content in a process)
    and return the target namespace. An extract that does not import, or has
    no callable builder, raises :class:`ExtractError`."""
    path = Path(path).resolve()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    key = (str(path), digest)
    if key in _LOADED:
        return _LOADED[key]
    header = read_header(path)
    module = import_extract(path)
    module_name = module.__name__
    build = getattr(module, BUILD_FUNCTION, None)
    if not callable(build):
        del sys.modules[module_name]
        raise ExtractError(f"the extract {path} defines no callable {BUILD_FUNCTION}")
    names = [n.strip() for n in header.get("selected", "").split(",") if n.strip()]
    capability = vllm_shims.current_platform.get_device_capability()
    namespace = SimpleNamespace(
        build_c128a_topk_metadata=build,
        jit_functions=_jit_functions(module, names or list(vars(module))),
        # vLLM checks its preconditions with assert (stripped by python -O)
        # and checks no dtypes, devices or counts.
        validates_input=False,
        # vLLM's builder returns the whole decode rows (W = C) on 12.x.
        full_width_decode_views=capability is not None and capability.major == 12,
        launchers=_launchers_named(module, build),
        module=module,
        path=path,
        header=header,
    )
    _LOADED[key] = namespace
    return namespace


def _launchers_named(module: ModuleType, function) -> tuple:
    """The module's keyed launchers (objects with ``get_warmup_keys``) ``function`` names."""
    named = set(getattr(getattr(function, "__code__", None), "co_names", ()))
    return tuple(
        value for name, value in vars(module).items()
        if name in named and hasattr(value, "get_warmup_keys")
    )


# ---------------------------------------------------------------- the bare launch


class BareLaunch:
    """An extract's launcher object called with a builder's arguments (see
    :func:`bare_launch`). Calling it runs the launcher's whole launch path
    (vLLM's launch spec, the stand-ins' binding, the kernel launch);
    :meth:`prepare` does the first two once and returns the kernel launch
    alone, as bench times it."""

    def __init__(self, name: str, launcher, bound: list[str], where: str):
        self.__name__ = self.name = name
        self.launcher, self.bound, self.where = launcher, bound, where

    def __repr__(self) -> str:
        return f"<bare launch {self.name} of {self.where}>"

    def _inputs(self, args: BuildArgs) -> dict:
        return {parameter: getattr(args, parameter) for parameter in self.bound}

    def __call__(self, args: BuildArgs) -> None:
        if args.num_tokens == 0:
            return
        self.launcher(**self._inputs(args))

    def prepare(self, args: BuildArgs) -> Callable[[], None]:
        """The Triton kernel launch for ``args`` alone: the launch spec of
        the launcher's own ``__call__`` and its binding to the kernel's
        parameters are computed now, once (through a kernel that records the
        launch instead of running it); each call of the result launches the
        kernel with them. Where the launcher's ``__call__`` is not a
        :func:`~c128a.kernels.vllm_shims.kernel_launcher`, each call runs the
        whole launch path."""
        if args.num_tokens == 0:
            return lambda: None
        call = getattr(type(self.launcher).__call__, "__wrapped__", None)
        if call is None:
            return functools.partial(self, args)
        arguments = inspect.signature(call).bind(self.launcher, **self._inputs(args))
        arguments.apply_defaults()
        inputs = dict(list(arguments.arguments.items())[1:])  # as kernel_launcher binds, less self
        grid, given, *outputs = call(self.launcher, **inputs)
        kernel = given.get("kernel") or self.launcher.kernel
        recorder = _RecordingKernel(kernel)
        self.launcher.launch((grid, {**given, "kernel": recorder}, *outputs), inputs)
        if recorder.grid is None:  # the launcher launches nothing for these arguments
            return lambda: None
        return functools.partial(kernel[recorder.grid], **recorder.kwargs)


class _RecordingKernel:
    """Stands for a Triton kernel in a launch: keeps its grid and arguments."""

    def __init__(self, kernel):
        names = getattr(kernel, "arg_names", None)
        self.arg_names = tuple(names or inspect.signature(kernel.fn).parameters)
        self.grid, self.kwargs = None, {}

    def __getitem__(self, grid):
        def record(**kwargs):
            self.grid, self.kwargs = grid, kwargs

        return record


def bare_launch(build: Callable) -> BareLaunch:
    """The launch inside ``build`` (the ``build_c128a_topk_metadata`` of an
    extract loaded by :func:`load_extract`) without the builder's asserts and
    views: the extract's one module-level launcher object the builder names
    (an instance of a :class:`~c128a.kernels.vllm_shims.VllmTritonJitKernel`
    subclass, as vLLM 0.34's ``_BUILD_C128A_TOPK_METADATA_KERNEL``), called
    with the builder's arguments bound to its ``__call__``'s parameters by
    name. Like the builder, it launches nothing for zero tokens.
    :class:`ExtractError` when ``build`` is no loaded extract's builder, or
    names no such launcher or several, or the launcher takes an argument the
    builder does not have."""
    module = sys.modules.get(getattr(build, "__module__", None) or "")
    if module is None or getattr(module, BUILD_FUNCTION, None) is not build:
        raise ExtractError(f"{build!r} is not the {BUILD_FUNCTION} of a loaded c128a extract")
    where = getattr(module, "__file__", module.__name__)
    code = getattr(build, "__code__", None)
    named = set(code.co_names) if code is not None else set()
    launchers = {
        name: value
        for name, value in vars(module).items()
        if name in named and isinstance(value, vllm_shims.VllmTritonJitKernel)
    }
    if len(launchers) != 1:
        found = ", ".join(sorted(launchers)) or "none"
        raise ExtractError(
            f"the {BUILD_FUNCTION} of {where} names not exactly one launcher object "
            f"(a VllmTritonJitKernel instance; found: {found}): no bare launch to time"
        )
    ((name, launcher),) = launchers.items()
    parameters = list(inspect.signature(type(launcher).__call__).parameters.values())[1:]
    unknown = [
        p.name for p in parameters if p.name not in BuildArgs._fields and p.default is p.empty
    ]
    if unknown:
        raise ExtractError(
            f"{name} in {where} takes {', '.join(unknown)}, which {BUILD_FUNCTION} does not: "
            "no bare launch to time", tuple(unknown)
        )
    return BareLaunch(name, launcher, [p.name for p in parameters if p.name in BuildArgs._fields],
                      where)
