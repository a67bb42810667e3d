"""What can go wrong, and what each outcome means: the failure taxonomy.

Every error the suite raises is one of these, and each kind has one meaning
for every runner (pytest, ``c128a fuzz``, ``c128a mutants``, ``c128a replay``):

- :class:`ContractViolation` (an ``AssertionError``): the target broke the
  contract. Its subclasses say how: a check's diff (:class:`InvariantViolation`),
  a captured consumer reading the wrong bytes (:class:`ReplayMismatch`), the
  opt-in stale-sentinel check (:class:`StaleSentinelHazard`), or the target's
  own code raising where the contract expects a result (:class:`TargetRaised`).
  Only these count as a kill; exit status 1.
- :class:`HarnessError`: the suite itself is at fault (one of its own
  invariants broke, it drew a step outside the contract). Never a kill: the
  kill matrix shows it as ``error``; exit status 2.
- :class:`UsageError`: a bad option, spec, path or file, found before any
  work starts where possible; exit status 2.
- :class:`BadArgument` (a ``ValueError``): the project's own builders and
  APIs refuse an argument outside the contract or their rules; nothing was
  written. A target that raises it is doing its job in ``rejects_bad_input``.
"""

from __future__ import annotations

import traceback
from typing import Callable, TypeVar

__all__ = [
    "is_cuda_fault",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "BadArgument",
    "CaseError",
    "ContractViolation",
    "DeviceError",
    "GpuPinningError",
    "HarnessError",
    "InvariantViolation",
    "ReplayMismatch",
    "StaleSentinelHazard",
    "TargetRaised",
    "TargetSpecError",
    "TargetUnavailable",
    "UsageError",
    "call_target",
    "failure_text",
    "is_kill",
    "is_runner_stop",
    "one_line",
]

EXIT_OK = 0
"""Every check held."""
EXIT_FAILED = 1
"""A target failed a check (a :class:`ContractViolation`)."""
EXIT_USAGE = 2
"""A usage or set-up error, or a fault of the suite itself."""

T = TypeVar("T")


# ---------------------------------------------------------------- the target broke the contract


class ContractViolation(AssertionError):
    """The target broke the contract: ``invariant`` names what broke, the
    message (``detail``) is the readable diff."""

    def __init__(self, invariant: str, detail: str):
        self.invariant = invariant
        self.detail = detail
        super().__init__(f"[{invariant}] {detail}")

    def __reduce__(self):  # picklable across worker processes
        return (type(self), (self.invariant, self.detail))


class InvariantViolation(ContractViolation):
    """A check of :mod:`c128a.checks` found a difference from the contract."""


class TargetRaised(ContractViolation):
    """The target's own code (its build or its width policy) raised where the
    contract expects a result; the original exception is the ``__cause__``."""

    def __init__(self, invariant: str, detail: str, original: str = ""):
        self.original = original
        super().__init__(invariant, detail)

    def __reduce__(self):
        return (type(self), (self.invariant, self.detail, self.original))


class ReplayMismatch(ContractViolation):
    """A consumer captured once reads, at a later step, something other than
    what the contract predicts."""

    def __init__(self, detail: str, *, step: int, section: str, row: int, column: int, kind: str):
        self.step, self.section, self.row, self.column, self.kind = step, section, row, column, kind
        super().__init__("replay", detail)

    def __reduce__(self):
        return (_rebuild, (type(self), self.detail, self.__dict__))


class StaleSentinelHazard(ContractViolation):
    """A consumer that trusts the -1 sentinel instead of ``decode_lens`` reads
    stale columns [W, W_capture) (an opt-in check: a hazard, not a contract
    violation, unless asked for)."""

    def __init__(self, detail: str, *, step: int, section: str, row: int, columns: tuple[int, int]):
        self.step, self.section, self.row, self.columns = step, section, row, columns
        super().__init__("stale_sentinel", detail)

    def __reduce__(self):
        return (_rebuild, (type(self), self.detail, self.__dict__))


def _rebuild(cls, detail: str, state: dict):
    error = cls.__new__(cls)
    AssertionError.__init__(error, f"[{state['invariant']}] {detail}")
    error.__dict__.update(state)
    return error


