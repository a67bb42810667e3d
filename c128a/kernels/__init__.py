"""The Triton kernels: the only package that imports Triton.

Modules: :mod:`.adaptive` (the project's kernel, target ``triton``),
:mod:`.baseline` (the plain design the benchmark compares against),
:mod:`.consumer_kernel` (the replay consumer captured in a CUDA graph),
:mod:`.mutants` (kernels broken in ways only a compiled kernel can be),
:mod:`.builder` (the contract's function around a launcher), :mod:`.compiled`
(Triton's compile cache), :mod:`.timing` (``do_bench`` and an empty launch),
and :mod:`.vllm_extracts` with :mod:`.vllm_shims` (a vLLM release's builder,
extracted from its wheel and run without vLLM: target ``vllm-release:VERSION``).

Kernels are decorated when their module is imported, and on the CPU that
must happen under Triton's interpreter: choose the device first
(:func:`c128a.targets.use_device`), which refuses to switch to the CPU once
this package was imported without the interpreter.
"""

import os

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
"""Whether Triton's interpreter was on when the kernels were imported."""
