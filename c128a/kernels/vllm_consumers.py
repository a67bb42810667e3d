"""vLLM's consumers of the C128A views, from a release's source, without vLLM.

The four kernels vLLM's DeepSeek-V4 backends launch on the views (see
:mod:`c128a.contract.oracle_consumers` for what each computes) are read from the
same wheel as the builder, the same way (:func:`~c128a.kernels.vllm_extracts.make_extract`:
the definitions they need, verbatim, the rest of vLLM from
:mod:`c128a.kernels.vllm_shims`), into one extract per source file beside
the builder's:

- ``vllm/models/deepseek_v4/common/ops/cache_utils.py``:
  ``compute_global_topk_indices_and_lens``, ``build_flashinfer_mixed_sparse_indices``,
  ``combine_topk_swa_indices`` (with their JIT-kernel classes, whose
  ``get_warmup_keys`` and launch specs stay verbatim: the compile-key check
  reads vLLM's own logic);
- ``vllm/models/deepseek_v4/attention.py``: ``fill_short_context_topk_indices``
  (``_fill_short_context_topk_indices`` in 0.30.0 to 0.33.0).

:func:`load_consumers` returns each as a :class:`~c128a.step.consumer_inputs.Consumer`
called the way vLLM's backends call it (:mod:`c128a.step.consumer_inputs` derives
the arguments), and the reason for each one a release lacks.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import torch
import triton

from ..step.consumer_inputs import (
    ALL_TOKENS,
    GATHER_OFFSET,
    GATHER_STRIDE,
    PREFILL_TOKENS,
    SWA_BLOCK_SIZE,
    WINDOW_SIZE,
    Consumer,
    ConsumerInputs,
    mixed_topk,
)
from . import INTERPRETED, vllm_extracts
from .vllm_extracts import ExtractError

CACHE_UTILS = "vllm/models/deepseek_v4/common/ops/cache_utils.py"
ATTENTION = "vllm/models/deepseek_v4/attention.py"

SOURCES: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {
    CACHE_UTILS: ("c128a_vllm_cache_utils.py", {
        "global_topk": ("compute_global_topk_indices_and_lens",),
        "mixed_sparse": ("build_flashinfer_mixed_sparse_indices",),
        "combine_swa": ("combine_topk_swa_indices",),
    }),
    ATTENTION: ("c128a_vllm_attention.py", {
        "short_context_fill": ("fill_short_context_topk_indices",
                               "_fill_short_context_topk_indices"),
    }),
}
"""Source file -> (its extract's file name, {consumer: the names vLLM has given it})."""


def write_extracts(wheel: Path, folder: Path, header: dict[str, str]) -> dict[str, str]:
    """Write the consumers' extracts of ``wheel`` into ``folder``; {consumer:
    why it is unavailable} for each the wheel lacks."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        texts = {source: (source, archive.read(source).decode("utf-8")) if source in names else None
                 for source in SOURCES}
    return write_source_extracts(texts, folder, header, f"not in {wheel.name}",
                                 f"{wheel.name} has no")


def write_source_extracts(texts: dict[str, tuple[str, str] | None], folder: Path,
                          header: dict[str, str], absent: str, lacks: str) -> dict[str, str]:
    """Write an extract per source file of :data:`SOURCES` into ``folder``
    from ``texts`` ({source: (where the text was read, the text), or None
    where the release or revision has none}); {consumer: why it is
    unavailable} for each it lacks. ``absent`` and ``lacks`` word a missing
    source in the extract's header and in the reason."""
    gaps: dict[str, str] = {}
    for source, (file_name, consumers) in SOURCES.items():
        roots = tuple(name for names_of in consumers.values() for name in names_of)
        found = texts.get(source)
        if found is not None:
            origin, text = found
            try:
                made = vllm_extracts.make_extract(text, origin, header, roots=roots, optional=True)
            except ExtractError as exc:
                why = f"{origin} (its definitions do not reduce to an extract: {exc})"
                for consumer, known in consumers.items():
                    gaps[consumer] = f"{known[0]}: {exc}"
            else:
                vllm_extracts.write_extract(made, folder / file_name)
                continue
        else:
            why = f"{source} ({absent})"
            for consumer, known in consumers.items():
                gaps[consumer] = f"{lacks} {source} (for {known[0]})"
        # An extract of nothing, its header naming what is missing and why:
        # the cache stays current and the load names each gap.
        lines = {**header, vllm_extracts.FORMAT_KEY: vllm_extracts.EXTRACT_FORMAT,
                 "source": " ".join(why.split()), "missing": ", ".join(roots)}
        text = "".join(f"{vllm_extracts.HEADER_PREFIX}{k}: {v}\n" for k, v in lines.items())
        vllm_extracts.write_extract(vllm_extracts.Extract(text, (), (), ()), folder / file_name)
    return gaps


def _function(module, names: tuple[str, ...]):
    for name in names:
        if callable(getattr(module, name, None)):
            return getattr(module, name)
    return None


def load_consumers(folder: Path) -> tuple[tuple[Consumer, ...], dict[str, str]]:
    """vLLM's consumers from the extracts in ``folder``, and {consumer: why
    not} for each that is missing (no extract, or the release lacks it)."""
    loaded: list[Consumer] = []
    gaps: dict[str, str] = {}
    for source, (file_name, consumers) in SOURCES.items():
        path = folder / file_name
        module = None
        if path.is_file():
            try:
                module = vllm_extracts.import_extract(path)
            except ExtractError as exc:
                reason = str(exc)
            else:
                reason = None
        else:
            reason = f"no extract {path} (load the target from its wheel)"
        for consumer, names in consumers.items():
            function = _function(module, names) if module is not None else None
            if function is None:
                where = vllm_extracts.read_header(path).get("source", source)
                gaps[consumer] = reason or f"no {' or '.join(names)} from {where}"
                continue
            loaded.append(_ADAPTERS[consumer](function, vllm_extracts._launchers_named(module, function)))
    return tuple(loaded), gaps


# ---------------------------------------------------------------- calls as vLLM's backends make them


def _no_prefill(i: ConsumerInputs):
    """What a prefill consumer publishes in a step without prefill tokens:
    nothing (the backends run their prefill path only for prefill tokens)."""
    empty = i.prefill_local[:0]
    return empty, i.decode_lens[:0]


def _global_topk(function, launchers) -> Consumer:
    def run(i: ConsumerInputs):
        d = i.num_decode_tokens
        if i.prefill_local.shape[0] == 0:
            return _no_prefill(i)
        return function(
            i.prefill_local, i.token_requests[d:], i.compressed_block_table, i.block_size,
            i.is_valid_token[d:],
        )

    return Consumer("global_topk", run, PREFILL_TOKENS,
                    "vLLM's compute_global_topk_indices_and_lens on the prefill view",
                    launchers)


def _mixed_sparse(function, launchers) -> Consumer:
    def run(i: ConsumerInputs):
        # What the FlashInfer backend passes for a C128A layer: an empty
        # prefill view (0 columns, topk 0) in a step without prefill tokens,
        # an empty decode view (the prefill view's first 0 rows) without decode tokens.
        d = i.num_decode_tokens
        prefill = i.prefill_local
        if prefill.shape[0] == 0:
            prefill = i.global_decode[:0, :0]
        decode, lens = i.global_decode, i.decode_lens
        if d == 0:
            decode, lens = prefill[:0], i.seq_lens[:0]
        return function(
            i.decode_swa_indices, decode, lens, prefill, i.query_start_loc, i.seq_lens,
            i.token_requests, i.swa_block_table, SWA_BLOCK_SIZE, i.compressed_block_table,
            i.block_size, WINDOW_SIZE, i.compress_ratio, mixed_topk(i),
        )

    return Consumer("mixed_sparse", run, ALL_TOKENS,
                    "vLLM's build_flashinfer_mixed_sparse_indices on the decode view, its "
                    "lengths and the prefill view", launchers)


INTERPRETED_WORKERS = 4
"""``combine_topk_swa_indices``'s workers a request under Triton's
interpreter (vLLM launches 256): a worker strides over its request's
tokens, and every consumer request here has one, so the result does not
depend on it (nor does the compile key); each program costs the interpreter
milliseconds."""


def _combine_swa(function, launchers) -> Consumer:
    if INTERPRETED:
        for launcher in launchers:
            if hasattr(type(launcher), "NUM_WORKERS"):
                launcher.NUM_WORKERS = INTERPRETED_WORKERS

    def run(i: ConsumerInputs):
        d = i.num_decode_tokens
        if i.prefill_local.shape[0] == 0:
            return _no_prefill(i)
        seq_lens = i.seq_lens[d:]
        # The whole sequence gathered, in a tensor of its own (as the
        # backend's gather_lens is).
        gather_lens = seq_lens.clone()
        return function(
            i.prefill_local, i.query_start_loc[d:], seq_lens, gather_lens, WINDOW_SIZE,
            i.compress_ratio, int(i.prefill_local.shape[1]), GATHER_STRIDE, GATHER_OFFSET,
        )

    return Consumer("combine_swa", run, PREFILL_TOKENS,
                    "vLLM's combine_topk_swa_indices on the prefill view", launchers)


def _short_context_fill(kernel, launchers) -> Consumer:
    def run(i: ConsumerInputs):
        t = int(i.positions.shape[0])
        output = torch.empty((t, i.width), dtype=torch.int32, device=i.positions.device)
        if t:
            kernel[(t,)](output, i.positions, TOP_K=i.width, COMPRESS_RATIO=i.compress_ratio,
                         PADDED_TOP_K=triton.next_power_of_2(i.width))
        return output, None

    return Consumer("short_context_fill", run, ALL_TOKENS,
                    "vLLM's fill_short_context_topk_indices at TOP_K = W", launchers)


_ADAPTERS = {
    "global_topk": _global_topk,
    "mixed_sparse": _mixed_sparse,
    "combine_swa": _combine_swa,
    "short_context_fill": _short_context_fill,
}
