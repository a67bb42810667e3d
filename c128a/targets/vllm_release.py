"""The ``vllm-release:VERSION`` and ``vllm-release:PATH`` targets: vLLM's
``build_c128a_topk_metadata`` as a release ships it, without installing vLLM.

``vllm-release:0.34.0`` downloads that release's wheel once with pip
(``python -m pip download --no-deps --only-binary=:all: vllm==0.34.0``) into
the cache folder ``$C128A_CACHE/vllm-release/0.34.0`` (``$C128A_CACHE``
defaults to ``~/.cache/c128a``), reads ``vllm/models/deepseek_v4/sparse_mla.py``
from it (or, where a release moved it, the one file of the wheel that defines
the function), and writes there an *extract*: only the definitions the
function needs, verbatim, beside stand-ins for the rest of vLLM
(:mod:`c128a.kernels.vllm_release`, which also imports it). Later loads read
the extract alone, so a cache folder copied to a machine without a package
registry (a GPU host) works there as it is.

Beside it go the extracts of the consumers of the builder's views that the
same release ships (:mod:`c128a.kernels.vllm_consumers`); one the release
lacks is named in the target's ``consumer_gaps``.

``vllm-release:PATH`` names a wheel, a source file defining the function, an
extract, or a folder holding an extract or one wheel.

Errors: a spec that names no version and no existing path, or a path that
holds nothing usable, is a :class:`~c128a.failures.TargetSpecError`; a
release that cannot be fetched (no network, pip missing or failing, a version
the index does not have) or whose source no longer reduces to an extract
(the function missing, names the stand-ins do not supply) is a
:class:`~c128a.failures.TargetUnavailable` naming the version and what is
missing (tests that need the target then skip with it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from ..contract import BUILD_FUNCTION
from ..failures import TargetSpecError, TargetUnavailable
from .target import Target

PREFIX = "vllm-release"
CACHE_ENV = "C128A_CACHE"
DEFAULT_CACHE = Path("~/.cache/c128a")
SOURCE_PATH = "vllm/models/deepseek_v4/sparse_mla.py"
EXTRACT_NAME = "c128a_vllm_extract.py"
KERNELS_MODULE = "c128a.kernels.vllm_release"
CONSUMERS_MODULE = "c128a.kernels.vllm_consumers"
PIP_TIMEOUT_S = 1800
VERSION_RE = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")
"""A public release version (PEP 440, without epoch or local part)."""
VERSION_KEY = "vllm-version"


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
    # The kernels' package imports Triton: loaded by name, after the device is
    # chosen, as every kernel target is.
    return importlib.import_module(KERNELS_MODULE)


def _consumers_module():
    return importlib.import_module(CONSUMERS_MODULE)


def _from_version(spec: str, version: str) -> Target:
    folder = _made(spec, cache_folder(version))
    kernels = _kernels()
    extract = folder / EXTRACT_NAME
    with _locked(folder):
        header = kernels.read_header(extract) if extract.exists() else {}
        current = header.get(kernels.FORMAT_KEY) == kernels.EXTRACT_FORMAT
        wheel = cached_wheel(folder, version)
        if not (current and header.get(VERSION_KEY) == version):
            _write_from_wheel(spec, wheel or _download_once(version, folder), version, extract)
        elif wheel is not None and not _consumers_current(folder, version):
            _write_consumers(spec, wheel, version, folder)
    return _target(spec, extract, version)


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
    if path.suffix == ".whl":
        version = _wheel_version(spec, path)
        folder = _made(spec, cache_folder(version))
        extract = folder / EXTRACT_NAME
        with _locked(folder):
            _write_from_wheel(spec, path, version, extract)
        return _target(spec, extract, version)
    if path.suffix == ".py":
        if kernels.is_extract(path):
            return _target(spec, path, kernels.read_header(path).get(VERSION_KEY, "unknown"))
        return _from_source_file(spec, path)
    raise TargetSpecError(
        f"target spec {spec!r}: {path} is not a wheel (.whl), a Python file (.py) or a folder"
    )


def _from_source_file(spec: str, path: Path) -> Target:
    """A vLLM source file (a patched ``sparse_mla.py``, say): extracted into
    the cache beside the releases, under the file's digest."""
    import hashlib

    kernels = _kernels()
    source = _read_text(spec, path)
    if not kernels.defines_builder(source):
        raise TargetSpecError(
            f"target spec {spec!r}: {path} is neither a c128a extract nor a source file "
            f"defining {BUILD_FUNCTION}"
        )
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    folder = _made(spec, cache_root() / PREFIX / f"source-{digest}")
    extract = folder / EXTRACT_NAME
    with _locked(folder):
        _write_extract(spec, source, str(path.resolve()), {VERSION_KEY: "source"}, extract, "source")
    return _target(spec, extract, "source")


