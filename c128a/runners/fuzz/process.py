"""A fuzz worker process from its start to its end.

:func:`run_worker` is what the supervisor starts: it takes the supervisor's
environment, watches that the supervisor still runs, sets its signals, pins
its GPU, builds its :class:`~.worker.Worker`, says it is ready, runs it and
says it is done (or why it could not run); a SIGTERM of its own ends it by
that signal. A worker leads a session (and process group) of its own: what
its target starts is in that group, and the supervisor ends the worker by
killing the whole group (:func:`kill_group`), as ``c128a replay`` ends its
children. A worker is a child subreaper too, and what its target started in
a session of its own is ended with it (:mod:`.strays`): a target's child
process never outlives its worker. :func:`start_process` starts a worker
(or the run's target loading, :mod:`.loading`) from the fork server.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import tempfile
import threading
import time
import traceback

from ...failures import failure_text
from ...gpu.pinning import freeze_startup_heap, pin_to_gpu, thaw_heap
from . import protocol
from .rundir import pid_gone
from .signals import STOP_SIGNALS
from .strays import become_subreaper, end_tree
from .worker import TERMINATED, Worker

ORPHAN_EXIT = 4  # a worker's exit status when its parent is gone
WORKER_INTERRUPTED_EXIT = 130
"""A worker's exit status after a KeyboardInterrupt raised in it (by the target)."""
PARENT_POLL_S = 1.0
PR_SET_PDEATHSIG = 1  # prctl option: a signal for this process when its parent dies


def start_process(process) -> None:
    """Start ``process`` (of the fork server's context) with SIGINT, SIGTERM
    and SIGHUP held for the moment of the start.

    The process starts with them blocked and sets its own handling before
    unblocking SIGINT and SIGTERM: a Ctrl-C to the process group during its
    start-up is no traceback. The fork server, started by the first start,
    inherits the mask and passes it on to every process it forks; here the
    signals are only held for the moment, then delivered. SIGHUP stays
    blocked in the fork server and the workers for good (they never unblock
    it): a hangup reaches the whole process group, and it is the parent's to
    stop the run; a fork server killed by it would take every worker with it."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def kill_group(process) -> None:
    """SIGKILL to worker ``process``'s process group and to every process
    below it: the worker, if it still runs, and every process its code
    started, in its group (a worker leads its group: its pid is the group's
    id) or in a session of its own (:func:`~.strays.end_tree`). A group that
    has ended is no error."""
    if process.pid is None:
        return
    end_tree(process.pid)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.is_alive():  # not yet in its own session: it was killed as it started
        process.kill()


def run_worker(*args) -> None:
    """A worker process: :func:`worker_main`, except that a KeyboardInterrupt
    ends it with :data:`WORKER_INTERRUPTED_EXIT`, not with multiprocessing's
    traceback. A worker ignores SIGINT, so only the code it runs (the
    target) raises one; the parent keeps the input as a crash."""
    try:
        worker_main(*args)
    except KeyboardInterrupt:
        sys.exit(WORKER_INTERRUPTED_EXIT)


def take_over_the_process(parent: int, environ: dict[str, str]) -> None:
    """What a process the supervisor starts (a worker, the target's loading)
    does first: lead a session of its own (whatever it starts belongs to its
    group), become a child subreaper (what it orphans stays below it), take
    the supervisor's environment (``environ``, as it was at the start),
    watch the supervisor, ignore SIGINT (it arrives blocked: the parent
    stops the run on Ctrl-C) and let SIGTERM stop it after its example."""
    os.setsid()  # first: whatever it starts belongs to its group
    become_subreaper()
    os.environ.clear()
    os.environ.update(environ)
    watch_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: TERMINATED.set())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def watch_parent(supervisor_pid: int) -> None:
    """Exit as soon as the supervisor is gone, however it died (SIGKILL
    included). The worker's own parent is the fork server, which exits when
    the supervisor does: Linux sends this worker SIGKILL on that parent's
    death (``PR_SET_PDEATHSIG``); elsewhere, and as a second line, a thread
    polls that the parent is still the one that forked it and that the
    supervisor still runs."""
    forked_by = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def orphaned() -> bool:
        return os.getppid() != forked_by or pid_gone(supervisor_pid)

    if orphaned():  # it died before the watch was set
        os._exit(ORPHAN_EXIT)

    def poll() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if orphaned():
                os._exit(ORPHAN_EXIT)

    threading.Thread(target=poll, name="c128a-parent-watch", daemon=True).start()


def worker_main(
    index, generation, config, channel, stop, halt, inflight, budget, gpu, parent, environ,
    skip_historical=frozenset(), first_round=0,
) -> None:
    """A worker process: take over the process (:func:`take_over_the_process`),
    pin, choose the device, load everything, run rounds from ``first_round``
    of its rotation. SIGINT is ignored: the parent stops the run on Ctrl-C
    (which, the worker leading a session of its own, no longer reaches it
    from the terminal); a SIGTERM asks this worker to stop after its
    example, and, unless the run is stopping too, to end by that signal
    (:func:`exit_by_sigterm`). ``stop`` ends the worker's rounds after their
    example, a failure's shrinking excepted; ``halt`` ends the shrinking too.
    ``skip_historical``: the historical steps already saved as crash or hang
    cases (:func:`~.inflight.step_key`), which this worker does not run."""
    take_over_the_process(parent, environ)
    # A worker killed mid-write (Hypothesis's database writes a temporary file,
    # then renames it) leaves its temporary files in the run's folder, which
    # the supervisor removes, not in $TMPDIR.
    tempfile.tempdir = os.path.dirname(inflight)
    try:
        if gpu is not None:
            pin_to_gpu(gpu)
        worker = Worker(index, generation, config, channel, stop, inflight, budget,
                        skip_historical=skip_historical, halt=halt, first_round=first_round)
        freeze_startup_heap()
        channel.put(protocol.Ready(index))
        worker.loop()
        worker.progress.flush()
        if worker.terminated_alone():
            exit_by_sigterm(channel)
    except Exception as exc:
        channel.put(protocol.Fatal(index, f"{failure_text(exc)}\n{traceback.format_exc(limit=-4)}"))
    else:
        channel.put(protocol.Done(index))
    finally:
        thaw_heap()


def exit_by_sigterm(channel) -> None:
    """End this worker by the SIGTERM it was sent, after what it sent reached
    the parent: it has not said it is done, so the parent keeps its last
    input and restarts it like any worker lost to a signal."""
    channel.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)  # not reached: the signal is unblocked
