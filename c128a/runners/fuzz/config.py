"""What a fuzz run is told: its options (command line and ``--config`` file
alike), and the resolved configuration its workers receive."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import random
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ...cases import SERVING_LOOP
from ...checked import load_machine, load_properties
from ...checks.profiles import PROFILES
from ...contract import MAX_QUERY_TOKENS_PER_DECODE, PaddingRows
from ...failures import CaseError, GpuPinningError, UsageError
from ...files import output_file_problem, regular_file_problem
from ...gpu.pinning import usable_cores, visible_gpu_count, workers_per_gpu
from ... import options as shared
from ...options import (
    DEFAULT_CASES_DIR,
    DEFAULT_CHUNK,
    DEFAULT_DB,
    DEFAULT_EXAMPLE_TIMEOUT_S,
    DEFAULT_FUZZ_PROFILE,
    DEFAULT_MACHINE,
    DEFAULT_MINUTES,
    DEFAULT_PROPERTIES,
    DEFAULT_TARGET,
)
from ...step import MAX_BUFFER_ROWS
from ...step.schema import read_value, type_hints

CONFIG_TABLE = "fuzz"
MAX_MINUTES = 7 * 24 * 60  # a week: longer is better run as several runs, each with its report
MAX_EXAMPLE_TIMEOUT_S = 24 * 60 * 60  # a day: past that a stopped run would wait for it
WORKERS_PER_CORE = 4  # more only contend for the cores (the default is about one a core)
MAX_STEP_TOKENS = MAX_BUFFER_ROWS - MAX_QUERY_TOKENS_PER_DECODE
"""The largest --max-tokens: the strategies' own bound (c128a.strategies.batches)."""
MAX_WORKERS = 256  # however many cores: the parent holds pipes to every worker and polls them


@dataclass(frozen=True)
class FuzzOption:
    """How the command line gives a fuzz option of its own: ``--NAME`` (and
    ``short``), read by ``type`` or taken as a switch (``action``)."""

    help: str
    metavar: str | None = None
    type: Callable | None = None
    action: Any = None
    short: str | None = None

    def add_to(self, parser: argparse.ArgumentParser, name: str) -> None:
        """Add it to ``parser``; its value stays None when not given (the
        ``--config`` file may give it, else :class:`FuzzConfig` has its default)."""
        names = [cli_name(name)] if self.short is None else [self.short, cli_name(name)]
        extra = {"action": self.action} if self.action else {"type": self.type,
                                                               "metavar": self.metavar}
        parser.add_argument(*names, default=None, help=self.help, **extra)


def _fuzz(help: str, **how):
    """A field of :class:`FuzzOptions` that is ``c128a fuzz``'s own option."""
    return field(default=None, metadata={"fuzz": FuzzOption(help, **how)})


def _shared(option: shared.Option):
    """A field of :class:`FuzzOptions` declared in :mod:`c128a.options`."""
    return field(default=None, metadata={"shared": option})


def option_names(text: str) -> tuple[str, ...]:
    """``--only``'s value: names separated by commas. Empty names are kept:
    :func:`resolve` refuses them, naming the option."""
    return tuple(name.strip() for name in text.split(","))


