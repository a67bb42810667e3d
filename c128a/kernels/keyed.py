"""A builder launched through a keyed launcher, and one whose key ignores a stride.

vLLM launches its kernels through JIT-kernel classes that declare the
compile keys their start-up warm-up compiles (``get_warmup_keys``) and
compute, at each launch, the arguments Triton specialises on. This module
writes the C128A builder that way (on the stand-in base class of
:mod:`c128a.kernels.vllm_shims`), specialised on the active width and both
buffers' row strides, so that the compile-key check
(:mod:`c128a.checks.compile_keys`) has a correct keyed target of the
project's own and a broken one:

- ``target``: its warm-up compiles every width the policy reaches for the
  engine's capacity C (128, 256, ... C) at the buffers' row stride C:
  every launch of the engine is warmed;
- ``stride_blind``: the same kernel, its warm-up keys computed with the row
  stride equal to the width (rows packed at W), as if the key ignored the
  stride: every launch below W = C compiles during inference;
- ``widest_unwarmed``: the same kernel, its warm-up one width short: it
  stops below C, so the first step at W = C compiles during inference (the
  contract's hang at >524K context, where W = 8192 was never warmed up);
- ``aligned_inputs_only``: the same kernel keyed on its input pointers'
  16-byte alignment, its warm-up compiling aligned inputs only: the first
  unaligned slice an engine hands it compiles during inference.

Both compute the contract's values. Import after choosing the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import triton
import triton.language as tl

from ..contract import BuildArgs, capacity_width
from .builder import triton_builder
from .vllm_shims import TritonWarmupTensor, VllmTritonJitKernel, WarmupIntRange, kernel_launcher

BLOCK = 128


SCALARS = ["num_decode_tokens", "compress_ratio", "block_size", "block_table_stride"]
INPUT_POINTERS = ["positions_ptr", "token_to_req_indices_ptr", "block_table_ptr",
                  "slot_mapping_ptr"]
"""Left out of the key: an engine's input slices are 16-byte aligned or not."""