def _made(spec: str, folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TargetSpecError(
            f"target spec {spec!r}: cannot create the cache folder {folder} ({exc}); "
            f"set ${CACHE_ENV} to a writable folder"
        ) from exc
    return folder


def _read_text(spec: str, path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetSpecError(f"target spec {spec!r}: cannot read {path} ({exc})") from exc


def _target(spec: str, extract: Path, version: str) -> Target:
    kernels = _kernels()
    try:
        namespace = kernels.load_extract(extract)
    except kernels.ExtractError as exc:
        raise TargetUnavailable(f"{spec} (vLLM {version}): {exc}") from exc
    consumers, gaps = _consumers_module().load_consumers(extract.parent)
    return Target.from_object(spec, namespace, consumers=consumers,
                              consumer_gaps=tuple(gaps.items()))


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


def _write_from_wheel(spec: str, wheel: Path, version: str, extract: Path) -> None:
    try:
        member, source = read_builder_source(wheel, version)
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as exc:
        raise TargetSpecError(f"target spec {spec!r}: cannot read the wheel {wheel} ({exc})") from exc
    header = {VERSION_KEY: version, "wheel": wheel.name}
    _write_extract(spec, source, member, header, extract, version)
    _write_consumers(spec, wheel, version, extract.parent)


def _consumer_extracts(folder: Path) -> list[Path]:
    sources = _consumers_module().SOURCES
    return [folder / file_name for file_name, _ in sources.values()]


def _consumers_current(folder: Path, version: str) -> bool:
    kernels = _kernels()
    for path in _consumer_extracts(folder):
        header = kernels.read_header(path) if path.exists() else {}
        if header.get(kernels.FORMAT_KEY) != kernels.EXTRACT_FORMAT:
            return False
        if header.get(VERSION_KEY) != version:
            return False
    return True


def _write_consumers(spec: str, wheel: Path, version: str, folder: Path) -> None:
    """The consumers' extracts of ``wheel`` beside the builder's (one a
    release lacks is named when the target loads, not an error here)."""
    try:
        _consumers_module().write_extracts(wheel, folder, {VERSION_KEY: version, "wheel": wheel.name})
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as exc:
        raise TargetSpecError(f"target spec {spec!r}: cannot read the wheel {wheel} ({exc})") from exc


def _write_extract(spec, source, origin, header, extract: Path, version: str) -> None:
    kernels = _kernels()
    try:
        made = kernels.make_extract(source, origin, header)
    except kernels.ExtractError as exc:
        raise TargetUnavailable(f"{spec} (vLLM {version}): {exc}") from exc
    kernels.write_extract(made, extract)


@contextlib.contextmanager
def _locked(folder: Path):
    """One process at a time fills a cache folder (pytest-xdist workers and
    fuzz workers load the target together)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(folder / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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


UNAVAILABLE_NAME = ".unavailable"
UNAVAILABLE_FOR_S = 600.0
"""How long a failed download is remembered: every process that loads the
target in that time (each pytest-xdist or fuzz worker) gets the same reason at
once, instead of waiting its turn to try pip again."""


def _download_once(version: str, folder: Path) -> Path:
    """:func:`download_wheel`, or the reason it failed within the last
    :data:`UNAVAILABLE_FOR_S` seconds (kept in the cache folder)."""
    remembered = folder / UNAVAILABLE_NAME
    try:
        if time.time() - remembered.stat().st_mtime < UNAVAILABLE_FOR_S:
            raise TargetUnavailable(remembered.read_text().strip() + " (remembered from an "
                                    f"attempt under {UNAVAILABLE_FOR_S:g} s ago: {remembered})")
    except OSError:
        pass
    try:
        wheel = download_wheel(version, folder)
    except TargetUnavailable as exc:
        try:
            remembered.write_text(f"{exc}\n")
        except OSError:
            pass
        raise
    remembered.unlink(missing_ok=True)
    return wheel


def download_wheel(version: str, folder: Path) -> Path:
    """Fetch vLLM ``version``'s wheel into ``folder`` with pip (no
    dependencies, binary only); :class:`TargetUnavailable` saying why not."""
    requirement = f"vllm=={version}"
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", requirement,
    ]
    aside = Path(tempfile.mkdtemp(prefix=".download-", dir=folder))
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