@dataclass(frozen=True)
class FuzzOptions:
    """Every option of ``c128a fuzz``, as given: None where not given. The
    command line and the ``[fuzz]`` table of a ``--config`` file both give
    these; the file's keys are these names (``-`` or ``_``), each read
    against its annotation. Each is declared here once: its name, type and
    command-line help (an option the CLI and pytest share, in
    :mod:`c128a.options`; the target's three, by
    :func:`c128a.cli.common.add_target_arguments`)."""

    target: str | None = None
    padding_rows: PaddingRows | None = None
    device: str | None = None
    minutes: float | None = _fuzz(
        f"run for M minutes (fractions allowed); the default without --max-examples is "
        f"{DEFAULT_MINUTES:g}", type=float, metavar="M")
    max_examples: int | None = _fuzz(
        "stop after N generated examples in all (shared among the workers); the properties' "
        "historical steps, run once in each worker, and shrinking come on top: the report's "
        "totals say how many ran", type=int, metavar="N")
    max_tokens: int | None = _fuzz(
        "draw engine steps of up to N tokens (more requests, longer prefill chunks; default: "
        "each property's own size, 32 for most)", type=int, metavar="N")
    seed: int | None = _fuzz("seed of the whole run (default: random, reported)", type=int)
    workers: int | None = _fuzz(
        "worker processes (default: about one per core, on CUDA shared among the GPUs; "
        "$C128A_WORKERS_PER_GPU sets the share)", type=int, metavar="K")
    db: str | None = _fuzz(f"Hypothesis example database (default {DEFAULT_DB}; 'none' for none)",
                           metavar="PATH|redis://HOST:PORT/N")
    cases_dir: str | None = _shared(shared.CASES_DIR_OPTION)
    report: str | None = _fuzz("write the JSON report here", metavar="FILE")
    example_timeout: float | None = _fuzz(
        f"kill and restart a worker whose example runs longer (default "
        f"{DEFAULT_EXAMPLE_TIMEOUT_S:g})", type=float, metavar="S")
    exitfirst: bool | None = _fuzz("stop at the first failure", action="store_true", short="-x")
    profile: str | None = _fuzz(
        f"Hypothesis profile the rounds derive from (default {DEFAULT_FUZZ_PROFILE})")
    chunk: int | None = _fuzz(
        f"examples per Hypothesis round before the next property (default {DEFAULT_CHUNK})",
        type=int, metavar="N")
    only: tuple[str, ...] | None = _fuzz(
        "comma-separated properties to run (serving_loop: the machine)", type=option_names,
        metavar="NAMES")
    stateful: bool | None = _fuzz("run the serving-loop machine too (default: yes)",
                                  action=argparse.BooleanOptionalAction)
    properties: str | None = _shared(shared.PROPERTIES_OPTION)
    machine: str | None = _shared(shared.MACHINE_OPTION)
    live: bool | None = _fuzz("live status display (default: when stderr is a terminal)",
                              action=argparse.BooleanOptionalAction)

    def over(self, fallback: "FuzzOptions") -> "FuzzOptions":
        """These options, with ``fallback``'s where these are None."""
        return FuzzOptions(**{
            f.name: getattr(self, f.name) if getattr(self, f.name) is not None
            else getattr(fallback, f.name)
            for f in fields(self)
        })


@dataclass(frozen=True)
class FuzzConfig:
    """Everything a run needs; picklable, so spawned workers receive it whole."""

    target: str = DEFAULT_TARGET
    # The padding-row variant the workers hold the target to (None: its own).
    padding_rows: str | None = None
    device: str = "cpu"
    minutes: float | None = None
    max_examples: int | None = None
    max_tokens: int | None = None  # None: each property's default step size
    seed: int = 0
    workers: int = 1
    db: str = DEFAULT_DB
    cases_dir: str = DEFAULT_CASES_DIR
    report: str | None = None
    example_timeout: float = DEFAULT_EXAMPLE_TIMEOUT_S
    exitfirst: bool = False
    profile: str = DEFAULT_FUZZ_PROFILE
    chunk: int = DEFAULT_CHUNK
    only: tuple[str, ...] = ()
    stateful: bool = True
    properties: str = DEFAULT_PROPERTIES
    machine: str | None = DEFAULT_MACHINE
    gpu_count: int = 0
    max_restarts: int = 25
    live: bool | None = None  # None: a live display when stderr is a terminal


def cli_name(name: str) -> str:
    """``--max-examples`` for the option ``max_examples``."""
    return f"--{name.replace('_', '-')}"


def load_config_file(path: str, keys: dict[str, str] | None = None) -> FuzzOptions:
    """The ``[fuzz]`` table of a TOML file, every key checked against
    :class:`FuzzOptions` (a :class:`~c128a.failures.UsageError` names the
    file, the key and the rule). ``keys``, when given, receives each option
    the file sets and its key as written there (``max-examples``)."""
    if (problem := regular_file_problem(path)) is not None:
        raise UsageError(f"--config {path}: {problem}")
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"--config {path}: cannot read: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: not TOML: {exc}") from exc
    others = sorted(set(data) - {CONFIG_TABLE})
    if others:
        raise UsageError(
            f"--config {path}: unknown {', '.join(others)} at the top level; the only table "
            f"read is [{CONFIG_TABLE}]"
        )
    table = data.get(CONFIG_TABLE, {})
    if not isinstance(table, dict):
        raise UsageError(
            f"--config {path}: {CONFIG_TABLE} = {table!r} must be a table: write [{CONFIG_TABLE}] "
            "and the options under it"
        )
    known = {f.name: f for f in fields(FuzzOptions)}
    values: dict[str, Any] = {}
    written, keys = keys, {}  # option -> its key as written
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            raise UsageError(
                f"--config {path}: unknown key {CONFIG_TABLE}.{key}; known: {', '.join(known)}"
            )
        if name in keys:
            # TOML sees two keys; one would silently win over the other.
            raise UsageError(
                f"--config {path}: {CONFIG_TABLE}.{keys[name]} and {CONFIG_TABLE}.{key} set the "
                "same option; keep one of them"
            )
        keys[name] = key
        if written is not None:
            written[name] = key
        if name == "only" and isinstance(value, str):
            value = [part.strip() for part in value.split(",")]
        try:
            values[name] = read_value(
                type_hints(FuzzOptions)[name], value, None, f"{CONFIG_TABLE}.{key}"
            )
        except CaseError as exc:
            raise UsageError(f"--config {path}: {CONFIG_TABLE}.{key}={value!r}: {exc.rule}") from exc
    return FuzzOptions(**values)


