"""Device selection: the interpreter must be on before kernels are decorated."""

import os
import subprocess
import sys

import pytest

from c128a.failures import DeviceError
from c128a.targets import use_device


def test_unknown_device_is_refused():
    with pytest.raises(DeviceError, match="device='tpu' is not one of 'cuda', 'cpu'"):
        use_device("tpu")


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_cpu_after_kernel_import_without_interpreter_is_refused():
    result = _python(
        "import c128a.kernels.adaptive\n"
        "from c128a.targets import use_device\nfrom c128a.failures import DeviceError\n"
        "try:\n    use_device('cpu')\nexcept DeviceError as e:\n    print('REFUSED', e)\n"
    )
    assert "REFUSED" in result.stdout, result.stderr
    assert "c128a.kernels was already imported" in result.stdout


@pytest.mark.slow
def test_cpu_sets_interpreter_before_kernel_import():
    result = _python(
        "from c128a.targets import use_device\n"
        "use_device('cpu')\n"
        "import c128a.kernels.adaptive as k\n"
        "print('INTERPRETING', all(k.interpreting(f) for f in k.jit_functions))\n"
    )
    assert "INTERPRETING True" in result.stdout, result.stderr
