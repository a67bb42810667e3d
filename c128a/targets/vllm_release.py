"""The ``vllm-release:VERSION`` and ``vllm-release:PATH`` targets: vLLM's
``build_c128a_topk_metadata`` as a release ships it, without installing vLLM.

``vllm-release:0.34.0`` downloads that release's wheel once with pip
(``python -m pip download --no-deps --only-binary=:all: vllm==0.34.0``) into
the cache folder ``$C128A_CACHE/vllm-release/0.34.0`` (``$C128A_CACHE``
defaults to ``~/.cache/c128a``), reads ``vllm/models/deepseek_v4/sparse_mla.py``
from it (or, where a release moved it, the one file of the wheel that defines
the function), and writes there an *extract*: only the definitions the
function needs, verbatim, beside stand-ins for the rest of vLLM
(:mod:`c128a.kernels.vllm_extracts`, which also imports it), its digest in
its header. Later loads read the extract alone and write nothing, so a cache
folder copied to a machine without a package registry (a GPU host) works
there as it is, read-only too. Each extract is verified before it is
imported: its digest, and the names it must define (a copy cut short or an
edit would otherwise fail with a NameError blamed on vLLM). One that fails
is rebuilt from the cached wheel, under the cache's lock; without a wheel
(or a writable folder) it is refused. ``vllm-release:PATH`` at an extract
(the user's own, which nothing records a digest for) is held to its names
only.

Beside it go the extracts of the consumers of the builder's views that the
same release ships (:mod:`c128a.kernels.vllm_consumers`); one the release
lacks is named in the target's ``consumer_gaps``.

``vllm-release:PATH`` names a wheel, a source file defining the function, an
extract, or a folder holding an extract or one wheel.

Errors: a spec that names no version and no existing path, or a path that
holds nothing usable, is a :class:`~c128a.failures.TargetSpecError`; a
release that cannot be fetched (no network, pip missing or failing, a version
the index does not have; the workers of one pytest-xdist run share the
first attempt's reason, the next run tries again), a cache that cannot be
written where it must be, a damaged extract or cached wheel, or a source
that no longer reduces to an extract (the function missing, names the
stand-ins do not supply) is a :class:`~c128a.failures.TargetUnavailable`:
one line naming the spec or version and why. A version that does not load
leaves no folder in the cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..contract import BUILD_FUNCTION
from ..failures import TargetSpecError, TargetUnavailable
from .target import Target

PREFIX = "vllm-release"
CACHE_ENV = "C128A_CACHE"
DEFAULT_CACHE = Path("~/.cache/c128a")
SOURCE_PATH = "vllm/models/deepseek_v4/sparse_mla.py"
EXTRACT_NAME = "c128a_vllm_extract.py"
PIP_TIMEOUT_S = 1800
VERSION_RE = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")
"""A public release version (PEP 440, without epoch or local part)."""
WIDTHS_ENV = "C128A_VLLM_WIDTHS"
"""fixed, adaptive or auto: how vLLM's engine calls the builder (auto:
recognised from the source's engine call)."""
AUTO = "auto"
WIDTHS_CHOICES = (AUTO, "fixed", "adaptive")
VERSION_KEY = "vllm-version"
SOURCE_VERSION = "source"
"""The version an extract of a source file (not a release) records."""
LOCK_NAME = ".lock"


def is_vllm_release_spec(spec: str) -> bool:
    return spec == PREFIX or spec.startswith(PREFIX + ":")


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def cache_folder(version: str) -> Path:
    """Where release ``version``'s wheel and extract are kept."""
    return cache_root() / PREFIX / version


