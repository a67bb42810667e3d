"""Each read of Triton's private state ``c128a.kernels.triton_private``
makes still finds what the suite needs: one test per touch, failing with the
attribute and the installed Triton version. Run these first when widening
the Triton range in ``pyproject.toml``. On the CPU a ``JITFunction`` is made
directly (the plugin's interpreter decorates the project's kernels as
interpreted functions, which hold no compiled variants); on a GPU a real
compile fills the cache."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch
import triton
from triton.runtime import JITFunction

from c128a.kernels import triton_private
from c128a.kernels.triton_private import DEVICE_CACHES, compiled_variants, forget_compiled_variants


def changed(name: str, what: str) -> str:
    """The message of a touch Triton changed under the suite."""
    return (f"triton {triton.__version__}: JITFunction.{name} {what}. "
            "c128a.kernels.triton_private relies on it; adapt that module, or cap triton "
            "below this release in pyproject.toml")


def copy_rows(source_ptr, target_ptr):  # the body is never compiled on the CPU
    pass


def jit_function() -> JITFunction:
    return JITFunction(copy_rows)


def held(function, variants: dict, device: int = 0):
    """Put ``variants`` where Triton keeps a device's compiled variants: the
    first item of the device's cache entry (the others are Triton's binder state)."""
    getattr(function, DEVICE_CACHES)[device] = (variants, {}, None, None, None)


def test_device_caches_is_a_per_device_cache_of_every_jit_function():
    function = jit_function()
    assert hasattr(function, DEVICE_CACHES), changed(DEVICE_CACHES, "is gone")
    caches = getattr(function, DEVICE_CACHES)
    assert isinstance(caches, defaultdict), changed(
        DEVICE_CACHES, f"is a {type(caches).__name__}, no longer a defaultdict by device")
    assert compiled_variants(function, 0) == []
    assert 0 not in caches, "reading a device that compiled nothing created its cache entry"
    held(function, {"key": "variant"})
    assert compiled_variants(function, 0) == ["variant"]


def test_device_cache_entry_holds_the_compiled_variants_first():
    """Triton builds a device's entry with its binder: the dict of compiled
    variants must still be its first item (read without a GPU: the binder
    would ask the driver for a device)."""
    function = jit_function()
    binder = getattr(function, DEVICE_CACHES).default_factory
    assert binder is not None and getattr(binder, "__name__", "") == "create_binder", changed(
        DEVICE_CACHES, f"is filled by {binder!r}, not create_binder")
    assert "kernel_cache" in JITFunction.run.__code__.co_varnames, changed(
        "run", "no longer unpacks the device's kernel_cache from its entry")


def test_forget_compiled_variants_empties_every_device():
    function = jit_function()
    held(function, {"a": 1}, device=0)
    held(function, {"b": 2}, device=1)
    forget_compiled_variants(function)
    assert compiled_variants(function, 0) == [] and compiled_variants(function, 1) == [], changed(
        DEVICE_CACHES, "kept variants after clear()")


def test_interpreted_functions_hold_no_variants():
    class InterpretedFunction:  # what the interpreter's decorator returns, in name
        pass

    with pytest.raises(TypeError, match="interpreter compiles nothing"):
        compiled_variants(InterpretedFunction(), 0)


def test_only_triton_private_reads_tritons_private_state():
    """The one-module rule: elsewhere in the package, no private Triton
    attribute, not even in a docstring."""
    package = Path(triton_private.__file__).parents[1]
    touching = sorted(
        str(path.relative_to(package.parent))
        for path in package.rglob("*.py")
        if path != Path(triton_private.__file__) and DEVICE_CACHES in path.read_text()
    )
    assert touching == [], f"{DEVICE_CACHES} read outside kernels/triton_private.py: {touching}"


@pytest.mark.cuda
def test_a_real_compile_is_held_and_forgotten(c128a_device):
    """On a GPU: a launch's variant is in the cache, gone after forgetting,
    and the next launch compiles it again."""
    from c128a.kernels.keyed import keyed_build_kernel
    from test_compile_hooks import launch_keyed_once

    forget_compiled_variants(keyed_build_kernel)
    launch_keyed_once(c128a_device)
    assert len(compiled_variants(keyed_build_kernel, c128a_device)) == 1, changed(
        DEVICE_CACHES, "does not hold the variant a launch compiled")
    forget_compiled_variants(keyed_build_kernel)
    assert compiled_variants(keyed_build_kernel, c128a_device) == []
    launch_keyed_once(c128a_device)
    torch.cuda.synchronize(c128a_device)
    assert len(compiled_variants(keyed_build_kernel, c128a_device)) == 1