def call_target(invariant: str, what: str, function: Callable[..., T], *args, **kwargs) -> T:
    """Call the target's own ``function``; whatever it raises becomes a
    :class:`TargetRaised` naming ``what`` was called (a check that expects an
    exception calls the target directly instead): any ``BaseException``
    (pytest's ``Skipped`` would otherwise skip the check, a class of the
    target's own end the run), except ``SystemExit`` and a stop of the run
    (:func:`is_runner_stop`)."""
    try:
        return function(*args, **kwargs)
    except ContractViolation:
        raise
    except BaseException as exc:  # noqa: BLE001 - pytest's Skipped, GeneratorExit, its own class
        if is_runner_stop(exc) or isinstance(exc, SystemExit):
            raise  # a process ending on purpose is the runner's to handle too
        raise target_raised(invariant, what, exc) from exc


def is_runner_stop(exc: BaseException) -> bool:
    """Whether ``exc``, raised while the target's code ran, is a stop of the
    run rather than the target's doing: Ctrl-C (``KeyboardInterrupt``), or a
    ``BaseException`` class of c128a's own, which its runners raise from a
    signal handler or a timer to stop (a fuzz worker's stop, a replay's
    interruption)."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return not isinstance(exc, Exception) and type(exc).__module__.partition(".")[0] == "c128a"


def target_raised(invariant: str, what: str, exc: BaseException) -> "TargetRaised":
    """The :class:`TargetRaised` for ``exc``, raised by the target's ``what``."""
    original = f"{type(exc).__name__}: {exc}"
    return TargetRaised(invariant, f"the target's {what} raised {original}", original)


def is_kill(exc: BaseException) -> bool:
    """Whether ``exc`` shows the target broke the contract (a kill), rather
    than a fault of the suite or its set-up. A group of several failures
    (Hypothesis's ``report_multiple_bugs``) kills when any of them does."""
    if isinstance(exc, BaseExceptionGroup):
        return any(is_kill(inner) for inner in exc.exceptions)
    return isinstance(exc, ContractViolation)


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (a usage error's message is one line)."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def failure_text(exc: BaseException) -> str:
    """``Type: message`` for a report; for a message-less exception (a bare
    ``assert``) the last traceback frame, the only description there is."""
    text = f"{type(exc).__name__}: {exc}"
    if not str(exc).strip():
        text += "\n" + "".join(traceback.format_exception(exc, limit=-1)).rstrip()
    return text


# ---------------------------------------------------------------- the suite's own fault


class HarnessError(Exception):
    """The suite itself is at fault: one of its own invariants broke. Never a
    kill; report it as an error."""


# ---------------------------------------------------------------- bad arguments and usage


class BadArgument(ValueError):
    """An argument breaks the contract or a c128a API's rule; nothing was written."""


class UsageError(Exception):
    """A bad option, spec, path or file: the run cannot start (exit status 2)."""


class TargetSpecError(UsageError):
    """The spec does not name a usable target."""


class TargetUnavailable(UsageError):
    """The target exists but cannot be loaded here (vLLM not installed)."""


class DeviceError(UsageError):
    """The requested device cannot be used in this process."""


class GpuPinningError(UsageError):
    """A worker cannot be pinned to a GPU as asked."""


class CaseError(UsageError, ValueError):
    """A case file is malformed; the message names the file, the field and the rule."""

    def __init__(self, path, field: str, rule: str):
        self.path, self.field, self.rule = path, field, rule
        where = f"{path}: " if path is not None else ""
        super().__init__(f"{where}field {field!r}: {rule}")

    def __reduce__(self):
        return (type(self), (self.path, self.field, self.rule))


def is_cuda_fault(exc: BaseException | None) -> bool:
    """A CUDA error (illegal address, launch failure, device-side assert),
    here or as the cause of a wrapped failure: the process's CUDA context is
    unusable after it. torch raises it at the next synchronisation after the
    kernel that faulted, wherever that is."""
    while exc is not None:
        if type(exc).__name__ == "AcceleratorError" or (
            isinstance(exc, RuntimeError) and "CUDA error" in str(exc)
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
