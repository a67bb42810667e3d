"""The ``vllm-source:PATH[@REF]`` target: vLLM's builder and the consumers
of its views as a vLLM checkout holds them at any git revision.

PATH is a git checkout of vLLM (a bare repository too); REF any revision
git understands (a commit, a branch, a tag, ``HEAD~3``; ``HEAD`` when
omitted). Everything is read from git's objects (``git rev-parse``,
``git ls-tree``, ``git grep`` on the commit, ``git cat-file``): the work
tree, the index and the checked-out branch are never touched, so a
revision can be checked while the checkout is on another.

At that revision the builder is read from
``vllm/models/deepseek_v4/sparse_mla.py``, or wherever the revision
defines ``build_c128a_topk_metadata`` at a file's top level (it moved
between releases); each consumer's file likewise
(:data:`c128a.kernels.vllm_consumers.SOURCES`: its usual path, else the
file that defines most of its functions). They are extracted as a wheel's
are (:mod:`c128a.kernels.vllm_extracts`: the definitions the functions need,
verbatim, each extract sealed with its digest and verified before it is
imported) into ``$C128A_CACHE/vllm-source/KEY``, KEY a digest of the
files' git blob hashes: revisions whose files are the same share one
folder, and a later load reads it without running git's extraction again.

How the revision's engine calls the builder is read from its calls of the
builder (:func:`~c128a.kernels.vllm_extracts.engine_widths`): an engine
that passes ``max_compressed_tokens=self.ATTR`` set at start-up calls it at
W = C only, and the target then declares a fixed width (every check draws
W = C); ``$C128A_VLLM_WIDTHS=fixed|adaptive`` overrides what is recognised.

A revision where no file defines the builder, where it needs names the
stand-ins do not supply, or where its signature does not take vLLM's
eleven arguments by name is a :class:`~c128a.failures.TargetUnavailable`:
one line naming the spec, the commit and its subject, and what changed
(pytest exits 4, the CLI 2). A PATH that is not a git checkout, or a REF it
does not have, is a :class:`~c128a.failures.TargetSpecError`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..contract import BUILD_FUNCTION
from ..failures import TargetSpecError, TargetUnavailable
from .target import Target, signature_mismatch
from .vllm_release import (
    EXTRACT_NAME,
    SOURCE_PATH,
    SOURCE_VERSION,
    VERSION_KEY,
    _cache_fault,
    _consumer_extracts,
    _consumers_module,
    _kernels,
    _writing,
    cache_root,
    declared_widths,
    engine_widths_header,
)

PREFIX = "vllm-source"
DEFAULT_REF = "HEAD"
GIT_TIMEOUT_S = 120
BLOB_KEY = "git-blob"
SEARCHED = "vllm/*.py"
"""Where a revision's files are looked for: vLLM's package."""


def is_vllm_source_spec(spec: str) -> bool:
    return spec == PREFIX or spec.startswith(PREFIX + ":")


def source_spec(checkout, revision: str) -> str:
    """The spec of ``checkout`` at ``revision`` (the checkout made absolute,
    so that a saved case names it from any folder)."""
    return f"{PREFIX}:{Path(checkout).expanduser().resolve()}@{revision}"


def split_spec(spec: str) -> tuple[Path, str]:
    """(checkout, revision) of ``vllm-source:PATH[@REF]``: the first ``@``
    after which PATH is an existing folder splits them (a path or a
    revision may hold ``@`` too); REF is ``HEAD`` when none does."""
    argument = spec.strip()[len(PREFIX) + 1 :].strip() if spec.strip().startswith(PREFIX + ":") else ""
    if not argument:
        raise TargetSpecError(
            f"target spec {spec!r} needs a vLLM checkout: {PREFIX}:PATH or {PREFIX}:PATH@REF "
            "(a commit, branch or tag of that checkout)"
        )
    at = argument.find("@")
    while at > 0:
        path, ref = argument[:at], argument[at + 1 :]
        if ref and Path(path).expanduser().is_dir():
            return Path(path).expanduser(), ref
        at = argument.find("@", at + 1)
    path = Path(argument).expanduser()
    if not path.is_dir():
        raise TargetSpecError(
            f"target spec {spec!r}: {argument!r} is not an existing folder (a vLLM checkout, "
            f"optionally @REF: {PREFIX}:PATH@REF)"
        )
    return path, DEFAULT_REF


@dataclass(frozen=True)
class Revision:
    """One commit of a checkout: what every message names."""

    spec: str
    checkout: Path
    commit: str
    subject: str

    def __str__(self) -> str:
        return f'{self.spec} (commit {self.commit[:12]} "{self.subject}")'


def git(checkout: Path, *arguments: str, spec: str, check: bool = True) -> subprocess.CompletedProcess:
    """``git -C checkout ARGUMENTS``, its output as bytes. No optional locks
    (nothing of the checkout is written); git missing or past
    :data:`GIT_TIMEOUT_S` is a :class:`TargetUnavailable`; with ``check``, a
    failure is a :class:`TargetSpecError` quoting git."""
    command = ["git", "-C", str(checkout), *arguments]
    environment = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}
    try:
        done = subprocess.run(command, capture_output=True, timeout=GIT_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=environment)
    except FileNotFoundError as exc:
        raise TargetUnavailable(f"{spec}: git is not installed ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise TargetUnavailable(
            f"{spec}: `git {' '.join(arguments[:2])}` did not finish in {GIT_TIMEOUT_S} s"
        ) from exc
    if check and done.returncode != 0:
        said = " ".join(done.stderr.decode("utf-8", "replace").split()) or f"exit {done.returncode}"
        raise TargetSpecError(f"target spec {spec!r}: `git {' '.join(arguments)}` said: {said}")
    return done


def resolve(spec: str) -> Revision:
    """The commit ``spec`` names, and its subject."""
    checkout, ref = split_spec(spec)
    inside = git(checkout, "rev-parse", "--git-dir", spec=spec, check=False)
    if inside.returncode != 0:
        said = " ".join(inside.stderr.decode("utf-8", "replace").split())
        raise TargetSpecError(
            f"target spec {spec!r}: {checkout} is not a git checkout ({said}); point "
            f"{PREFIX}: at a clone of vLLM"
        )
    found = git(checkout, "rev-parse", "--verify", "--quiet", "--end-of-options",
                f"{ref}^{{commit}}", spec=spec, check=False)
    if found.returncode != 0:
        raise TargetSpecError(
            f"target spec {spec!r}: {checkout} has no commit {ref!r} (`git rev-parse` knows no "
            "such revision); name a commit, branch or tag of that checkout"
        )
    commit = found.stdout.decode().strip()
    subject = git(checkout, "log", "-1", "--format=%s", commit, spec=spec).stdout
    return Revision(spec, checkout, commit, subject.decode("utf-8", "replace").strip())


# ---------------------------------------------------------------- the revision's files


class _Tree:
    """The Python files of vLLM's package at one revision, read from git."""

    def __init__(self, revision: Revision):
        self.revision = revision
        listed = git(revision.checkout, "ls-tree", "-r", "-z", "--full-tree", revision.commit,
                     "--", "vllm", spec=revision.spec).stdout.decode("utf-8", "replace")
        self.blobs: dict[str, str] = {}
        for entry in filter(None, listed.split("\0")):
            meta, _, path = entry.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob" and path.endswith(".py"):
                self.blobs[path] = parts[2]
        self._texts: dict[str, str | None] = {}

    def text(self, path: str) -> str | None:
        """The file's text at the revision (None: absent, or not readable
        as UTF-8: a snapshot may lack a blob)."""
        if path not in self._texts:
            blob = self.blobs.get(path)
            text = None
            if blob is not None:
                done = git(self.revision.checkout, "cat-file", "blob", blob,
                           spec=self.revision.spec, check=False)
                if done.returncode == 0:
                    try:
                        text = done.stdout.decode("utf-8")
                    except UnicodeDecodeError:
                        text = None
            self._texts[path] = text
        return self._texts[path]

    def files_naming(self, pattern: str) -> list[str]:
        """The package's files whose text matches ``pattern`` (a fixed
        string) at the revision, found by ``git grep`` in the commit."""
        done = git(self.revision.checkout, "grep", "-l", "-z", "-F", "-e", pattern,
                   self.revision.commit, "--", SEARCHED, spec=self.revision.spec, check=False)
        prefix = f"{self.revision.commit}:"
        found = [name.removeprefix(prefix) for name in
                 done.stdout.decode("utf-8", "replace").split("\0") if name]
        return sorted(path for path in found if path in self.blobs)

    def defining(self, name: str) -> list[str]:
        """The files defining function ``name`` at their top level."""
        kernels = _kernels()
        return [path for path in self.files_naming(f"def {name}")
                if (text := self.text(path)) is not None and kernels.defines_function(text, name)]


