"""Fixtures the machinery tests share (the plugin's own are registered by
the root conftest.py); the plain functions behind them are in helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import CliProcess


@pytest.fixture
def cli_process(tmp_path):
    """``cli_process(*args, path=(), env=None)``: ``c128a ARGS`` started as a
    :class:`helpers.CliProcess` (or ``kind``, a subclass) with its output in
    ``tmp_path``; whatever of it still runs at the end of the test is killed."""
    started: list[CliProcess] = []

    def start(*args, kind: type[CliProcess] = CliProcess, **keywords) -> CliProcess:
        started.append(kind(tmp_path, *args, **keywords))
        return started[-1]

    yield start
    for process in started:
        process.close()


@pytest.fixture
def vllm_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache of vLLM release extracts ($C128A_CACHE), for this test alone."""
    from c128a.targets.vllm_release import CACHE_ENV

    root = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(root))
    return root


@pytest.fixture
def runpytest_on_the_cpu(pytester, c128a_device):
    """``runpytest_on_the_cpu(*args)``: pytester's run with ``--c128a-device=cpu``,
    for a scenario whose verdict is the CPU's (a check that needs CUDA is
    skipped): in this process in a CPU session, else in a child (a CUDA
    session refuses the CPU once its kernels are imported)."""

    def run(*args, subprocess: bool = False):
        if subprocess or c128a_device.type != "cpu":
            return pytester.runpytest_subprocess("--c128a-device=cpu", *args)
        return pytester.runpytest("--c128a-device=cpu", *args)

    return run
