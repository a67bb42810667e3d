"""pytest plugin: target and device options, Hypothesis profiles, markers.

Registered through the ``pytest11`` entry point. Importing this module
imports nothing heavy; the device is chosen in ``pytest_configure`` before
any kernel module is imported (Triton's interpreter must be switched on
first), and the target is loaded right after.
"""

from __future__ import annotations

import os

import pytest

from c128a import options

pytest_plugins = ("c128a.plugin.conformance_options",)  # --c128a-cases, --c128a-known-failures

DEVICE_ENV = options.DEVICE_ENV
PADDING_ROWS_OPTION = options.PADDING_ROWS_OPTION.pytest
XDIST_GPU_COUNT_ENV = "C128A_XDIST_GPU_COUNT"  # set by the controller for its workers
HYPOTHESIS_STORAGE_ENV = "HYPOTHESIS_STORAGE_DIRECTORY"  # Hypothesis's own variable
STRICT_SENTINELS_ENV = "C128A_STRICT_SENTINELS"
MARKERS = (
    "cuda: needs a CUDA GPU (--c128a-device=cuda); skipped elsewhere with the reason",
    "graph: CUDA-graph replay tests (emulated on the CPU, real on CUDA)",
    "consumers: pipeline tests: the views fed to the consumers an engine runs on them",
    "compile_keys: every launch's compile key among those its warm-up compiles",
    "applies_to(predicate, why=...): a check only of the targets for which predicate(target) "
    "is true (a check of the project's own code, or of a capability the target does not have: "
    "no keyed launcher, no batch-invariant mode, no jit_functions); deselected for the others "
    "and listed as not applicable (why: what they lack), never skipped (a skipped check is one "
    "that did not run)",
    "slow: long-running (the sanitizer and recompile checks, the serving loop, the mutant "
    "matrix, child processes, real faults); "
    "under xdist scheduled first, beside each other, until the cache has their durations",
)

_state_key = pytest.StashKey[dict]()
_collect_only_storage_key = pytest.StashKey[str | None]()
_guard_key = pytest.StashKey[object]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("c128a", "C128A metadata kernel suite")
    for option in (options.TARGET_OPTION, options.PADDING_ROWS_OPTION, options.DEVICE_OPTION):
        options.add_to_pytest(group, option)
    group.addoption(
        "--c128a-strict-sentinels",
        action="store_true",
        default=None,
        help="also fail CUDA-graph replay tests when a consumer that trusts the -1 "
        "sentinel (not decode_lens) would read stale columns [W, W_capture); off by "
        "default; falls back to $C128A_STRICT_SENTINELS=1",
    )


def resolve_strict_sentinels(option: bool | None, env_value: str | None) -> tuple[bool, str]:
    """(on, where it came from): the flag wins over the environment variable."""
    if option:
        return True, "--c128a-strict-sentinels"
    value = (env_value or "").strip().lower()
    if not value:
        return False, "default"
    if value in ("1", "true", "yes", "on"):
        return True, f"${STRICT_SENTINELS_ENV}"
    if value in ("0", "false", "no", "off"):
        return False, f"${STRICT_SENTINELS_ENV}"
    raise pytest.UsageError(
        f"c128a: invalid value {env_value!r} from ${STRICT_SENTINELS_ENV}; use 1 (on) or 0 (off)"
    )


def strict_sentinels_line(on: bool, origin: str) -> str:
    return f"c128a strict sentinels: {'on' if on else 'off'} (from {origin})"


def header_lines(
    spec: str, origin: str, device: str, interpreter: bool, profile: str
) -> list[str]:
    """The report header, as plain ``key: value`` lines."""
    target = f"c128a target: {spec} (from {origin})"
    device_line = f"c128a device: {device}" + (" (Triton interpreter)" if interpreter else "")
    return [target, device_line, f"c128a hypothesis profile: {profile}"]


def padding_rows_line(variant: str, origin: str) -> str:
    """Header line: the padding-row variant the target is held to, and why."""
    return f"c128a padding rows: {variant} ({origin})"


def load_target_or_refuse(spec: str, origin: str, padding_rows: str | None):
    """The target ``spec`` names, loaded; one that does not load (a bad spec,
    a module that raises or exits while imported, a release that cannot be
    fetched or extracted, vLLM not importable) is a usage error of the run,
    in one line naming the spec and why: a run that cannot exercise its
    target checks nothing and must not pass. Raised in ``pytest_configure``,
    so the controller of an xdist run refuses before any worker starts. A
    ``KeyboardInterrupt`` while it imports (Ctrl-C, or the module raising
    it) ends the run as pytest's interruption, in one line."""
    from c128a.failures import TargetSpecError, TargetUnavailable
    from c128a.targets import load_target

    try:
        return load_target(spec, padding_rows)
    except KeyboardInterrupt:
        pytest.exit(f"c128a: interrupted while importing target {spec!r} (from {origin}): "
                    "KeyboardInterrupt (Ctrl-C, or the module raised it); nothing ran",
                    returncode=pytest.ExitCode.INTERRUPTED)
    except TargetSpecError as exc:
        raise pytest.UsageError(f"c128a: {exc} (from {origin})") from exc
    except TargetUnavailable as exc:
        message = " ".join(str(exc).split())  # one line, whatever pip printed
        raise pytest.UsageError(
            f"c128a: target {spec!r} (from {origin}) does not load, so the run would check "
            f"nothing: {message}"
        ) from exc