def load_vllm_release(spec: str) -> Target:
    """The target ``vllm-release:VERSION`` or ``vllm-release:PATH`` names."""
    spec = spec.strip()
    argument = spec[len(PREFIX) + 1 :].strip() if spec.startswith(PREFIX + ":") else ""
    if not argument:
        raise TargetSpecError(
            f"target spec {spec!r} needs a vLLM release version or a path: "
            f"{PREFIX}:0.34.0 or {PREFIX}:PATH (a wheel, an extract, or a folder holding one)"
        )
    if VERSION_RE.fullmatch(argument):
        return _from_version(spec, argument)
    path = Path(argument).expanduser()
    if not path.exists():
        raise TargetSpecError(
            f"target spec {spec!r}: {argument!r} is neither a vLLM release version (like "
            "0.34.0) nor an existing path (a wheel, an extract, or a folder holding one)"
        )
    return _from_path(spec, path)


# ---------------------------------------------------------------- the ways to a source


def _kernels():
    # The kernels' package imports Triton: imported on first use, after the
    # device is chosen, as every kernel target is.
    from ..kernels import vllm_extracts

    return vllm_extracts


def _consumers_module():
    from ..kernels import vllm_consumers

    return vllm_consumers


def _from_version(spec: str, version: str) -> Target:
    """Release ``version`` from its cache folder: read as it is when its
    extracts verify (nothing is written there, so the folder may be
    read-only); else rebuilt, under the cache's lock, from the cached wheel,
    or from a download where the folder holds no extract of this format and
    version. A damaged extract with no wheel to rebuild it from is refused."""
    folder = cache_folder(version)
    fault = _cache_fault(folder, version)
    if fault is not None:
        with _writing(spec, folder, fault.reason):
            fault = _cache_fault(folder, version)  # another process may have mended it meanwhile
            if fault is not None:
                wheel = cached_wheel(folder, version)
                if wheel is None and not fault.download_mends:
                    raise TargetUnavailable(
                        f"{spec}: {fault.reason}, and {folder} holds no wheel of vLLM {version} "
                        f"to rebuild it from; remove {folder} to download the release again, "
                        "or copy there a whole cache folder from a machine where it loads"
                    )
                if wheel is None:
                    wheel = _download_for(version, folder, fault)
                _write_from_wheel(spec, wheel, version, folder, cached=True)
    return _target(spec, folder / EXTRACT_NAME, version, digest=True)


def _download_for(version: str, folder: Path, fault: _CacheFault) -> Path:
    """:func:`_download`; where it fails beside an extract of another format
    or version (a cache folder copied from an older c128a), the message says so."""
    try:
        return _download(version, folder)
    except TargetUnavailable as exc:
        if not (folder / EXTRACT_NAME).is_file():
            raise
        raise TargetUnavailable(f"{exc}; the cached {fault.reason}") from exc


def _from_path(spec: str, path: Path) -> Target:
    kernels = _kernels()
    if path.is_dir():
        if (path / EXTRACT_NAME).is_file():
            return _from_path(spec, path / EXTRACT_NAME)
        wheels = sorted(path.glob("vllm-*.whl"))
        if len(wheels) != 1:
            found = ", ".join(w.name for w in wheels) or "none"
            raise TargetSpecError(
                f"target spec {spec!r}: the folder {path} holds no {EXTRACT_NAME} and not "
                f"exactly one vllm-*.whl (found: {found})"
            )
        path = wheels[0]
    if not path.is_file():
        # A FIFO or a device (/dev/zero) would be read for ever.
        raise TargetSpecError(
            f"target spec {spec!r}: {path} is not a regular file or a folder (a FIFO, a "
            "device or a socket cannot hold a wheel, a source file or an extract)"
        )
    if path.suffix == ".whl":
        version = _wheel_version(spec, path)
        folder = cache_folder(version)
        with _writing(spec, folder, f"the wheel {path} is to be extracted into {folder}"):
            _write_from_wheel(spec, path, version, folder, cached=False)
        return _target(spec, folder / EXTRACT_NAME, version, digest=True)
    if path.suffix == ".py":
        if kernels.is_extract(path):
            # The user's own extract: nothing records what it should hold,
            # so only the names it must define are checked.
            version = kernels.read_header(path).get(VERSION_KEY, "unknown")
            return _target(spec, path, version, digest=False)
        return _from_source_file(spec, path)
    raise TargetSpecError(
        f"target spec {spec!r}: {path} is not a wheel (.whl), a Python file (.py) or a folder"
    )


