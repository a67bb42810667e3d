"""The options the ``c128a`` command line and the pytest plugin share, each
defined once: its name in each front end, environment variable, choices,
default and help. The front ends add them with :func:`add_to_argparse` and
:func:`add_to_pytest`, so that their help and defaults cannot drift apart.

Also the fuzz runner's defaults that several commands show or use (the
example database, the run's length, where cases go, the property mapping,
the serving-loop machine): the options, the ``--config`` file's resolution
and case replay read them from here.

Importing this module imports neither argparse's nor pytest's front end:
each adapter takes the parser or option group it adds to.
"""

from __future__ import annotations

from dataclasses import dataclass

from .contract.padding_rows import PADDING_ROWS
from .failures import UsageError

TARGET_ENV = "C128A_TARGET"
PADDING_ROWS_ENV = "C128A_PADDING_ROWS"
DEVICE_ENV = "C128A_DEVICE"
ALLOW_NOT_RUN_ENV = "C128A_ALLOW_NOT_RUN"
DEFAULT_TARGET = "triton"
DEVICES = ("cuda", "cpu")

DEFAULT_DB = ".hypothesis/fuzz"
DEFAULT_MINUTES = 1.0
DEFAULT_CASES_DIR = "c128a-cases"  # in the folder c128a runs in; a kernel repository commits it
DEFAULT_PROPERTIES = "c128a.checks:PROPERTIES"
DEFAULT_MACHINE = "c128a.replay:serving_loop_machine"
DEFAULT_EXAMPLE_TIMEOUT_S = 300.0
DEFAULT_FUZZ_PROFILE = "fuzz"
DEFAULT_CHUNK = 25
DEFAULT_GRAPH_LAUNCHES = 100  # c128a bench: launches captured into one CUDA graph
DEFAULT_GRAPH_REPLAYS = 10  # c128a bench: replays of that graph, their median the graph clock


@dataclass(frozen=True)
class Option:
    """One option as every front end shows it.

    ``cli`` and ``pytest`` are its names there (None: that front end has no
    such option); ``env`` the environment variable it falls back to;
    ``default`` the value used when neither gives one (None: resolved later,
    as ``when_unset`` says)."""

    dest: str
    help: str
    cli: str | None = None
    pytest: str | None = None
    env: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    default: object = None
    when_unset: str | None = None
    """What applies when neither the option nor ``env`` names a value, where
    that is not simply ``default``."""
    flag: bool = False
    """An on/off switch: the option takes no value; ``env`` says 1 or 0."""

    @property
    def help_text(self) -> str:
        """The help every front end prints: what it does, then where its
        value comes from when it is not given."""
        fallbacks = [f"${self.env}"] if self.env else []
        if self.when_unset:
            fallbacks.append(self.when_unset)
        elif self.default is not None:
            fallbacks.append(f"{self.default:g}" if isinstance(self.default, float)
                             else str(self.default))
        return f"{self.help}; default: {', else '.join(fallbacks)}" if fallbacks else self.help


TARGET_OPTION = Option(
    dest="target",
    cli="--target",
    pytest="--c128a-target",
    env=TARGET_ENV,
    metavar="SPEC",
    help="implementation under test: triton, triton-inert, reference, reference-inert, vllm, "
    "vllm-release:VERSION|PATH, vllm-source:CHECKOUT[@REF], MODULE or MODULE:ATTR",
    when_unset=DEFAULT_TARGET,
)
PADDING_ROWS_OPTION = Option(
    dest="padding_rows",
    cli="--padding-rows",
    pytest="--c128a-padding-rows",
    env=PADDING_ROWS_ENV,
    choices=PADDING_ROWS,
    help="hold the target to this padding-row variant: slots (a padding token's decode "
    "row holds real slot ids, vLLM 0.33/0.34) or inert (the row is -1 in every column < W)",
    when_unset="what the target declares (slots where it declares none)",
)
DEVICE_OPTION = Option(
    dest="device",
    cli="--device",
    pytest="--c128a-device",
    env=DEVICE_ENV,
    choices=DEVICES,
    help="where kernels run",
    when_unset="CUDA when available, else the CPU under Triton's interpreter",
)
CASES_DIR_OPTION = Option(
    dest="cases_dir",
    cli="--cases-dir",
    metavar="DIR",
    default=DEFAULT_CASES_DIR,
    help="where failure cases are written",
)
PROPERTIES_OPTION = Option(
    dest="properties",
    cli="--properties",
    metavar="MODULE:ATTR",
    default=DEFAULT_PROPERTIES,
    help="the property mapping: the properties fuzz runs and saved cases name",
)
MACHINE_OPTION = Option(
    dest="machine",
    cli="--machine",
    metavar="MODULE:ATTR",
    default=DEFAULT_MACHINE,
    help="serving-loop machine factory",
)