def _device_choice(config: pytest.Config) -> str | None:
    return config.getoption("c128a_device") or os.environ.get(DEVICE_ENV) or None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` on a GPU machine: several workers per GPU (about one per
    CPU core, capped by GPU memory; ``$C128A_WORKERS_PER_GPU`` sets it), each
    pinned to one GPU round-robin."""
    if _device_choice(config) == "cpu":
        return None
    from c128a.failures import GpuPinningError
    from c128a.gpu.pinning import visible_gpu_count, workers_per_gpu

    count = visible_gpu_count()
    if not count:
        return None
    try:
        return count * workers_per_gpu(count)
    except GpuPinningError as exc:
        raise pytest.UsageError(f"c128a: {exc}") from exc


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist load``: the longest tests first (:mod:`c128a.plugin.scheduling`)."""
    from c128a.plugin import scheduling

    return scheduling.make_scheduler(config, log) if scheduling.reorders(config) else None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    from c128a.plugin import scheduling

    if scheduling.reorders(node.config):
        node.workerinput[scheduling.WORKER_INPUT_KEY] = True


def checks_of_other_targets(target, items: list[pytest.Item]) -> list[pytest.Item]:
    """The items whose ``applies_to`` predicates exclude ``target``."""
    return [item for item in items
            if any(not marker.args[0](target) for marker in item.iter_markers("applies_to"))]


# Last: the checks -k and -m deselect are not listed as not applicable.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from c128a.plugin import scheduling, verdicts

    target = config.stash[_state_key]["target"]
    others = checks_of_other_targets(target, items)
    verdicts.record_not_applicable(config, others, target)
    if others:
        excluded = set(others)
        items[:] = [item for item in items if item not in excluded]
        config.hook.pytest_deselected(items=others)
    # Every worker sorts the same way, so their collections stay identical.
    if scheduling.worker_sorts(config):
        scheduling.order_longest_first(items, scheduling.cached_durations(config))


def pytest_collection_finish(session: pytest.Session) -> None:
    from c128a.gpu.pinning import freeze_startup_heap

    # Everything collected lives for the session; graph captures' garbage
    # collections need not scan it again.
    freeze_startup_heap()


def pytest_unconfigure(config: pytest.Config) -> None:
    from c128a.gpu.pinning import thaw_heap

    run_guard = config.stash.get(_guard_key, None)
    if run_guard is not None:
        run_guard.finish()
    thaw_heap()
    folder = config.stash.get(_collect_only_storage_key, None)
    if folder is not None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(HYPOTHESIS_STORAGE_ENV, None)


def xdist_worker(config) -> tuple[str, int] | None:
    """(worker id, worker count) in an xdist worker, else None. Read off the
    ``workerinput`` xdist gives a worker's config, not the environment: a
    child process that a test starts inherits ``PYTEST_XDIST_WORKER`` but is
    a controller (or a plain run) of its own."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    return str(workerinput["workerid"]), int(workerinput["workercount"])


def xdist_worker_index(worker_id: str) -> int:
    """``gw3`` -> 3 (pytest-xdist's worker ids)."""
    if not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        raise pytest.UsageError(f"c128a: unexpected xdist worker id {worker_id!r}")
    return int(worker_id[2:])


def pin_xdist_worker(worker_id: str | None, env=os.environ) -> str | None:
    """In xdist worker ``worker_id`` of a GPU run, see only this worker's GPU.

    Runs before anything touches CUDA. Returns the CUDA_VISIBLE_DEVICES value
    set, or None outside a GPU xdist run (nothing changes without xdist).
    """
    gpu_count = env.get(XDIST_GPU_COUNT_ENV)
    if not worker_id or not gpu_count:
        return None
    from c128a.gpu.pinning import gpu_for_worker, pin_to_gpu

    return pin_to_gpu(gpu_for_worker(xdist_worker_index(worker_id), int(gpu_count)), env)


def share_xdist_cores(worker_count: int | None) -> int | None:
    """In an xdist worker (one of ``worker_count``), torch's CPU threads: this
    worker's share of the cores (the oracle and the comparisons run on the
    CPU, on a GPU host too). Returns the thread count set, None outside xdist."""
    if not worker_count:
        return None
    from c128a.gpu.pinning import share_cores

    return share_cores(worker_count)


def xdist_gpu_line(num_workers: int, visible: list[str]) -> str:
    """Header line: which worker runs on which GPU (per GPU, once several share one)."""
    from c128a.gpu.pinning import gpu_for_worker

    if num_workers <= len(visible):
        pairs = ", ".join(
            f"gw{i}->GPU {visible[gpu_for_worker(i, len(visible))]}" for i in range(num_workers)
        )
        return f"c128a xdist GPUs: {pairs}"
    shares = [
        f"GPU {gpu}: " + ", ".join(f"gw{i}" for i in range(num_workers)
                                  if gpu_for_worker(i, len(visible)) == index)
        for index, gpu in enumerate(visible)
    ]
    return f"c128a xdist GPUs ({num_workers} workers sharing {len(visible)}): " + "; ".join(shares)


def _prepare_xdist_gpus(config: pytest.Config, device_choice: str | None) -> str | None:
    """On the controller of a GPU run with workers: tell them how many GPUs there are."""
    workers = config.getoption("numprocesses", None)
    if not isinstance(workers, int) or workers < 1 or xdist_worker(config) is not None:
        return None
    if device_choice == "cpu":
        return None
    from c128a.gpu.pinning import visible_gpu_count, visible_ids

    count = visible_gpu_count()
    if not count:
        return None
    os.environ[XDIST_GPU_COUNT_ENV] = str(count)  # workers inherit the environment
    return xdist_gpu_line(workers, visible_ids() or [str(i) for i in range(count)])


def collect_only_storage(config: pytest.Config, env=os.environ) -> str | None:
    """Under ``--co``, Hypothesis's storage in a temporary folder: collecting
    writes its cache of the tests' constants, and a listing must leave
    nothing in the folder it runs in (no ``.hypothesis/``). Returns the
    folder (xdist workers inherit it), None otherwise or where
    ``$HYPOTHESIS_STORAGE_DIRECTORY`` already names one."""
    if not config.getoption("collectonly", False) or env.get(HYPOTHESIS_STORAGE_ENV):
        return None
    import tempfile

    folder = tempfile.mkdtemp(prefix="c128a-collect-only-hypothesis-")
    env[HYPOTHESIS_STORAGE_ENV] = folder
    return folder


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    # Before anything asks Hypothesis for its storage folder.
    config.stash[_collect_only_storage_key] = collect_only_storage(config)

    from hypothesis import settings

    from c128a.checks import profiles

    profiles.register_profiles()
    profile = config.getoption("hypothesis_profile", None)
    if profile:
        check_profile(profile)
    else:
        # Hypothesis's own plugin loads an explicit --hypothesis-profile later.
        profile = profiles.default_profile()
        settings.load_profile(profile)

    from c128a.failures import DeviceError, GpuPinningError
    from c128a.targets import interpreter_on, use_device

    device_choice = _device_choice(config)
    try:
        # Before anything initialises CUDA in this process.
        worker_id, worker_count = xdist_worker(config) or (None, None)
        pinned_gpu = pin_xdist_worker(worker_id)
        xdist_line = _prepare_xdist_gpus(config, device_choice)
        share_xdist_cores(worker_count)
    except GpuPinningError as exc:
        raise pytest.UsageError(f"c128a: {exc}") from exc
    try:
        device = use_device(device_choice)
    except DeviceError as exc:
        raise pytest.UsageError(f"c128a: {exc}") from exc

    from c128a.failures import TargetSpecError
    from c128a.targets import exits, resolve_padding_rows, resolve_spec

    try:
        spec, origin = resolve_spec(config.getoption("c128a_target"))
        padding_rows, padding_origin = resolve_padding_rows(
            config.getoption("c128a_padding_rows"), PADDING_ROWS_OPTION
        )
    except TargetSpecError as exc:
        raise pytest.UsageError(f"c128a: {exc}") from exc
    # From here to pytest_unconfigure, code that would end the process (the
    # target's import or build calling os._exit, a native library calling
    # exit()) is refused or ends it non-zero, in one line.
    run_guard = exits.guard("the pytest run", f"the import of target {spec!r}",
                            pytest.ExitCode.USAGE_ERROR)
    config.stash[_guard_key] = run_guard
    target = load_target_or_refuse(spec, origin, padding_rows)
    run_guard.doing("the pytest run, outside any test", pytest.ExitCode.TESTS_FAILED)
    strict_sentinels = resolve_strict_sentinels(
        config.getoption("c128a_strict_sentinels"), os.environ.get(STRICT_SENTINELS_ENV)
    )
    from c128a.plugin import scheduling

    if worker_id is None:  # the controller, or a run without xdist
        config.pluginmanager.register(scheduling.DurationRecorder(config), "c128a-durations")
    config.stash[_state_key] = {
        "spec": spec,
        "origin": origin,
        "device": device,
        "interpreter": interpreter_on(),
        "profile": profile,
        "target": target,
        # The override alone (None: the target's declaration), and the variant held to.
        "padding_rows": (padding_rows, padding_origin),
        "padding_rows_line": padding_rows_line(target.padding_rows, padding_origin),
        "strict_sentinels": strict_sentinels,
        "pinned_gpu": pinned_gpu,
        "xdist_line": xdist_line,
    }


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(_state_key, None)
    if state is None:
        return []
    target_line, *others = header_lines(
        state["spec"],
        state["origin"],
        state["device"],
        state["interpreter"],
        state["profile"],
    )
    # The padding-row variant and the widths right under the target they apply to.
    return [target_line, state["padding_rows_line"], widths_line(state["target"]), *others] + [
        strict_sentinels_line(*state["strict_sentinels"])
    ] + ([state["xdist_line"]] if state["xdist_line"] else []) + scheduling_lines(config) + (
        batch_invariant_lines()
    )


def widths_line(target) -> str:
    """Header line: the widths the checks draw W from, and why."""
    from c128a.targets.target import widths_of

    return f"c128a widths: {widths_of(target)}"


def scheduling_lines(config: pytest.Config) -> list[str]:
    from c128a.plugin import scheduling

    return [scheduling.scheduling_line(config)] if scheduling.reorders(config) else []


def batch_invariant_lines() -> list[str]:
    """A loud line when VLLM_BATCH_INVARIANT pins every policy width to C."""
    from c128a.contract.policy import BATCH_INVARIANT_ENV, batch_invariant_from_env

    if not batch_invariant_from_env():
        return []
    return [
        f"c128a batch-invariant mode: ${BATCH_INVARIANT_ENV}={os.environ[BATCH_INVARIANT_ENV]} "
        "pins the policy's W to C; adaptive widths are only tested where a test sets W itself"
    ]


def check_profile(name: str) -> None:
    """An explicit ``--hypothesis-profile`` must name a registered profile:
    refused here in one line (Hypothesis's own plugin, after this one,
    would stop the run with an internal error)."""
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    from c128a.checks.profiles import PROFILES

    try:
        settings.get_profile(name)
    except InvalidArgument:
        raise pytest.UsageError(
            f"c128a: --hypothesis-profile={name!r} names no registered Hypothesis profile; "
            f"c128a registers {', '.join(PROFILES)} (c128a/checks/profiles.py), Hypothesis "
            "'default'; a conftest.py may register others (settings.register_profile)"
        ) from None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """While a test runs, code ending the process is reported naming it."""
    run_guard = item.config.stash.get(_guard_key, None)
    if run_guard is None:
        return (yield)
    from c128a.plugin.verdicts import shown_item

    run_guard.doing(f"test {shown_item(item)}")
    try:
        return (yield)
    finally:
        run_guard.doing("the pytest run, outside any test")


def pytest_runtest_setup(item: pytest.Item) -> None:
    state = item.config.stash[_state_key]
    if item.get_closest_marker("cuda") and state["device"] != "cuda":
        from c128a.conformance.requirements import skip_for_want_of
        from c128a.targets.device import cuda_available

        skip_for_want_of("CUDA", "running with --c128a-device=cpu" if cuda_available()
                         else "no GPU here (torch.cuda.is_available() is False)")


@pytest.fixture(scope="session")
def c128a_pinned_gpu(pytestconfig: pytest.Config) -> str | None:
    """The GPU this xdist worker was pinned to (CUDA_VISIBLE_DEVICES), or None."""
    return pytestconfig.stash[_state_key]["pinned_gpu"]


@pytest.fixture(scope="session")
def c128a_device(pytestconfig: pytest.Config):
    """The torch.device the suite runs on."""
    import torch

    return torch.device(pytestconfig.stash[_state_key]["device"])


@pytest.fixture(scope="session")
def c128a_target(pytestconfig: pytest.Config):
    """The target under test (always loaded: one that does not load stops
    the run before collection)."""
    return pytestconfig.stash[_state_key]["target"]


@pytest.fixture(scope="session")
def c128a_padding_rows_override(pytestconfig: pytest.Config) -> str | None:
    """The padding-row variant ``--c128a-padding-rows`` or ``$C128A_PADDING_ROWS``
    names, or None when the target's own declaration applies (a replayed case
    then uses the variant it recorded)."""
    return pytestconfig.stash[_state_key]["padding_rows"][0]


@pytest.fixture(scope="session")
def c128a_strict_sentinels(pytestconfig: pytest.Config) -> bool:
    """Whether the opt-in stale-sentinel replay check is on (--c128a-strict-sentinels)."""
    return pytestconfig.stash[_state_key]["strict_sentinels"][0]