def _builder_file(tree: _Tree) -> str:
    """The revision's file defining the builder: its usual path, else the one file that does."""
    kernels = _kernels()
    usual = tree.text(SOURCE_PATH)
    if usual is not None and kernels.defines_builder(usual):
        return SOURCE_PATH
    found = tree.defining(BUILD_FUNCTION)
    where = f"{SOURCE_PATH} is {'there' if SOURCE_PATH in tree.blobs else 'missing'}"
    if not found:
        raise TargetUnavailable(
            f"{tree.revision}: no file of vllm/ defines {BUILD_FUNCTION} at its top level "
            f"({where}); this revision predates the C128A builder, moved it into a class, or "
            "renamed it"
        )
    if len(found) > 1:
        raise TargetUnavailable(
            f"{tree.revision}: {SOURCE_PATH} does not define {BUILD_FUNCTION} ({where}), and "
            f"several files do: {', '.join(found)}"
        )
    return found[0]


def _consumer_files(tree: _Tree) -> dict[str, str | None]:
    """{usual source of a consumers' group: the revision's file holding it,
    or None}: the usual path where it defines one of the group's
    functions, else the file defining the most of them."""
    kernels = _kernels()
    files: dict[str, str | None] = {}
    for source, (_, consumers) in _consumers_module().SOURCES.items():
        names = [name for known in consumers.values() for name in known]
        usual = tree.text(source)
        if usual is not None and any(kernels.defines_function(usual, n) for n in names):
            files[source] = source
            continue
        counts: dict[str, int] = {}
        for name in names:
            for path in tree.defining(name):
                counts[path] = counts.get(path, 0) + 1
        files[source] = min(counts, key=lambda p: (-counts[p], p)) if counts else None
    return files