def derive_seed(seed: int, *parts: int) -> int:
    """A 32-bit seed for one worker round: reproducible from ``--seed`` alone."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def default_workers(device: str) -> tuple[int, int]:
    """(workers, GPUs): on CUDA, several per visible GPU (as ``pytest -n auto``:
    :func:`~c128a.gpu.pinning.workers_per_gpu`), pinned round-robin; one per
    usable core on the CPU."""
    if device == "cuda":
        gpus = visible_gpu_count()
        if not gpus:
            return 1, 0
        try:
            return gpus * workers_per_gpu(gpus), gpus
        except GpuPinningError as exc:
            raise UsageError(str(exc)) from exc
    return usable_cores(), 0


def resolve(
    options: FuzzOptions, *, target: str, device: str, padding_rows: str | None = None,
    name_of=cli_name,
) -> FuzzConfig:
    """The run's configuration from the given options (target, its
    padding-row variant and device already resolved and loaded); a
    :class:`~c128a.failures.UsageError` for any option outside its rule,
    naming the option as ``name_of(field)`` says (a ``--config`` file's key
    for an option the file set)."""
    workers, gpus = default_workers(device)
    if options.workers is not None:
        cores = usable_cores()
        most = min(WORKERS_PER_CORE * cores, MAX_WORKERS)
        if not 1 <= options.workers <= most:
            raise UsageError(
                f"{name_of('workers')}={options.workers} must be >= 1 and <= {most} "
                f"({WORKERS_PER_CORE} a core, {cores} cores here; never more than {MAX_WORKERS}): "
                "more only contend for the cores"
            )
        workers = options.workers
    for name, most, span in (("minutes", MAX_MINUTES, "a week"),
                             ("example_timeout", MAX_EXAMPLE_TIMEOUT_S, "a day")):
        value = getattr(options, name)
        if value is not None and not (value > 0 and math.isfinite(value) and value <= most):
            raise UsageError(
                f"{name_of(name)}={value} must be a finite number > 0 and <= {most} "
                f"({span})"
            )
    for name in ("max_examples", "chunk", "max_tokens"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise UsageError(f"{name_of(name)}={value} must be >= 1")
    if options.max_tokens is not None and options.max_tokens > MAX_STEP_TOKENS:
        # Whatever the strategies draw, a case must hold it.
        raise UsageError(
            f"{name_of('max_tokens')}={options.max_tokens} must be <= {MAX_STEP_TOKENS}: "
            f"a saved case holds steps of up to {MAX_BUFFER_ROWS} buffer rows (the tokens and up to "
            f"{MAX_QUERY_TOKENS_PER_DECODE} padding tokens)"
        )
    for name, what in (("cases_dir", "a folder"), ("report", "a file"),
                       ("db", "a folder, redis://HOST:PORT/N, or none for no database")):
        if getattr(options, name) == "":
            # An empty path is the current folder to some calls and nothing to others.
            raise UsageError(f"{name_of(name)}='' is an empty path; name {what}")
    properties = options.properties or DEFAULT_PROPERTIES
    known = load_properties(properties, name_of("properties"))
    if not isinstance(known, dict):
        raise UsageError(
            f"{name_of('properties')} {properties} is a {type(known).__name__}, not a dict"
        )
    if options.only is not None and (not options.only or not all(options.only)):
        # An empty --only ran every property: the opposite of what was asked.
        raise UsageError(
            f"{name_of('only')}={','.join(options.only)!r} names an empty property; give names "
            f"separated by commas, e.g. --only matches_oracle,{SERVING_LOOP}"
        )
    unknown = sorted(set(options.only or ()) - set(known) - {SERVING_LOOP})
    if unknown:
        raise UsageError(
            f"{name_of('only')} names unknown properties {', '.join(unknown)}; known: "
            f"{', '.join([*known, SERVING_LOOP])}"
        )
    if options.machine:
        factory = load_machine(options.machine, name_of("machine"))
        if not callable(factory):
            # Called with the target once it has loaded, before any worker
            # starts (c128a.runners.fuzz.loading).
            raise UsageError(
                f"{name_of('machine')} {options.machine} is a {type(factory).__name__}, not "
                "callable: name a machine factory, which takes the target and the device and "
                "returns a RuleBasedStateMachine class"
            )
    profile = options.profile or DEFAULT_FUZZ_PROFILE
    if profile not in PROFILES:
        raise UsageError(
            f"{name_of('profile')}={profile!r} is not one of {', '.join(PROFILES)} "
            "(c128a/checks/profiles.py)"
        )
    if (options.db or "").startswith("redis://"):
        try:
            import redis  # noqa: F401
        except ImportError as exc:
            raise UsageError(
                f"{name_of('db')} {options.db} needs the redis client: pip install -e '.[redis]'"
            ) from exc
    minutes = options.minutes
    if minutes is None and options.max_examples is None:
        minutes = DEFAULT_MINUTES
    seed = options.seed if options.seed is not None else random.SystemRandom().getrandbits(32)
    given = {
        name: getattr(options, name)
        for name in ("max_examples", "max_tokens", "db", "cases_dir", "report", "example_timeout",
                     "exitfirst", "chunk", "only", "stateful", "properties", "machine", "live")
        if getattr(options, name) is not None
    }
    config = FuzzConfig(
        target=target, padding_rows=padding_rows, device=device, minutes=minutes, seed=seed,
        workers=workers, profile=profile, gpu_count=gpus, **given,
    )
    return dataclasses.replace(
        config, example_timeout=float(config.example_timeout), machine=config.machine or None
    )


def _writable_folder(path: Path, option: str) -> None:
    """Create ``path`` if needed and write a file in it, or a UsageError naming ``option``."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".c128a-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {path} is not writable: {exc.strerror or exc}") from exc