def _from_source_file(spec: str, path: Path) -> Target:
    """A vLLM source file (a patched ``sparse_mla.py``, say): extracted into
    the cache beside the releases, under the file's digest (read from there
    when it verifies, as a release's is)."""
    import hashlib

    kernels = _kernels()
    source = _read_text(spec, path)
    if not kernels.defines_builder(source):
        raise TargetSpecError(
            f"target spec {spec!r}: {path} is neither a c128a extract nor a source file "
            f"defining {BUILD_FUNCTION}"
        )
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    folder = cache_root() / PREFIX / f"source-{digest}"
    fault = _cache_fault(folder, SOURCE_VERSION)
    if fault is not None:
        origin = str(path.resolve())
        made = _made_extract(spec, source, origin,
                             {VERSION_KEY: SOURCE_VERSION,
                              **engine_widths_header([(origin, source)])}, SOURCE_VERSION)
        with _writing(spec, folder, fault.reason):
            folder.mkdir(exist_ok=True)
            kernels.write_extract(made, folder / EXTRACT_NAME)
    return _target(spec, folder / EXTRACT_NAME, SOURCE_VERSION, digest=True)


def _read_text(spec: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetSpecError(f"target spec {spec!r}: cannot read {path} ({exc})") from exc


def _target(spec: str, extract: Path, version: str, digest: bool) -> Target:
    """The target of ``extract`` and the consumers' extracts beside it, each
    verified first (:func:`~c128a.kernels.vllm_extracts.extract_fault`; its
    digest too where ``digest``, as for the cache's own)."""
    kernels = _kernels()
    for path in [extract, *(p for p in _consumer_extracts(extract.parent) if p.is_file())]:
        fault = kernels.extract_fault(path, digest, _required_names(path, extract))
        if fault is not None:
            fix = ("load it by version or from its wheel to rebuild it" if digest else
                   "point the spec at a complete extract, or at the vLLM source file or wheel "
                   "to extract it from")
            raise TargetUnavailable(f"{spec} (vLLM {version}): {path} {fault}; {fix}")
    try:
        namespace = kernels.load_extract(extract)
    except kernels.ExtractError as exc:
        raise TargetUnavailable(f"{spec} (vLLM {version}): {exc}") from exc
    consumers, gaps = _consumers_module().load_consumers(extract.parent)
    return Target.from_object(spec, namespace, consumers=consumers,
                              consumer_gaps=tuple(gaps.items()),
                              **declared_widths(kernels.read_header(extract)))


def declared_widths(header: dict[str, str]) -> dict:
    """The fixed-width declaration of an extract's target (overrides of
    :meth:`Target.from_object`): ``$C128A_VLLM_WIDTHS`` when it says
    ``fixed`` or ``adaptive``, else what the extract's header recorded of
    the source's engine call (:func:`~c128a.kernels.vllm_extracts.engine_widths`;
    an extract without that line is held to every width)."""
    raw = os.environ.get(WIDTHS_ENV, "")
    choice = raw.strip().lower() or AUTO
    if choice not in WIDTHS_CHOICES:
        raise TargetSpecError(
            f"${WIDTHS_ENV}={raw!r} is not one of {', '.join(WIDTHS_CHOICES)}: fixed (vLLM's "
            "engine calls the builder at W = C only), adaptive (at widths chosen per step), "
            "auto (recognised from the source's engine call; the default)"
        )
    if choice != AUTO:
        origin = f"from ${WIDTHS_ENV}={choice}"
        return {"fixed_width": choice == "fixed", "fixed_width_origin": origin}
    recognised = _kernels().EngineWidths.from_header(header)
    if recognised is not None and recognised.kind == _kernels().FIXED:
        return {"fixed_width": True, "fixed_width_origin": f"recognised: {recognised.reason}"}
    return {}


def _required_names(path: Path, extract: Path) -> tuple[str, ...]:
    """What ``path`` must define beyond its header's ``selected`` line: the
    builder, for the builder's extract."""
    return (BUILD_FUNCTION,) if path == extract else ()


# ---------------------------------------------------------------- the cache folder


@dataclass(frozen=True)
class _CacheFault:
    """Why a cache folder's extracts are not loaded as they are."""

    reason: str
    download_mends: bool
    """The folder holds no builder's extract of this format and version:
    downloading the release is how it gets one (a damaged extract is
    rebuilt from a cached wheel only)."""


def _cache_fault(folder: Path, version: str) -> _CacheFault | None:
    """What keeps ``folder``'s extracts from being loaded as they are, or
    None. A consumers' extract the folder lacks counts only where its wheel
    is cached to write it from (else the load names that consumer a gap)."""
    kernels = _kernels()
    extract = folder / EXTRACT_NAME
    if not extract.is_file():
        return _CacheFault(f"{folder} holds no {EXTRACT_NAME}", True)
    stale = _stale(extract, version)
    if stale is not None:
        return _CacheFault(f"{extract} {stale}", True)
    wheel = cached_wheel(folder, version)
    for path in [extract, *_consumer_extracts(folder)]:
        if not path.is_file():
            if wheel is not None:
                return _CacheFault(f"{folder} holds no {path.name}", False)
            continue
        fault = _stale(path, version) or kernels.extract_fault(
            path, True, _required_names(path, extract)
        )
        if fault is not None:
            return _CacheFault(f"{path} {fault}", False)
    return None


def _stale(path: Path, version: str) -> str | None:
    """Why the extract at ``path`` is not of this format and ``version``, or None."""
    kernels = _kernels()
    header = kernels.read_header(path)
    written = (header.get(kernels.FORMAT_KEY), header.get(VERSION_KEY))
    if written == (kernels.EXTRACT_FORMAT, version):
        return None
    return (f"is of extract format {written[0] or 'none'} for vLLM {written[1] or 'unknown'} "
            f"(wanted: format {kernels.EXTRACT_FORMAT} for {version})")


def _consumer_extracts(folder: Path) -> list[Path]:
    sources = _consumers_module().SOURCES
    return [folder / file_name for file_name, _ in sources.values()]


@contextlib.contextmanager
def _writing(spec: str, folder: Path, why: str):
    """The cache's lock held while ``folder`` is written (one process at a
    time: pytest-xdist and fuzz workers load the target together). The lock
    is one file for the whole cache, ``$C128A_CACHE/vllm-release/.lock``, so
    a version that fails leaves no folder behind. An ``OSError`` (a
    read-only or full file system) is a :class:`TargetUnavailable` saying
    ``why`` the folder was to be written and what refused it."""
    root = folder.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        handle = open(root / LOCK_NAME, "a")
    except OSError as exc:
        raise TargetUnavailable(_unwritable(spec, why, root, exc)) from exc
    with handle:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            fcntl = None
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        except OSError as exc:
            raise TargetUnavailable(_unwritable(spec, why, exc.filename or folder, exc)) from exc


def _unwritable(spec: str, why: str, where, exc: OSError) -> str:
    return (
        f"{spec}: {why}, and {where} cannot be written ({exc.strerror or exc}); set "
        f"${CACHE_ENV} to a writable folder, or copy there a cache folder whose extracts load"
    )


# ---------------------------------------------------------------- wheels


def _wheel_version(spec: str, wheel: Path) -> str:
    parts = wheel.name.split("-")
    if len(parts) < 3 or parts[0] != "vllm" or not VERSION_RE.fullmatch(parts[1]):
        raise TargetSpecError(
            f"target spec {spec!r}: {wheel.name} is not named like a vLLM wheel "
            "(vllm-VERSION-...-PLATFORM.whl)"
        )
    return parts[1]


def cached_wheel(folder: Path, version: str) -> Path | None:
    """Release ``version``'s wheel in its cache ``folder``, if one was downloaded."""
    wheels = sorted(folder.glob(f"vllm-{version}-*.whl"))
    return wheels[0] if wheels else None


def read_builder_source(wheel: Path, version: str) -> tuple[str, str]:
    """(member, text) of the wheel's file defining the builder:
    :data:`SOURCE_PATH`, else the one ``vllm/**.py`` that defines it.
    :class:`TargetUnavailable` when no file does."""
    kernels = _kernels()
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        if SOURCE_PATH in names:
            text = archive.read(SOURCE_PATH).decode("utf-8")
            if kernels.defines_builder(text):
                return SOURCE_PATH, text
        marker = f"def {BUILD_FUNCTION}".encode()
        found = []
        for name in names:
            if name.startswith("vllm/") and name.endswith(".py") and name != SOURCE_PATH:
                data = archive.read(name)
                if marker in data and kernels.defines_builder(data.decode("utf-8", "replace")):
                    found.append((name, data.decode("utf-8")))
    where = f"{SOURCE_PATH} is {'there' if SOURCE_PATH in names else 'missing'}"
    if not found:
        raise TargetUnavailable(
            f"vLLM {version}: no file of {wheel.name} defines {BUILD_FUNCTION} at its top "
            f"level ({where}); this release predates the C128A builder or moved it into a class"
        )
    if len(found) > 1:
        raise TargetUnavailable(
            f"vLLM {version}: {SOURCE_PATH} does not define {BUILD_FUNCTION} in {wheel.name} "
            f"({where}), and several files do: {', '.join(n for n, _ in found)}"
        )
    return found[0]


def _write_from_wheel(spec: str, wheel: Path, version: str, folder: Path, cached: bool) -> None:
    """The builder's and the consumers' extracts of ``wheel`` into ``folder``
    (created only once the builder's extract is made). A wheel that cannot be
    read is a spec error when the spec names it, and for the ``cached`` wheel
    of a version, unavailable until removed."""
    try:
        member, source = read_builder_source(wheel, version)
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as exc:
        if cached:
            raise TargetUnavailable(
                f"{spec}: the cached wheel {wheel} is not a readable wheel ({exc}); remove it "
                "to download the release again"
            ) from exc
        raise TargetSpecError(f"target spec {spec!r}: cannot read the wheel {wheel} ({exc})") from exc
    header = {VERSION_KEY: version, "wheel": wheel.name,
              **engine_widths_header([(member, source)])}
    made = _made_extract(spec, source, member, header, version)
    folder.mkdir(exist_ok=True)
    _kernels().write_extract(made, folder / EXTRACT_NAME)
    try:
        _consumers_module().write_extracts(wheel, folder, header)
    except (zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise TargetSpecError(f"target spec {spec!r}: cannot read the wheel {wheel} ({exc})") from exc


def engine_widths_header(sources) -> dict[str, str]:
    """The extract header's line recording how the engine in ``sources``
    ((origin, text) pairs) calls the builder."""
    kernels = _kernels()
    recognised = kernels.engine_widths(sources)
    return {kernels.ENGINE_WIDTHS_KEY: " ".join(recognised.header_value().split())}


def _made_extract(spec: str, source: str, origin: str, header: dict[str, str], version: str):
    kernels = _kernels()
    try:
        return kernels.make_extract(source, origin, header)
    except kernels.ExtractError as exc:
        raise TargetUnavailable(f"{spec} (vLLM {version}): {exc}") from exc


_NETWORK_SIGNS = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Max retries exceeded",
    "Could not fetch URL",
    "SSLError",
)


RUN_ID_ENV = "PYTEST_XDIST_TESTRUNUID"
"""The run a process is part of: pytest-xdist sets it in each worker."""
FAILED_DOWNLOADS_NAME = ".failed-downloads.json"
"""Beside the lock: the downloads that failed in the latest run, and why."""


def _download(version: str, folder: Path) -> Path:
    """:func:`download_wheel`, or the reason it failed earlier in this run
    (``$PYTEST_XDIST_TESTRUNUID``): a run's workers get the first one's
    reason at once instead of each trying pip in turn; the next run, or a
    process outside such a run, tries again."""
    run = os.environ.get(RUN_ID_ENV)
    memory = folder.parent / FAILED_DOWNLOADS_NAME
    failed = _failed_downloads(memory, run)
    if version in failed:
        raise TargetUnavailable(
            f"{failed[version]} (the first attempt of this run, {RUN_ID_ENV}={run}; the next "
            "run tries again)"
        )
    try:
        return download_wheel(version, folder)
    except TargetUnavailable as exc:
        if run:
            _remember_failed_downloads(memory, run, {**failed, version: str(exc)})
        raise


def _failed_downloads(memory: Path, run: str | None) -> dict[str, str]:
    """{version: why} of the downloads that failed in ``run`` ({} outside a run)."""
    if not run:
        return {}
    try:
        kept = json.loads(memory.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict) or kept.get("run") != run:
        return {}
    failures = kept.get("failures")
    return {str(k): str(v) for k, v in failures.items()} if isinstance(failures, dict) else {}


def _remember_failed_downloads(memory: Path, run: str, failures: dict[str, str]) -> None:
    aside = memory.with_name(f"{memory.name}.{os.getpid()}.tmp")
    try:
        aside.write_text(json.dumps({"run": run, "failures": failures}), encoding="utf-8")
        aside.replace(memory)
    except OSError:  # only the other workers' shortcut is lost: each tries pip itself
        aside.unlink(missing_ok=True)


def download_wheel(version: str, folder: Path) -> Path:
    """Fetch vLLM ``version``'s wheel into ``folder`` with pip (no
    dependencies, binary only); :class:`TargetUnavailable` saying why not."""
    requirement = f"vllm=={version}"
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", requirement,
    ]
    # Downloaded beside the folder, which is made only for a wheel.
    aside = Path(tempfile.mkdtemp(prefix=f".download-{version}-", dir=folder.parent))
    try:
        try:
            done = subprocess.run(
                [*command, "-d", str(aside)], capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise TargetUnavailable(
                f"vLLM {version}: pip download did not finish in {PIP_TIMEOUT_S} s"
            ) from exc
        except OSError as exc:
            raise TargetUnavailable(f"vLLM {version}: cannot run pip ({exc})") from exc
        wheels = sorted(aside.glob("vllm-*.whl"))
        if done.returncode != 0 or not wheels:
            raise TargetUnavailable(_pip_failure(version, " ".join(command), done))
        folder.mkdir(exist_ok=True)
        target = folder / wheels[0].name
        wheels[0].replace(target)
        return target
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _pip_failure(version: str, command: str, done: subprocess.CompletedProcess) -> str:
    output = f"{done.stdout}\n{done.stderr}"
    tail = " | ".join(line.strip() for line in output.strip().splitlines()[-4:] if line.strip())
    listed = re.search(r"\(from versions: ([^)]*)\)", output)
    if "No module named pip" in output:
        why = "pip is not installed in this Python"
    elif any(sign in output for sign in _NETWORK_SIGNS):
        why = "pip could not reach the package index (no network?)"
    elif listed and listed.group(1).strip() not in ("", "none"):
        known = [v.strip() for v in listed.group(1).split(",")]
        why = f"the package index has no vllm {version} wheel (latest there: {', '.join(known[-5:])})"
    elif "No matching distribution" in output:
        why = f"the package index has no vllm {version} wheel (or could not be reached)"
    else:
        why = f"pip download failed (exit status {done.returncode})"
    return (
        f"vLLM {version}: {why}; `{command}` said: {tail or '(nothing)'}. On a machine "
        f"without a registry, copy a cache folder ({PREFIX}/{version}/{EXTRACT_NAME}) "
        f"under ${CACHE_ENV} or use {PREFIX}:PATH"
    )