ALLOW_NOT_RUN_OPTION = Option(
    dest="allow_not_run",
    pytest="--c128a-allow-not-run",
    env=ALLOW_NOT_RUN_ENV,
    flag=True,
    help="let a conformance run pass though checks of the target did not run for a reason "
    "other than a missing device or tool (CUDA, compute-sanitizer); they are still counted "
    "and named in the summary",
    when_unset="off: such a check fails the run",
)

CHECK_TIMEOUT_ENV = "C128A_CHECK_TIMEOUT"
DEFAULT_CHECK_TIMEOUT_S = 900.0
CHECK_TIMEOUT_OPTION = Option(
    dest="check_timeout",
    pytest="--c128a-check-timeout",
    env=CHECK_TIMEOUT_ENV,
    metavar="SECONDS",
    help="end a conformance check that runs longer than this (its process ends, naming it; "
    "a check stuck in native code included); 0: no limit",
    when_unset=f"pytest-timeout's --timeout, $PYTEST_TIMEOUT or ini timeout plus 30 where one "
    f"is set (its own method acts first), else {DEFAULT_CHECK_TIMEOUT_S:g}",
)

SHARED_OPTIONS = (
    TARGET_OPTION, PADDING_ROWS_OPTION, DEVICE_OPTION, CASES_DIR_OPTION, PROPERTIES_OPTION,
    MACHINE_OPTION,
)


def add_to_argparse(parser, option: Option, *, unset_is_none: bool = False) -> None:
    """Add ``option`` to an argparse ``parser`` under its ``cli`` name.
    ``unset_is_none``: its value stays None when not given (another source,
    such as ``c128a fuzz --config``, may give it), whatever its default."""
    assert option.cli is not None, f"{option.dest} has no command-line name"
    parser.add_argument(
        option.cli,
        dest=option.dest,
        metavar=option.metavar,
        choices=option.choices,
        default=None if unset_is_none else option.default,
        help=option.help_text,
    )


def add_to_pytest(group, option: Option) -> None:
    """Add ``option`` to a pytest option ``group`` under its ``pytest`` name;
    its value is None when not given (the plugin reads ``env`` then)."""
    assert option.pytest is not None, f"{option.dest} has no pytest name"
    if option.flag:
        group.addoption(option.pytest, action="store_true", default=None, dest=option.dest,
                        help=option.help_text)
        return
    group.addoption(
        option.pytest,
        metavar=option.metavar,
        choices=option.choices,
        default=None,
        help=option.help_text,
    )


FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off")


def resolve_flag(option: Option, given: bool | None, environ) -> tuple[bool, str]:
    """(on, where it came from) of a flag option: given on the command line,
    else its environment variable (1 or 0), else off. Any other value of the
    variable is a :class:`~c128a.failures.UsageError` naming it."""
    assert option.flag and option.env, f"{option.dest} is not a flag with a variable"
    if given:
        return True, option.pytest or option.cli or option.dest
    raw = environ.get(option.env, "")
    value = raw.strip().lower()
    if not value:
        return False, "default"
    if value in FLAG_ON:
        return True, f"${option.env}"
    if value in FLAG_OFF:
        return False, f"${option.env}"
    raise UsageError(f"invalid value {raw!r} from ${option.env}; use 1 (on) or 0 (off)")
