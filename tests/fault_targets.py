"""Targets and properties that fail, slowly fail or sabotage the run on purpose.

Torch only (the oracle, no Triton kernel), so the fault tests run real
processes and signals on the CPU in seconds. Fuzz workers and replay children
import them by name (``fault_targets:slow_failing``): the tests put this
folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from c128a.checks import Property
from c128a.contract import oracle
from c128a.step import Batch
from test_fuzz import PAGES, THRESHOLD, WIDTH, matches_reference, small_batches

SLOW_CALL_S = 2.0
CASES_DIR_ENV = "C128A_TEST_CASES_DIR"


def _late_lengths_one_too_long(*args):
    """decode_lens one too long at positions >= THRESHOLD: nearly every drawn
    batch fails, and none of the first (simplest) ones, so a failure found
    always needs shrinking."""
    views = oracle.build_c128a_topk_metadata(*args)
    positions, num_decode = args[0], args[2]
    views[1][positions[:num_decode] >= THRESHOLD] += 1
    return views


def _slowly(*args):
    time.sleep(SLOW_CALL_S)
    return _late_lengths_one_too_long(*args)


slow_failing = SimpleNamespace(build_c128a_topk_metadata=_slowly)
"""2 s a call, failing on most batches: shrinking a failure takes minutes."""


FIRST_WRONG_MARKER_ENV = "C128A_TEST_FIRST_WRONG_MARKER"


def _slowly_when_wrong(*args):
    """Right at once, or wrong after SLOW_CALL_S; the first wrong answer
    creates the file ``$C128A_TEST_FIRST_WRONG_MARKER`` names."""
    right = oracle.build_c128a_topk_metadata(*args)
    positions, num_decode = args[0], args[2]
    if not bool((positions[:num_decode] >= THRESHOLD).any()):
        return right
    time.sleep(SLOW_CALL_S)
    if marker := os.environ.get(FIRST_WRONG_MARKER_ENV):
        Path(marker).touch()
    return _late_lengths_one_too_long(*args)


slow_when_wrong = SimpleNamespace(build_c128a_topk_metadata=_slowly_when_wrong)
"""Wrong, after 2 s, on steps with a position >= THRESHOLD: a serving loop runs
its passing steps fast, and shrinking its failure takes minutes."""


SLOWER_THAN_THE_STOP_S = 60.0
_answered_wrong: list[bool] = []  # in this process


def _stuck_after_its_first_wrong_answer(*args):
    """Wrong at once on a late position, the first time; every call after
    that takes a minute: the shrinking's next example outlasts any stop's
    grace."""
    if _answered_wrong:
        time.sleep(SLOWER_THAN_THE_STOP_S)
    positions, num_decode = args[0], args[2]
    if bool((positions[:num_decode] >= THRESHOLD).any()):
        _answered_wrong.append(True)
    return _late_lengths_one_too_long(*args)


stuck_while_it_shrinks = SimpleNamespace(
    build_c128a_topk_metadata=_stuck_after_its_first_wrong_answer
)
"""Fails fast once; then each example, the shrinking's, takes a minute."""


def _exits_0_after_its_first_wrong_answer(*args):
    """Wrong at once on a late position, the first time; the call after that
    ends its process with status 0, as a native library calling exit(0)
    would: no exception, no message, no Python handler."""
    if _answered_wrong:
        os._exit(0)
    return _stuck_after_its_first_wrong_answer(*args)


exits_0_while_it_shrinks = SimpleNamespace(
    build_c128a_topk_metadata=_exits_0_after_its_first_wrong_answer
)
"""``os._exit(0)`` in the first example the shrinking of its failure runs."""


def _one_minute(*args):
    time.sleep(SLOWER_THAN_THE_STOP_S)
    return oracle.build_c128a_topk_metadata(*args)


a_minute_a_call = SimpleNamespace(build_c128a_topk_metadata=_one_minute)
"""Right, after a minute: a run shorter than that ends before any example does."""


TARGET_EXIT_STATUS = 3
"""The status a fuzz worker exits with after a CUDA fault, from the target here."""


def _exits(*args):
    sys.exit(TARGET_EXIT_STATUS)


exits_3 = SimpleNamespace(build_c128a_topk_metadata=_exits)
"""A target that ends its process with ``sys.exit(3)`` on its first call."""




def _interrupt(*args):
    raise KeyboardInterrupt


interrupts = SimpleNamespace(build_c128a_topk_metadata=_interrupt)
"""A target that raises KeyboardInterrupt on its first call."""


def _policy_with_a_bug(max_seq_len, compress_ratio, capacity, *, batch_invariant=None):
    raise RuntimeError("width policy bug: no width for this step")


policy_raises = SimpleNamespace(
    build_c128a_topk_metadata=oracle.build_c128a_topk_metadata,
    active_topk_width=_policy_with_a_bug,
)
"""A correct builder whose own width policy raises while a step is drawn."""


def _fails_after_removing_the_cases_dir(target, batch, device) -> None:
    """The disk goes away under the run: the cases folder becomes a file, then
    the check fails, so the parent cannot write the case."""
    cases_dir = Path(os.environ[CASES_DIR_ENV])
    if cases_dir.is_dir():
        shutil.rmtree(cases_dir)
        cases_dir.write_text("not a folder any more\n")
    matches_reference(target, batch, device)


def _crashes(target, batch, device) -> None:
    """Every example ends its worker (SIGKILL)."""
    os.kill(os.getpid(), signal.SIGKILL)