@triton.jit(do_not_specialize=SCALARS + INPUT_POINTERS)
def keyed_build_kernel(
    global_decode_buffer_ptr,
    decode_lens_buffer_ptr,
    prefill_buffer_ptr,
    positions_ptr,
    token_to_req_indices_ptr,
    block_table_ptr,
    slot_mapping_ptr,
    num_decode_tokens,
    compress_ratio,
    block_size,
    block_table_stride,
    WIDTH: tl.constexpr,
    DECODE_STRIDE: tl.constexpr,
    PREFILL_STRIDE: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    # One program a token: its n(t) = min((p + 1) // R, W) leading columns
    # hold its list, the rest of its W columns -1.
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token)
    length = tl.minimum((position + 1) // compress_ratio, WIDTH)
    if token < num_decode_tokens:
        request = tl.load(token_to_req_indices_ptr + token).to(tl.int64)
        for start in range(0, WIDTH, BLOCK_W):
            columns = start + tl.arange(0, BLOCK_W)
            active = columns < length
            pages = tl.load(block_table_ptr + request * block_table_stride + columns // block_size,
                            mask=active, other=0)
            slots = tl.where(active, pages * block_size + columns % block_size, -1)
            tl.store(global_decode_buffer_ptr + token * DECODE_STRIDE + columns,
                     slots.to(tl.int32), mask=columns < WIDTH)
        real = tl.load(slot_mapping_ptr + token) >= 0
        tl.store(decode_lens_buffer_ptr + token, tl.where(real, length, 0).to(tl.int32))
    else:
        row = token - num_decode_tokens
        for start in range(0, WIDTH, BLOCK_W):
            columns = start + tl.arange(0, BLOCK_W)
            values = tl.where(columns < length, columns, -1)
            tl.store(prefill_buffer_ptr + row * PREFILL_STRIDE + columns, values.to(tl.int32),
                     mask=columns < WIDTH)


keyed_build_kernel_on_alignment = triton.jit(do_not_specialize=SCALARS)(keyed_build_kernel.fn)
"""The same kernel keyed on its input pointers' 16-byte alignment too."""


class KeyedBuildKernel(VllmTritonJitKernel["KeyedBuildKernel.CompileKey"]):
    """The builder's launch, keyed on the width and both row strides."""

    kernel = keyed_build_kernel

    @dataclass(frozen=True)
    class CompileKey:
        WIDTH: int
        DECODE_STRIDE: int
        PREFILL_STRIDE: int

    def dispatch(self, *, width: int, row_stride: int) -> "KeyedBuildKernel.CompileKey":
        return self.CompileKey(WIDTH=width, DECODE_STRIDE=row_stride, PREFILL_STRIDE=row_stride)

    def warmed_row_stride(self, width: int, capacity: int) -> int:
        """The buffers' row stride the warm-up assumes at ``width``: C."""
        return capacity

    def get_warmup_keys(self, vllm_config: Any) -> list:
        capacity = capacity_width(vllm_config.model_config.max_model_len, 128)
        widths = WarmupIntRange(128, capacity + 1,
                                advance=lambda w: min(w * 2, capacity) if w < capacity else w * 2)
        return [self.dispatch(width=w, row_stride=self.warmed_row_stride(w, capacity))
                for w in widths]

    def warmup_inputs(self, key) -> dict[str, Any]:
        int32 = TritonWarmupTensor(torch.int32)
        int64 = TritonWarmupTensor(torch.int64)
        return dict(
            global_decode_buffer=TritonWarmupTensor(torch.int32, (1, key.WIDTH),
                                                    (key.DECODE_STRIDE, 1)),
            decode_lens_buffer=int32,
            prefill_buffer=TritonWarmupTensor(torch.int32, (1, key.WIDTH),
                                              (key.PREFILL_STRIDE, 1)),
            positions=int64, compress_ratio=128, max_compressed_tokens=key.WIDTH,
            num_decode_tokens=0, token_to_req_indices=int32,
            block_table=TritonWarmupTensor(torch.int32, (1, 1)), block_size=2,
            slot_mapping=int64,
        )

    @kernel_launcher
    def __call__(self, global_decode_buffer, decode_lens_buffer, prefill_buffer, positions,
                 compress_ratio, max_compressed_tokens, num_decode_tokens,
                 token_to_req_indices, block_table, block_size, slot_mapping):
        return (positions.shape[0],), dict(
            WIDTH=max_compressed_tokens,
            DECODE_STRIDE=global_decode_buffer.stride(0),
            PREFILL_STRIDE=prefill_buffer.stride(0),
            BLOCK_W=BLOCK,
        )


class StrideBlindBuildKernel(KeyedBuildKernel):
    """:class:`KeyedBuildKernel` whose warm-up keys take the row stride to be the width."""

    def warmed_row_stride(self, width: int, capacity: int) -> int:
        return width


class WidestUnwarmedBuildKernel(KeyedBuildKernel):
    """:class:`KeyedBuildKernel` whose warm-up leaves out the widest width, C."""

    def get_warmup_keys(self, vllm_config: Any) -> list:
        capacity = capacity_width(vllm_config.model_config.max_model_len, 128)
        return [key for key in super().get_warmup_keys(vllm_config) if key.WIDTH < capacity]


class AlignedInputsBuildKernel(KeyedBuildKernel):
    """:class:`KeyedBuildKernel` whose kernel keys on its inputs' alignment,
    while its warm-up (aligned placeholder tensors) compiles aligned keys only."""

    kernel = keyed_build_kernel_on_alignment


def _target(launcher: KeyedBuildKernel, name: str) -> SimpleNamespace:
    def launch(args: BuildArgs) -> None:
        if args.num_tokens:
            launcher(**args._asdict())

    return SimpleNamespace(build_c128a_topk_metadata=triton_builder(launch, name),
                           launchers=(launcher,), jit_functions=(launcher.kernel,))


target = _target(KeyedBuildKernel(), "keyed")
"""The builder through :class:`KeyedBuildKernel` (``c128a.kernels.keyed:target``)."""

stride_blind = _target(StrideBlindBuildKernel(), "stride_blind")
"""The builder through :class:`StrideBlindBuildKernel` (``c128a.kernels.keyed:stride_blind``)."""

widest_unwarmed = _target(WidestUnwarmedBuildKernel(), "widest_unwarmed")
"""The builder through :class:`WidestUnwarmedBuildKernel` (``c128a.kernels.keyed:widest_unwarmed``)."""

aligned_inputs_only = _target(AlignedInputsBuildKernel(), "aligned_inputs_only")
"""The builder through :class:`AlignedInputsBuildKernel` (``c128a.kernels.keyed:aligned_inputs_only``)."""
