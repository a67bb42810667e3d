"""Every use of a private Hypothesis name, each behind one small function.

Hypothesis may rename or remove what it does not publish in any release, so
nothing else in the package touches ``hypothesis.internal``, a
``_hypothesis_internal*`` attribute or a private attribute of a Hypothesis
object: it calls one of these functions. ``tests/test_hypothesis_private.py``
has a test per touch that fails naming the private name and the Hypothesis
version; run it first when widening the Hypothesis range in
``pyproject.toml``.

The touches, and why nothing public does the job (as of Hypothesis 6.170):

- :func:`add_digest`: the ``_hypothesis_internal_add_digest`` attribute of a
  test function, which Hypothesis adds to the function's digest. Every
  property's test has the same source, so without it every property would
  share one example-database key and one ``derandomize`` seed. Hypothesis
  has no public way to name a test's database key or derandomised seed.
- :func:`drawn_seconds`: ``current_build_context().data.draw_times``, the
  draw time Hypothesis keeps for every example anyway. Its observations
  report the same seconds publicly (``timing["generate:..."]``), but only
  with observability on, which costs every example more than this reading.
- :func:`blob_misfit`: ``current_build_context().data.misaligned_at``, set
  when a ``@reproduce_failure`` blob's choice does not fit what the test
  draws. Hypothesis then draws the simplest value and says so nowhere else.
- :class:`FailureObserver`: ``hypothesis.internal.observability``'s
  ``add_observability_callback``/``remove_observability_callback`` and
  ``OBSERVABILITY_COLLECT_COVERAGE``, and the ``@reproduce_failure(...)``
  text of an observation's ``metadata.reproduction_decorator``. These are
  Hypothesis's documented observability interface, but importable only from
  that internal module. The final failure's blob is also in the raised
  exception's notes (``settings(print_blob=True)``), but only once shrinking
  is over, as prose no more stable than the decorator text; a fuzz worker
  needs the first failure's blob before shrinking starts, which only an
  observation gives.

Public API used instead: a blob is replayed with ``hypothesis.reproduce_failure``
and ``hypothesis.__version__`` names the version; nothing here decodes a blob.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

from hypothesis import __version__ as HYPOTHESIS_VERSION
from hypothesis.control import current_build_context
from hypothesis.errors import InvalidArgument
from hypothesis.internal import observability


def add_digest(function: Callable, key: str) -> None:
    """Make ``key`` part of ``function``'s Hypothesis digest, before
    ``@given`` wraps it: its example-database key and its seed under
    ``derandomize=True`` then differ from those of any function with another
    ``key``, though their source is the same."""
    function._hypothesis_internal_add_digest = key.encode()


def _running_data():
    """The running example's ``ConjectureData``; None outside an example."""
    try:
        return getattr(current_build_context(), "data", None)
    except InvalidArgument:  # no example is running
        return None


def drawn_seconds() -> float:
    """Seconds Hypothesis has spent drawing the running example so far (GC
    excluded): its own timing (the top-level draws and a state machine's
    rule draws), which its observations report as ``timing["generate:..."]``.
    Always recorded, so reading it costs nothing more; 0.0 outside an example
    or where Hypothesis no longer has it."""
    draw_times = getattr(_running_data(), "draw_times", None)
    if draw_times is None:
        return 0.0
    return math.fsum(draw_times.values())


def blob_misfit() -> str | None:
    """Why the example running now is not the one its pinned blob records;
    None when it is. Where a blob's choice does not fit what the test draws,
    Hypothesis draws the simplest value instead and says so only in its
    ConjectureData: a pass would then be of an example nobody recorded."""
    misaligned = getattr(_running_data(), "misaligned_at", AttributeError)
    if misaligned is AttributeError:
        return (f"hypothesis {HYPOTHESIS_VERSION} does not say whether the blob's choices fit "
                "the test (ConjectureData.misaligned_at), so a pass would prove nothing")
    if misaligned is None:
        return None
    index, choice_type = misaligned[0], misaligned[1]
    return (f"its choice {index} does not fit the {choice_type} the test draws there, so "
            f"Hypothesis drew the simplest {choice_type} instead: the example that ran is not "
            "the one recorded")


def reproduce_blob(decorator: str) -> str:
    """The blob of a ``@reproduce_failure(VERSION, BLOB)`` text, as a str
    (what a case file keeps, and ``reproduce_failure`` takes encoded)."""
    call = ast.parse(decorator.lstrip("@"), mode="eval").body
    return ast.literal_eval(call.args[1]).decode()


class FailureObserver:
    """While started, calls ``on_failure(blob, representation)`` for every
    failing test case Hypothesis runs on this thread: the shrink steps and
    the final minimal one, ``blob`` None where Hypothesis gives none.
    Observing costs a little per example; coverage, which it would otherwise
    trace line by line, stays off while started (the switch Hypothesis
    exposes for that) and is restored by ``stop``."""

    def __init__(self, on_failure: Callable[[str | None, str], None]):
        self.on_failure = on_failure
        self.on = False
        self._coverage = observability.OBSERVABILITY_COLLECT_COVERAGE

    def start(self) -> None:
        if not self.on:
            self._coverage = observability.OBSERVABILITY_COLLECT_COVERAGE
            observability.OBSERVABILITY_COLLECT_COVERAGE = False
            observability.add_observability_callback(self._observe)
            self.on = True

    def stop(self) -> None:
        if self.on:
            observability.remove_observability_callback(self._observe)
            observability.OBSERVABILITY_COLLECT_COVERAGE = self._coverage
            self.on = False

    def _observe(self, observation) -> None:
        if getattr(observation, "type", None) != "test_case" or observation.status != "failed":
            return
        decorator = observation.metadata.reproduction_decorator
        self.on_failure(reproduce_blob(decorator) if decorator else None,
                        observation.representation)
