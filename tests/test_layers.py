"""The import contracts of pyproject.toml catch what they are there for: a
copy of the package passes ``lint-imports``, and the same copy with the
cycle inside ``c128a.step`` put back (for the type checker alone, as it
was) fails it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import PACKAGE_ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
STEP_CONTRACT = "step-layers"
CYCLE = """
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .batch import Batch
"""

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason=f"{LINT_IMPORTS} is missing: pip install -e '.[test]'"
)


@pytest.fixture
def package_copy(tmp_path) -> Path:
    shutil.copytree(PACKAGE_ROOT / "c128a", tmp_path / "c128a",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PACKAGE_ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def lint_imports(root: Path, *contracts: str) -> subprocess.CompletedProcess:
    options = [part for contract in contracts for part in ("--contract", contract)]
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", *options], cwd=root, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(root)}, timeout=300,
    )


def test_the_package_copy_keeps_every_contract(package_copy):
    done = lint_imports(package_copy)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_cycle_inside_the_step_for_the_type_checker_alone_breaks_its_contract(package_copy):
    buffers = package_copy / "c128a" / "step" / "buffers.py"
    source = buffers.read_text()
    anchor = "from ..failures import InvariantViolation\n"
    assert anchor in source
    buffers.write_text(source.replace(anchor, anchor + CYCLE, 1))
    done = lint_imports(package_copy, STEP_CONTRACT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "c128a.step.buffers is not allowed to import c128a.step.batch" in done.stdout


def test_the_plugin_importing_a_runner_breaks_its_contract(package_copy):
    """The shipped suite and the plugin run without the command-line tools."""
    verdicts = package_copy / "c128a" / "plugin" / "verdicts.py"
    verdicts.write_text(verdicts.read_text() + "\n\ndef _late():\n"
                        "    from c128a.runners import killmatrix  # noqa\n")
    done = lint_imports(package_copy, "no-tools-below")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "c128a.plugin is not allowed to import c128a.runners" in done.stdout
    assert "c128a.plugin.verdicts -> c128a.runners.killmatrix" in done.stdout


def test_a_kernel_importing_a_target_breaks_the_layers(package_copy):
    """The kernels are a floor of their own, below the targets and mutants
    that use them (plain imports, so the check sees them)."""
    baseline = package_copy / "c128a" / "kernels" / "baseline.py"
    baseline.write_text(baseline.read_text() + "\nfrom ..targets import specs  # noqa\n")
    done = lint_imports(package_copy, "layers")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "c128a.kernels is not allowed to import c128a.targets" in done.stdout
    assert "c128a.kernels.baseline -> c128a.targets.specs" in done.stdout


def test_only_loading_a_spec_imports_a_module_by_name():
    """A dependency of the package on itself is a plain import, which the
    layer check reads; a module named by a string is a user's spec (a
    target, ``--properties``, ``--machine``, ``--mutants-from``), loaded by
    :func:`c128a.targets.import_object` alone."""
    by_name = sorted(
        str(path.relative_to(PACKAGE_ROOT))
        for path in (PACKAGE_ROOT / "c128a").rglob("*.py")
        if "import_module(" in path.read_text() or "__import__(" in path.read_text()
    )
    assert by_name == ["c128a/targets/specs.py"]


def test_the_facade_and_the_command_line_import_torch_on_first_use_only():
    """``import c128a.cli`` imports no torch (a Ctrl-C while it starts
    reaches its handler); each name of the facade is there on first use."""
    program = (
        "import sys, c128a, c128a.cli\n"
        "assert 'torch' not in sys.modules, 'torch imported by c128a or c128a.cli'\n"
        "assert set(c128a.__all__) <= set(dir(c128a))\n"
        "assert all(getattr(c128a, name) is not None for name in c128a.__all__)\n"
        "assert 'torch' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
