"""Device selection: the interpreter must be on before kernels are decorated."""

import os
import subprocess
import sys

import pytest

from c128a.device import DeviceError, use_device


def test_unknown_device_is_refused():
    with pytest.raises(DeviceError, match="device='tpu' is not one of 'cuda', 'cpu'"):
        use_device("tpu")


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_cpu_after_kernel_import_without_interpreter_is_refused():
    result = _python(
        "import c128a.kernel\n"
        "from c128a.device import use_device, DeviceError\n"
        "try:\n    use_device('cpu')\nexcept DeviceError as e:\n    print('REFUSED', e)\n"
    )
    assert "REFUSED" in result.stdout, result.stderr
    assert "c128a.kernel was already imported" in result.stdout


def test_cpu_sets_interpreter_before_kernel_import():
    result = _python(
        "from c128a.device import use_device\n"
        "use_device('cpu')\n"
        "import c128a.kernel as k\n"
        "print('INTERPRETING', k._interpreting())\n"
    )
    assert "INTERPRETING True" in result.stdout, result.stderr