def _crashes_holding_a_temporary_file(target, batch, device) -> None:
    """Ends its worker (SIGKILL) while a temporary file of its is open, as a
    worker killed mid-write of Hypothesis's database would."""
    tempfile.mkstemp(prefix="held-by-a-killed-worker-")
    os.kill(os.getpid(), signal.SIGKILL)


def _harness_bug(target, batch, device) -> None:
    """A fault of the suite itself: a bare assertion of the harness."""
    assert batch.num_tokens < 0, "a harness assertion"


FAULT_PROPERTIES = {
    "harness_bug": Property("harness_bug", small_batches, _harness_bug),
    "crashes_every_time": Property("crashes_every_time", small_batches, _crashes),
    "crashes_holding_a_temporary_file": Property("crashes_holding_a_temporary_file",
                                                 small_batches, _crashes_holding_a_temporary_file),
    "matches_reference": Property("matches_reference", small_batches, matches_reference),
    "loses_cases_dir": Property("loses_cases_dir", small_batches,
                                _fails_after_removing_the_cases_dir),
}


# ---------------------------------------------------------------- a worker's channel


def worker_channel_fd() -> int:
    """The write end of the channel of the fuzz worker this code runs in,
    found where the worker holds it (a multiprocessing queue before the
    channel had frames of its own)."""
    from c128a.runners.fuzz.worker import Worker

    frame = sys._getframe()
    while not isinstance(frame.f_locals.get("self"), Worker):  # the worker's round calls us
        frame = frame.f_back
    channel = frame.f_locals["self"].channel
    return channel.fileno() if hasattr(channel, "fileno") else channel._writer.fileno()


def _writes_to_its_channel(data: bytes) -> SimpleNamespace:
    """The oracle, except that its first call in a process writes ``data``
    into the worker's channel, between two of the worker's own frames."""
    written = []

    def build_c128a_topk_metadata(*args):
        if not written:
            written.append(True)
            os.write(worker_channel_fd(), data)
        return oracle.build_c128a_topk_metadata(*args)

    return SimpleNamespace(build_c128a_topk_metadata=build_c128a_topk_metadata)


FRAME_MAGIC = b"c128"  # c128a.runners.fuzz.channel's, written out: the tests plant frames by hand
garbage_on_the_channel = _writes_to_its_channel(b"garbage, not a frame\n")
malformed_frame_on_the_channel = _writes_to_its_channel(
    FRAME_MAGIC + (12).to_bytes(4, "big") + b"\x80\x05not pickle"
)
huge_frame_header_on_the_channel = _writes_to_its_channel(FRAME_MAGIC + (2**32 - 1).to_bytes(4, "big"))
unfinished_frame_on_the_channel = _writes_to_its_channel(FRAME_MAGIC + (16 << 20).to_bytes(4, "big"))
"""A header announcing 16 MiB (under the limit) that never come."""


# ---------------------------------------------------------------- a target's own processes

CHILD_PIDS_ENV = "C128A_TEST_CHILD_PIDS"


def _spawn_a_child_then_hang(*args):
    """Start a sleeping child process, note its pid in the folder
    ``$C128A_TEST_CHILD_PIDS`` names, and never return."""
    child = subprocess.Popen(["sleep", "3600"])
    Path(os.environ[CHILD_PIDS_ENV], str(child.pid)).touch()
    time.sleep(3600)


spawns_a_child_and_hangs = SimpleNamespace(build_c128a_topk_metadata=_spawn_a_child_then_hang)


def _start_sessions_of_its_own(*args):
    """Start two sleeping processes that leave the worker's process group:
    one in a session of its own (``start_new_session``), one through a shell
    that runs ``setsid sleep`` in the background and exits (a daemon's
    double fork: the sleeper's parent is gone at once); note each pid in the
    folder ``$C128A_TEST_CHILD_PIDS`` names. The first call of the test (the
    folder's ``crashed`` marker made) then ends its worker by SIGKILL,
    orphaning both; the others return the oracle's answer."""
    folder = Path(os.environ[CHILD_PIDS_ENV])
    child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    Path(folder, str(child.pid)).touch()
    daemon = subprocess.run(["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, check=True)
    Path(folder, daemon.stdout.strip()).touch()
    try:
        os.close(os.open(folder / "crashed", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return oracle.build_c128a_topk_metadata(*args)
    os.kill(os.getpid(), signal.SIGKILL)


starts_sessions_of_its_own = SimpleNamespace(build_c128a_topk_metadata=_start_sessions_of_its_own)


# ---------------------------------------------------------------- historical steps

HISTORICAL_STEP = Batch(
    positions=(7, 77, 777, 7777), num_decode_tokens=4, token_to_req_indices=(0, 1, 2, 3),
    block_table=tuple(tuple(r * PAGES + k for k in range(PAGES)) for r in range(4)),
    slot_mapping=(7, 77, 777, 7777), max_model_len=WIDTH * 128, capacity=WIDTH, width=WIDTH,
    buffer_rows=4,
)
"""A property's explicit step, which the draws never give."""


def _on_the_historical_step(action) -> SimpleNamespace:
    def build_c128a_topk_metadata(*args):
        if tuple(args[0].tolist()) == HISTORICAL_STEP.positions:
            action()
        return oracle.build_c128a_topk_metadata(*args)

    return SimpleNamespace(build_c128a_topk_metadata=build_c128a_topk_metadata)


crashes_on_the_historical_step = _on_the_historical_step(lambda: os._exit(9))
hangs_on_the_historical_step = _on_the_historical_step(lambda: time.sleep(3600))
HISTORICAL_PROPERTIES = {
    "with_a_historical_step": Property("with_a_historical_step", small_batches, matches_reference,
                                       examples=(HISTORICAL_STEP,)),
}
