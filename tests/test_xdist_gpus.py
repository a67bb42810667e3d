"""One pytest-xdist worker per GPU: the pinning logic with a faked GPU count,
and on a GPU machine the pinning itself."""

import os
import types

import pytest

from c128a.gpu import pinning
from c128a.plugin import pytest_plugin
from c128a.plugin.pytest_plugin import (
    XDIST_GPU_COUNT_ENV,
    pin_xdist_worker,
    pytest_xdist_auto_num_workers,
    xdist_gpu_line,
)


def fake_config(device=None, numprocesses=None):
    options = {"c128a_device": device, "numprocesses": numprocesses}
    return types.SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))


@pytest.mark.parametrize(
    "count, cores, memory_gib, expected",
    [(1, 16, 139.0, 16), (8, 16, 139.0, 16), (2, 16, 10.0, 4), (1, 16, None, 16),
     (4, 2, 80.0, 4), (0, 16, 139.0, None)],
    ids=["one-gpu-16-cores", "8-gpus-16-cores", "memory-caps", "memory-unknown",
         "fewer-cores-than-gpus", "no-gpu"],
)
def test_auto_shares_each_gpu_among_the_cores(monkeypatch, count, cores, memory_gib, expected):
    """-n auto: about one worker per core, spread over the GPUs, at most
    WORKER_GPU_MEMORY_GIB each, at least one per GPU."""
    monkeypatch.delenv("C128A_DEVICE", raising=False)
    monkeypatch.delenv(pinning.WORKERS_PER_GPU_ENV, raising=False)
    monkeypatch.setattr(pinning, "visible_gpu_count", lambda env=None: count)
    monkeypatch.setattr(pinning, "usable_cores", lambda: cores)
    monkeypatch.setattr(pinning, "_smallest_gpu_memory_gib", lambda: memory_gib)
    assert pytest_xdist_auto_num_workers(fake_config()) == expected


def test_workers_per_gpu_from_the_environment(monkeypatch):
    monkeypatch.delenv("C128A_DEVICE", raising=False)
    monkeypatch.setattr(pinning, "visible_gpu_count", lambda env=None: 2)
    monkeypatch.setenv(pinning.WORKERS_PER_GPU_ENV, "3")
    assert pytest_xdist_auto_num_workers(fake_config()) == 6
    monkeypatch.setenv(pinning.WORKERS_PER_GPU_ENV, "many")
    with pytest.raises(pytest.UsageError, match="C128A_WORKERS_PER_GPU='many' must be an integer"):
        pytest_xdist_auto_num_workers(fake_config())


def test_fuzz_defaults_share_the_gpus_the_same_way(monkeypatch):
    from c128a.runners.fuzz import config

    monkeypatch.setattr(config, "visible_gpu_count", lambda env=None: 2)
    monkeypatch.setattr(pinning, "usable_cores", lambda: 16)
    monkeypatch.setattr(pinning, "_smallest_gpu_memory_gib", lambda: 139.0)
    monkeypatch.delenv(pinning.WORKERS_PER_GPU_ENV, raising=False)
    assert config.default_workers("cuda") == (16, 2)
    monkeypatch.setattr(config, "visible_gpu_count", lambda env=None: 0)
    assert config.default_workers("cuda") == (1, 0)


def test_auto_on_cpu_keeps_xdist_default(monkeypatch):
    monkeypatch.setattr(pinning, "visible_gpu_count", lambda env=None: 8)
    assert pytest_xdist_auto_num_workers(fake_config(device="cpu")) is None


@pytest.mark.parametrize(
    "worker, count, visible, expected",
    [("gw0", 4, None, "0"), ("gw5", 4, None, "1"), ("gw1", 2, "6,7", "7"), ("gw3", 3, "a,b,c", "a")],
)
def test_worker_pins_round_robin_through_visible_list(worker, count, visible, expected):
    env = {XDIST_GPU_COUNT_ENV: str(count)}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    assert pin_xdist_worker(worker, env) == expected
    assert env["CUDA_VISIBLE_DEVICES"] == expected


@pytest.mark.parametrize(
    "worker, env",
    [(None, {}), ("gw1", {}), (None, {XDIST_GPU_COUNT_ENV: "2"})],
    ids=["no-xdist", "cpu-run-worker", "controller"],
)
def test_nothing_changes_outside_a_gpu_worker(worker, env):
    before = dict(env)
    assert pin_xdist_worker(worker, env) is None
    assert env == before


def test_malformed_worker_id_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match="unexpected xdist worker id 'main'"):
        pin_xdist_worker("main", {XDIST_GPU_COUNT_ENV: "2"})


def test_header_names_each_workers_gpu():
    assert xdist_gpu_line(2, ["4", "5"]) == "c128a xdist GPUs: gw0->GPU 4, gw1->GPU 5"
    assert xdist_gpu_line(3, ["4", "5"]) == (
        "c128a xdist GPUs (3 workers sharing 2): GPU 4: gw0, gw2; GPU 5: gw1"
    )


def test_controller_exports_gpu_count_only_for_gpu_runs_with_workers(monkeypatch):
    # A pytest that an xdist worker's test starts inherits the worker's
    # environment; it is a controller all the same (only its config says).
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(XDIST_GPU_COUNT_ENV, raising=False)
    monkeypatch.setattr(pinning, "visible_gpu_count", lambda env=None: 2)
    assert pytest_plugin._prepare_xdist_gpus(fake_config(numprocesses=0), None) is None
    assert pytest_plugin._prepare_xdist_gpus(fake_config(numprocesses=2), "cpu") is None
    assert XDIST_GPU_COUNT_ENV not in os.environ
    line = pytest_plugin._prepare_xdist_gpus(fake_config(numprocesses=2), None)
    assert line == "c128a xdist GPUs: gw0->GPU 0, gw1->GPU 1"
    assert os.environ[XDIST_GPU_COUNT_ENV] == "2"
    worker = fake_config(numprocesses=2)
    worker.workerinput = {"workerid": "gw1", "workercount": 2}
    assert pytest_plugin._prepare_xdist_gpus(worker, None) is None


@pytest.mark.cuda
def test_worker_sees_only_its_gpu(c128a_pinned_gpu, record_property):
    import torch

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = torch.cuda.get_device_name(0)
    record_property("gpu", f"{worker}: CUDA_VISIBLE_DEVICES={c128a_pinned_gpu} {name}")
    print(f"{worker}: CUDA_VISIBLE_DEVICES={c128a_pinned_gpu} device_count={torch.cuda.device_count()}")
    if c128a_pinned_gpu is None:
        pytest.skip("not an xdist worker of a GPU run (run with -n auto to see the pinning)")
    assert torch.cuda.device_count() == 1
    assert os.environ["CUDA_VISIBLE_DEVICES"] == c128a_pinned_gpu
