"""GPU pinning helpers: pure environment arithmetic, testable on the CPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from c128a.failures import GpuPinningError
from c128a.gpu import pinning


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_workers_are_spread_round_robin(worker, count):
    index = pinning.gpu_for_worker(worker, count)
    assert 0 <= index < count
    assert pinning.gpu_for_worker(worker + count, count) == index
    if worker < count:
        assert index == worker


@pytest.mark.parametrize("worker, count", [(-1, 2), (0, 0), (3, -1)])
def test_bad_worker_or_count_is_refused_by_name(worker, count):
    name = "worker_index" if worker < 0 else "gpu_count"
    with pytest.raises(GpuPinningError, match=name):
        pinning.gpu_for_worker(worker, count)


def test_pin_without_a_visible_list_uses_the_index():
    env = {}
    assert pinning.pin_to_gpu(3, env) == "3"
    assert env == {"CUDA_VISIBLE_DEVICES": "3"}


@given(st.lists(st.integers(0, 15).map(str), min_size=1, max_size=8, unique=True), st.data())
def test_pin_maps_through_an_existing_visible_list(physical, data):
    index = data.draw(st.integers(0, len(physical) - 1))
    env = {"CUDA_VISIBLE_DEVICES": ",".join(physical)}
    assert pinning.pin_to_gpu(index, env) == physical[index]
    assert env["CUDA_VISIBLE_DEVICES"] == physical[index]


def test_pin_keeps_uuids_and_ignores_spaces():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa, GPU-bbbb"}
    assert pinning.pin_to_gpu(1, env) == "GPU-bbbb"


def test_pin_past_the_visible_list_is_refused():
    env = {"CUDA_VISIBLE_DEVICES": "4,5"}
    with pytest.raises(GpuPinningError, match="index=2 is out of range.*'4,5'"):
        pinning.pin_to_gpu(2, env)
    assert env == {"CUDA_VISIBLE_DEVICES": "4,5"}


def test_pin_after_cuda_initialised_is_refused(monkeypatch):
    monkeypatch.setattr(pinning, "cuda_initialized", lambda: True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(GpuPinningError, match="already initialised"):
        pinning.pin_to_gpu(0)
    assert "CUDA_VISIBLE_DEVICES" not in pinning.os.environ


def test_an_empty_visible_list_means_no_gpu():
    assert pinning.visible_ids({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert pinning.visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0


@pytest.mark.slow
def test_counting_gpus_creates_no_cuda_context():
    code = (
        "import torch\n"
        "from c128a.gpu.pinning import visible_gpu_count\n"
        "n = visible_gpu_count()\n"
        "assert n == torch.cuda.device_count(), n\n"
        "assert not torch.cuda.is_initialized()\n"
        "print(n)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.cuda
@pytest.mark.slow
def test_a_pinned_process_sees_exactly_its_gpu():
    import torch

    count = torch.cuda.device_count()
    code = (
        "import os, torch\n"
        "from c128a.gpu.pinning import pin_to_gpu\n"
        f"print(pin_to_gpu({count - 1}))\n"
        "assert torch.cuda.device_count() == 1\n"
        "torch.zeros(1, device='cuda')\n"
        "print(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.split()
    assert first == second