UNIX_SOCKET_PATH_MAX = 107
"""The longest path of a Unix socket Linux binds (sun_path's 108 bytes, one a NUL)."""

FORKSERVER_SOCKET_SUFFIX = len("/pymp-12345678/listener-12345678")
"""What multiprocessing's fork server adds to the temporary folder for its socket."""


def _check_socket_folder(folder: str) -> None:
    """The workers' fork server listens on a Unix socket in the temporary
    folder; past Linux's path limit its bind fails after the run has
    started, so refuse such a folder now, saying which and how to fix it."""
    longest = UNIX_SOCKET_PATH_MAX - FORKSERVER_SOCKET_SUFFIX
    if len(os.fsencode(folder)) > longest:
        raise UsageError(
            f"the temporary folder {folder} is {len(os.fsencode(folder))} bytes long; the "
            f"workers' fork server binds a Unix socket in it, which allows at most {longest}: "
            "set TMPDIR to a shorter folder (e.g. TMPDIR=/tmp)"
        )


def check_paths(config: FuzzConfig, name_of=cli_name) -> None:
    """Every path of the run checked before any worker starts, each failure a
    :class:`~c128a.failures.UsageError` naming its option: the cases folder,
    the report's folder, and the example database (a folder that can be
    written, or a Redis that answers); and the temporary folder, whose path
    must leave room for the fork server's socket."""
    _writable_folder(Path(config.cases_dir), name_of("cases_dir"))
    _check_socket_folder(tempfile.gettempdir())
    if config.report:
        report = Path(config.report)
        if report.is_dir():
            raise UsageError(f"{name_of('report')} {report} is a folder; name a file")
        _writable_folder(report.parent, f"{name_of('report')} {report}: its folder")
        # The report is written last, replacing what is there: found now, not
        # after the run (a name too long for its temporary file, a FIFO).
        if (problem := output_file_problem(report)) is not None:
            raise UsageError(f"{name_of('report')}={report}: {problem}")
    db = config.db
    if not db or db == "none":
        return
    if db.startswith("redis://"):
        import redis  # an optional dependency: checked by resolve()

        try:
            redis.Redis.from_url(db, socket_connect_timeout=3, socket_timeout=3).ping()
        except (redis.RedisError, OSError, ValueError) as exc:
            raise UsageError(f"{name_of('db')} {db} does not answer: {exc}") from exc
        return
    _writable_folder(Path(db), name_of("db"))