# ---------------------------------------------------------------- the target


def load_vllm_source(spec: str) -> Target:
    """The target ``vllm-source:PATH[@REF]`` names."""
    spec = spec.strip()
    revision = resolve(spec)
    tree = _Tree(revision)
    builder = _builder_file(tree)
    consumers = _consumer_files(tree)
    callers = sorted({builder, *tree.files_naming(f"{BUILD_FUNCTION}(")})
    used = {builder, *filter(None, consumers.values()), *callers}
    kernels = _kernels()
    key = hashlib.sha256("\n".join(
        [kernels.EXTRACT_FORMAT, f"builder {builder} {tree.blobs[builder]}",
         *(f"consumers {s} {p} {tree.blobs.get(p or '', '-')}" for s, p in consumers.items()),
         *(f"caller {p} {tree.blobs[p]}" for p in callers)]
    ).encode()).hexdigest()[:16]
    folder = cache_root() / PREFIX / key
    fault = _cache_fault(folder, SOURCE_VERSION)
    if fault is not None:
        missing = sorted(path for path in used if tree.text(path) is None)
        if missing:
            raise TargetUnavailable(
                f"{revision}: cannot read {', '.join(missing)} from git (a blob the checkout "
                "lacks: a partial clone or a snapshot without large files?)"
            )
        with _writing(spec, folder, fault.reason):
            if _cache_fault(folder, SOURCE_VERSION) is not None:
                _write(revision, tree, builder, consumers, callers, folder)
    return _target(revision, folder / EXTRACT_NAME, builder)


def _write(revision: Revision, tree: _Tree, builder: str, consumers: dict[str, str | None],
           callers: list[str], folder: Path) -> None:
    kernels = _kernels()
    header = {VERSION_KEY: SOURCE_VERSION, BLOB_KEY: tree.blobs[builder],
              **engine_widths_header([(path, tree.text(path)) for path in callers])}
    try:
        made = kernels.make_extract(tree.text(builder), builder, header)
    except kernels.ExtractError as exc:
        raise TargetUnavailable(f"{revision}: {exc}") from exc
    folder.mkdir(exist_ok=True)
    kernels.write_extract(made, folder / EXTRACT_NAME)
    texts = {source: (path, tree.text(path)) if path else None
             for source, path in consumers.items()}
    short = revision.commit[:12]
    _consumers_module().write_source_extracts(
        texts, folder, {VERSION_KEY: SOURCE_VERSION}, f"defined nowhere at commit {short}",
        f"commit {short} defines none of the functions of")


def _target(revision: Revision, extract: Path, builder: str) -> Target:
    """The target of the verified extracts in ``extract``'s folder; a
    builder that does not take vLLM's eleven arguments by name is refused,
    naming the revision."""
    kernels = _kernels()
    for path in [extract, *(p for p in _consumer_extracts(extract.parent) if p.is_file())]:
        required = (BUILD_FUNCTION,) if path == extract else ()
        fault = kernels.extract_fault(path, True, required)
        if fault is not None:
            raise TargetUnavailable(f"{revision}: {path} {fault}; remove {path.parent} to "
                                    "extract the revision again")
    try:
        namespace = kernels.load_extract(extract)
    except kernels.ExtractError as exc:
        raise TargetUnavailable(f"{revision}: {exc}") from exc
    mismatch = signature_mismatch(namespace.build_c128a_topk_metadata)
    if mismatch is not None:
        raise TargetUnavailable(f"{revision}: {builder}: {mismatch}")
    loaded, gaps = _consumers_module().load_consumers(extract.parent)
    return Target.from_object(revision.spec, namespace, consumers=loaded,
                              consumer_gaps=tuple(gaps.items()),
                              **declared_widths(kernels.read_header(extract)))
