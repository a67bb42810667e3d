"""A vLLM-like git checkout the tests build: the project's reference
builder written as a vLLM source file (plain torch, written for c128a's
tests from the contract, not vLLM's code), its engine call, and commits
that break it, revert it, move it, change its signature, crash or hang.

``make_checkout(path)`` makes the repository and returns {label: commit}.
The history, oldest first (every commit on one branch unless said):

- ``empty``: a vLLM package without the builder;
- ``reference``: the builder at vLLM's path, called at the policy's width;
- ``unrelated``: another file changes;
- ``mutant``: each token's list one entry too long (the first bad commit);
- ``crash``: the mutant, and the build kills its own process (SIGSEGV);
- ``signature``: the builder takes one ``topk_buffer`` (ten parameters);
- ``moved``: the mutant again, in another file (vllm/attention/c128a.py);
- ``still_bad``: another unrelated change (the bad revision);
- ``revert``: the mutant reverted (the builder right again, in its new file);
- ``fixed``: a builder returning its buffers' whole rows, called at W = C by
  its engine (an attribute set at start-up): a fixed-width builder;
- ``hangs`` (a branch off ``reference``): the build never returns.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

USUAL = "vllm/models/deepseek_v4/sparse_mla.py"
MOVED = "vllm/attention/c128a.py"

ENGINE = '''

class C128AMetadataBuilder:
    """What an engine does each step (written for c128a's tests)."""

    def __init__(self, capacity, rows):
        self.capacity = capacity
        self.decode_buffer = torch.full((rows, capacity), -1, dtype=torch.int32)
        self.lens_buffer = torch.zeros(rows, dtype=torch.int32)
        self.prefill_buffer = torch.full((rows, capacity), -1, dtype=torch.int32)

    def build(self, positions, num_decode_tokens, requests, table, slots, max_seq_len):
{width}
        return build_c128a_topk_metadata(
            positions, 128, num_decode_tokens, requests, table, 2, slots,
            self.decode_buffer, self.lens_buffer, self.prefill_buffer,
            max_compressed_tokens={argument},
        )
'''
ADAPTIVE_CALL = ENGINE.format(
    width="        width = min(max(1 << max(max_seq_len // 128 - 1, 0).bit_length(), 128), "
          "self.capacity)",
    argument="width")
FIXED_CALL = ENGINE.format(width="        pass", argument="self.capacity")

BUILDER = '''"""DeepSeek-V4 C128A metadata, laid out as vLLM lays out its source (written
for c128a's tests from the contract; not vLLM's code)."""

import torch

_TOPK_ALIGNMENT = 128


def _list_lengths(positions, compress_ratio, width):
    return torch.clamp((positions + 1) // compress_ratio{extra}, max=width)


def build_c128a_topk_metadata(
    positions,
    compress_ratio,
    num_decode_tokens,
    token_to_req_indices,
    block_table,
    block_size,
    slot_mapping,
    {buffers},
    max_compressed_tokens=8192,
):
    """Decode rows: global slot ids and lengths; prefill rows: local indices."""
    assert max_compressed_tokens % _TOPK_ALIGNMENT == 0{crash}
    width = max_compressed_tokens
    d, t = num_decode_tokens, positions.shape[0]
    columns = torch.arange(width, device=positions.device)
    lengths = _list_lengths(positions, compress_ratio, width)
    listed = columns[None, :] < lengths[:, None]
    if d:
        rows = token_to_req_indices[:d].long()
        pages = torch.where(listed[:d], columns[None, :] // block_size, 0)
        if block_table.shape[1]:
            entries = block_table[rows[:, None], pages].long()
        else:
            entries = torch.zeros_like(pages)
        slots = entries * block_size + columns[None, :] % block_size
        global_decode_buffer[:d, :width] = torch.where(listed[:d], slots, -1).to(torch.int32)
        lens = torch.where(slot_mapping[:d] >= 0, lengths[:d], 0)
        decode_lens_buffer[:d] = lens.to(torch.int32)
    if t > d:
        prefill_buffer[: t - d, :width] = torch.where(listed[d:], columns[None, :], -1).to(
            torch.int32)
    return (
        global_decode_buffer[:d, {decode_columns}],
        decode_lens_buffer[:d],
        prefill_buffer[: t - d, {prefill_columns}],
    )
'''
BUFFERS = "global_decode_buffer,\n    decode_lens_buffer,\n    prefill_buffer"
ADAPTIVE_VIEWS = {"decode_columns": ":width", "prefill_columns": ":width"}
WHOLE_ROWS = {"decode_columns": ":", "prefill_columns": ":"}


def builder(*, extra: str = "", crash: str = "", buffers: str = BUFFERS,
            views=ADAPTIVE_VIEWS, call: str = ADAPTIVE_CALL) -> str:
    return BUILDER.format(extra=extra, crash=crash, buffers=buffers, **views) + call


REFERENCE = builder()
MUTANT = builder(extra=" + 1")
CRASHES = "import os\nimport signal\n\n" + builder(
    extra=" + 1", crash="\n    os.kill(os.getpid(), signal.SIGSEGV)")
TEN_PARAMETERS = builder(extra=" + 1", buffers="topk_buffer,\n    decode_lens_buffer").replace(
    "global_decode_buffer[", "topk_buffer[").replace("prefill_buffer[", "topk_buffer[")
HANGS = builder(crash="\n    while True:\n        pass")
FIXED = builder(views=WHOLE_ROWS, call=FIXED_CALL)


def git(path: Path, *arguments: str) -> str:
    environment = {**os.environ, "GIT_AUTHOR_NAME": "c128a tests",
                   "GIT_AUTHOR_EMAIL": "tests@c128a.invalid", "GIT_COMMITTER_NAME": "c128a tests",
                   "GIT_COMMITTER_EMAIL": "tests@c128a.invalid",
                   "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
                   "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": os.devnull,
                   "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", "-C", str(path), *arguments], capture_output=True, text=True,
                          env=environment, check=True)
    return done.stdout.strip()


def commit(path: Path, subject: str, files: dict[str, str | None]) -> str:
    """Write (or, for None, remove) ``files`` and commit them: the new commit's hash."""
    for name, text in files.items():
        target = path / name
        if text is None:
            git(path, "rm", "-q", name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        git(path, "add", name)
    git(path, "commit", "-q", "-m", subject)
    return git(path, "rev-parse", "HEAD")


def make_checkout(path: Path) -> dict[str, str]:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    commits = {"empty": commit(path, "Add the vllm package", {
        "vllm/__init__.py": "", "vllm/other.py": "VERSION = 1\n"})}
    commits["reference"] = commit(path, "Add the C128A metadata builder", {USUAL: REFERENCE})
    commits["unrelated"] = commit(path, "Bump the version", {"vllm/other.py": "VERSION = 2\n"})
    commits["mutant"] = commit(path, "Count one more compressed entry per token",
                               {USUAL: MUTANT})
    commits["crash"] = commit(path, "Signal the build", {USUAL: CRASHES})
    commits["signature"] = commit(path, "Share one topk buffer", {USUAL: TEN_PARAMETERS})
    commits["moved"] = commit(path, "Move the builder to vllm/attention",
                              {USUAL: None, MOVED: MUTANT})
    commits["still_bad"] = commit(path, "Bump the version again",
                                  {"vllm/other.py": "VERSION = 3\n"})
    commits["revert"] = commit(path, 'Revert "Count one more compressed entry per token"',
                               {MOVED: REFERENCE})
    commits["fixed"] = commit(path, "Call the builder at the capacity only", {MOVED: FIXED})
    git(path, "branch", "hangs", commits["reference"])
    git(path, "checkout", "-q", "hangs")
    commits["hangs"] = commit(path, "Wait for the build", {USUAL: HANGS})
    git(path, "checkout", "-q", "main")
    return commits
