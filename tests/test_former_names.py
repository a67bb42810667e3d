"""Import paths that moved keep working under their former names: code
written against ``c128a.runners.cases``, ``c128a.runners.gpus`` or
``c128a.runners.sanitizer`` (and a ``python -m`` of the last) runs as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

from c128a import cases, files
from c128a.gpu import compute_sanitizer, pinning


@pytest.mark.parametrize("name", cases.__all__)
def test_the_former_cases_module_holds_every_name_of_the_cases_package(name):
    from c128a.runners import cases as former

    assert getattr(former, name) is getattr(cases, name)


@pytest.mark.parametrize(
    "name", ["atomic_write_json", "output_file_problem", "readable_json", "regular_file_problem"]
)
def test_the_former_cases_module_still_holds_the_file_helpers(name):
    from c128a.runners.cases import __all__ as former_names
    from c128a.runners import cases as former

    assert name in former_names and getattr(former, name) is getattr(files, name)


def test_the_former_gpu_modules_are_the_moved_ones():
    from c128a.runners import gpus as former_gpus
    from c128a.runners import sanitizer as former_sanitizer

    assert former_gpus.pin_to_gpu is pinning.pin_to_gpu
    assert former_gpus.workers_per_gpu is pinning.workers_per_gpu
    assert former_sanitizer.run_sanitizer is compute_sanitizer.run_sanitizer
    assert former_sanitizer.PROPERTIES == compute_sanitizer.PROPERTIES


@pytest.mark.parametrize("module", ["c128a.runners.sanitizer", "c128a.gpu.compute_sanitizer"])
def test_the_sanitizer_child_runs_under_either_name(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--target" in done.stdout
