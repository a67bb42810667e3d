"""The ``vllm-release:VERSION|PATH`` target: specs, errors, the extract, and
the real release.

Fake wheels here hold a small stand-in ``sparse_mla.py`` written for these
tests (not vLLM's code): a builder that fills ``decode_lens`` through a
Triton kernel and a helper, beside definitions the builder does not need
(an unused kernel, a class deriving from a vLLM class, an unused constant).
pip is exercised offline through a local ``--find-links`` folder. The real
release (``REAL_VERSION``) is downloaded once into the cache
(``$C128A_CACHE``, default ``~/.cache/c128a``); where pip cannot reach it the
real-release tests skip, except under ``CI``, where that is a failure.
"""

from __future__ import annotations

import ast
import errno
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from c128a import cli
from c128a.checks import check_step
from c128a.failures import EXIT_USAGE, TargetSpecError, TargetUnavailable
from c128a.strategies import HISTORICAL_BATCHES
from c128a.targets import load_target
from c128a.targets.vllm_release import (
    CACHE_ENV,
    EXTRACT_NAME,
    SOURCE_PATH,
    cache_folder,
    cached_wheel,
)
from helpers import fill_to_the_last_byte, small_tmpfs

REAL_VERSION = "0.34.0"
EXTRACT_LIMIT = 64 * 1024

STAND_IN = textwrap.dedent(
    '''
    """A stand-in for vLLM's sparse_mla.py, written for c128a's tests."""
    import math
    from dataclasses import dataclass

    import torch

    from vllm.config import VllmConfig
    from vllm.triton_utils import tl, triton
    from vllm.utils.math_utils import cdiv
    from vllm.v1.attention.backend import AttentionBackend

    ALIGNMENT = 128
    UNUSED_CONSTANT = math.pi
    LANES = 16


    @dataclass
    class Backend(AttentionBackend):
        config: VllmConfig


    @triton.jit
    def _unused_kernel(x_ptr):
        tl.store(x_ptr, 1)


    @triton.jit
    def _length(position, ratio, width):
        return tl.minimum((position + 1) // ratio, width)


    @triton.jit
    def _lens_kernel(positions_ptr, slots_ptr, lens_ptr, ratio, width, count, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < count
        positions = tl.load(positions_ptr + offsets, mask=mask, other=0)
        slots = tl.load(slots_ptr + offsets, mask=mask, other=0)
        lens = _length(positions, ratio, width)
        tl.store(lens_ptr + offsets, tl.where(slots >= 0, lens, 0).to(tl.int32), mask=mask)


    def _grid(count):
        return (cdiv(count, LANES),)


    def build_c128a_topk_metadata(
        positions, compress_ratio, num_decode_tokens, token_to_req_indices, block_table,
        block_size, slot_mapping, global_decode_buffer, decode_lens_buffer, prefill_buffer,
        max_compressed_tokens=8192,
    ):
        assert max_compressed_tokens % ALIGNMENT == 0
        assert decode_lens_buffer.dtype == torch.int32
        if num_decode_tokens:
            _lens_kernel[_grid(num_decode_tokens)](
                positions, slot_mapping, decode_lens_buffer, compress_ratio,
                max_compressed_tokens, num_decode_tokens, BLOCK=LANES,
            )
        num_prefill = positions.shape[0] - num_decode_tokens
        return (
            global_decode_buffer[:num_decode_tokens, :max_compressed_tokens],
            decode_lens_buffer[:num_decode_tokens],
            prefill_buffer[:num_prefill, :max_compressed_tokens],
        )
    '''
)
NEEDED = ["ALIGNMENT", "LANES", "_length", "_lens_kernel", "_grid", "build_c128a_topk_metadata"]


def make_wheel(folder: Path, version: str, files: dict[str, str]) -> Path:
    """A minimal wheel pip accepts, holding ``files``."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"vllm-{version}-py3-none-any.whl"
    info = f"vllm-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        archive.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: c128a-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def offline_pip(tmp_path, monkeypatch) -> Path:
    """pip sees no configuration and no index, only a local --find-links folder."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def top_level_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def small_call(device, num_decode=2):
    positions = torch.tensor([127, 300, 5000], dtype=torch.int64, device=device)
    slots = torch.tensor([0, -1, 2], dtype=torch.int64, device=device)
    requests = torch.zeros(3, dtype=torch.int32, device=device)
    table = torch.arange(64, dtype=torch.int32, device=device).view(1, 64)
    decode = torch.full((4, 128), -99, dtype=torch.int32, device=device)
    lens = torch.full((4,), -99, dtype=torch.int32, device=device)
    prefill = torch.full((4, 128), -99, dtype=torch.int32, device=device)
    return (positions, 128, num_decode, requests, table, 2, slots, decode, lens, prefill, 128)


# ---------------------------------------------------------------- specs and their errors


@pytest.mark.parametrize(
    "spec, message",
    [
        ("vllm-release", "needs a vLLM release version or a path"),
        ("vllm-release:", "needs a vLLM release version or a path"),
        ("vllm-release:latest", "'latest' is neither a vLLM release version"),
        ("vllm-release:0.34.0!", "neither a vLLM release version"),
        ("vllm-release:v0.34", "neither a vLLM release version"),
    ],
)
def test_bad_specs_are_spec_errors(vllm_cache, spec, message):
    with pytest.raises(TargetSpecError, match=message):
        load_target(spec)


def test_missing_path_is_a_spec_error(tmp_path):
    with pytest.raises(TargetSpecError, match="nor an existing path"):
        load_target(f"vllm-release:{tmp_path / 'nowhere' / 'vllm-0.34.0-py3-none-any.whl'}")


def test_folder_without_extract_or_wheel_is_a_spec_error(tmp_path):
    with pytest.raises(TargetSpecError, match=f"holds no {EXTRACT_NAME}"):
        load_target(f"vllm-release:{tmp_path}")


@pytest.mark.parametrize("name", ["sparse_mla.py", "vllm-0.0.1-py3-none-any.whl", "extract"])
def test_a_fifo_or_a_device_is_refused_unread(tmp_path, vllm_cache, name):
    """A FIFO named like a source file or a wheel hung the load (nothing
    ever writes it), and a device would be read for ever: neither is read."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(TargetSpecError, match="is not a regular file or a folder"):
            load_target(f"vllm-release:{path}")


def test_not_a_wheel_is_a_spec_error(tmp_path, vllm_cache):
    fake = tmp_path / "vllm-0.0.1-py3-none-any.whl"
    fake.write_text("not a zip")
    with pytest.raises(TargetSpecError, match="cannot read the wheel"):
        load_target(f"vllm-release:{fake}")


def test_wheel_without_the_file_names_version_and_file(tmp_path, vllm_cache):
    wheel = make_wheel(tmp_path / "w", "0.0.1", {"vllm/other.py": "X = 1\n"})
    with pytest.raises(TargetUnavailable) as raised:
        load_target(f"vllm-release:{wheel}")
    message = str(raised.value)
    assert "vLLM 0.0.1" in message
    assert f"{SOURCE_PATH} is missing" in message
    assert "build_c128a_topk_metadata" in message


def test_file_without_the_function_names_it(tmp_path, vllm_cache):
    source = STAND_IN.replace("def build_c128a_topk_metadata(", "def renamed_builder(")
    wheel = make_wheel(tmp_path / "w", "0.0.1", {SOURCE_PATH: source})
    with pytest.raises(TargetUnavailable, match=f"vLLM 0.0.1.*{SOURCE_PATH} is there"):
        load_target(f"vllm-release:{wheel}")


def test_names_nothing_supplies_are_reported(tmp_path, vllm_cache):
    source = STAND_IN.replace(
        "import torch\n", "import torch\nfrom vllm.distributed import get_tp_group\n"
    ).replace("    assert max_compressed_tokens", "    get_tp_group()\n    assert max_compressed_tokens")
    wheel = make_wheel(tmp_path / "w", "0.0.1", {SOURCE_PATH: source})
    with pytest.raises(TargetUnavailable) as raised:
        load_target(f"vllm-release:{wheel}")
    message = str(raised.value)
    assert "vLLM 0.0.1" in message
    assert "get_tp_group (from vllm.distributed.get_tp_group)" in message
    assert "AttentionBackend" not in message  # only what the builder needs counts


# ---------------------------------------------------------------- the extract


def test_fake_wheel_loads_and_extract_holds_only_what_is_needed(tmp_path, vllm_cache, c128a_device):
    wheel = make_wheel(tmp_path / "w", "0.0.1", {SOURCE_PATH: STAND_IN})
    target = load_target(f"vllm-release:{wheel}")
    extract = cache_folder("0.0.1") / EXTRACT_NAME
    assert extract.is_file()
    assert top_level_names(extract) == NEEDED
    text = extract.read_text()
    assert "# c128a-vllm-version: 0.0.1" in text
    assert f"# c128a-source: {SOURCE_PATH}" in text
    assert "# c128a-supplied: cdiv, tl, torch, triton" in text
    for absent in ("_unused_kernel", "Backend", "UNUSED_CONSTANT", "import math", "VllmConfig"):
        assert absent not in text
    assert not target.validates_input
    assert not target.full_width_decode_views
    assert target.uses_project_policy
    assert sorted(f.__name__ for f in target.jit_functions) == ["_length", "_lens_kernel"]

    views = target.build_c128a_topk_metadata(*small_call(c128a_device))
    # Token 0: (127 + 1) // 128 = 1; token 1 is padding (slot -1): 0.
    assert views[1].tolist() == [1, 0]


def test_builder_found_where_a_release_moved_it(tmp_path, vllm_cache):
    wheel = make_wheel(tmp_path / "w", "0.0.1", {"vllm/attention/c128a.py": STAND_IN})
    load_target(f"vllm-release:{wheel}")
    text = (cache_folder("0.0.1") / EXTRACT_NAME).read_text()
    assert "# c128a-source: vllm/attention/c128a.py" in text


def test_copied_extract_loads_without_wheel_or_registry(tmp_path, vllm_cache, offline_pip,
                                                        monkeypatch):
    """What a GPU host without a registry does: a cache folder (or the extract
    alone) copied from here."""
    wheel = make_wheel(tmp_path / "w", "0.0.1", {SOURCE_PATH: STAND_IN})
    load_target(f"vllm-release:{wheel}")
    built = cache_folder("0.0.1") / EXTRACT_NAME

    elsewhere = tmp_path / "gpu-host"
    (elsewhere / "vllm-release" / "0.0.1").mkdir(parents=True)
    copied = shutil.copy(built, elsewhere / "vllm-release" / "0.0.1" / EXTRACT_NAME)
    monkeypatch.setenv(CACHE_ENV, str(elsewhere))
    assert callable(load_target("vllm-release:0.0.1").build_c128a_topk_metadata)
    assert callable(load_target(f"vllm-release:{copied}").build_c128a_topk_metadata)
    assert callable(load_target(f"vllm-release:{Path(copied).parent}").build_c128a_topk_metadata)


def test_the_same_extract_in_two_caches_runs_each_from_its_own_file(tmp_path, vllm_cache,
                                                                     monkeypatch):
    """One text in two cache folders is two modules: the code of each names
    its own file, so a damaged copy is the one found and rebuilt (a module
    shared by content named the first folder's file from the second)."""
    wheel = make_wheel(tmp_path / "w", "0.0.1", {SOURCE_PATH: STAND_IN})
    first = load_target(f"vllm-release:{wheel}").build_c128a_topk_metadata
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "second-cache"))
    second = load_target(f"vllm-release:{wheel}").build_c128a_topk_metadata
    assert Path(first.__code__.co_filename).read_text() == Path(second.__code__.co_filename).read_text()
    assert Path(second.__code__.co_filename) == (cache_folder("0.0.1") / EXTRACT_NAME).resolve()
    assert first.__code__.co_filename != second.__code__.co_filename


def test_extract_of_another_format_is_rebuilt_from_the_cached_wheel(tmp_path, vllm_cache,
                                                                    offline_pip):
    folder = cache_folder("0.0.1")
    make_wheel(folder, "0.0.1", {SOURCE_PATH: STAND_IN})
    (folder / EXTRACT_NAME).write_text("# c128a-extract-format: 0\n# c128a-vllm-version: 0.0.1\n")
    load_target("vllm-release:0.0.1")
    assert top_level_names(folder / EXTRACT_NAME) == NEEDED


def test_source_file_is_extracted_into_the_cache(tmp_path, vllm_cache):
    source = tmp_path / "sparse_mla.py"
    source.write_text(STAND_IN)
    target = load_target(f"vllm-release:{source}")
    assert callable(target.build_c128a_topk_metadata)
    (extract,) = (vllm_cache / "vllm-release").glob(f"source-*/{EXTRACT_NAME}")
    assert top_level_names(extract) == NEEDED


def test_other_python_file_is_a_spec_error(tmp_path):
    other = tmp_path / "other.py"
    other.write_text("X = 1\n")
    with pytest.raises(TargetSpecError, match="neither a c128a extract nor a source file"):
        load_target(f"vllm-release:{other}")


# ---------------------------------------------------------------- pip


def test_version_is_downloaded_with_pip_once(tmp_path, vllm_cache, offline_pip):
    make_wheel(offline_pip, "0.0.1", {SOURCE_PATH: STAND_IN})
    target = load_target("vllm-release:0.0.1")
    assert callable(target.build_c128a_topk_metadata)
    folder = cache_folder("0.0.1")
    assert (folder / "vllm-0.0.1-py3-none-any.whl").is_file()
    assert top_level_names(folder / EXTRACT_NAME) == NEEDED
    assert not list(folder.glob(".download-*"))
    (offline_pip / "vllm-0.0.1-py3-none-any.whl").unlink()  # no second download
    (folder / "vllm-0.0.1-py3-none-any.whl").unlink()  # the extract alone is enough
    assert callable(load_target("vllm-release:0.0.1").build_c128a_topk_metadata)


def test_version_not_on_the_index_names_it(vllm_cache, offline_pip):
    make_wheel(offline_pip, "0.0.1", {SOURCE_PATH: STAND_IN})
    with pytest.raises(TargetUnavailable, match=r"vLLM 0\.0\.2: the package index has no vllm 0\.0\.2"):
        load_target("vllm-release:0.0.2")
    assert not list(cache_folder("0.0.2").glob("*.whl"))


def test_no_network_is_unavailable(vllm_cache, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip reports the refused connection on a retry
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    with pytest.raises(TargetUnavailable, match=r"vLLM 0\.34\.0: pip could not reach the package index"):
        load_target("vllm-release:0.34.0")


# ---------------------------------------------------------------- the real release


@pytest.fixture(scope="module")
def real_release():
    """vLLM REAL_VERSION's builder, fetched once into the cache."""
    try:
        return load_target(f"vllm-release:{REAL_VERSION}")
    except TargetUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}: CI must run the real-release tests")
        pytest.skip(str(exc))


def test_real_extract_is_small_and_selects_the_builder(real_release):
    extract = Path(real_release.build_c128a_topk_metadata.__code__.co_filename)
    assert extract.name == EXTRACT_NAME
    assert extract.stat().st_size < EXTRACT_LIMIT
    assert top_level_names(extract) == [
        "_C128A_TOPK_ALIGNMENT",
        "build_c128a_topk_metadata",
        "BuildC128ATopkMetadataKernel",
        "_BUILD_C128A_TOPK_METADATA_KERNEL",
    ]
    assert [f.__name__ for f in real_release.jit_functions] == ["kernel"]
    assert not real_release.validates_input
    assert real_release.uses_project_policy


# The drawn steps: the release's own conformance run in .ci/run.
@pytest.mark.parametrize("name", list(HISTORICAL_BATCHES))
def test_real_release_on_the_historical_steps(real_release, c128a_device, name):
    check_step(real_release, HISTORICAL_BATCHES[name], c128a_device)


# ---------------------------------------------------------------- the cache: read-only, verified

BUILDER_FIRST = STAND_IN.replace(
    "def _grid(count):\n    return (cdiv(count, LANES),)\n\n\n", ""
) + "\n\ndef _grid(count):\n    return (cdiv(count, LANES),)\n"
"""STAND_IN with ``_grid`` after the builder (as vLLM 0.34.0 defines its
launcher after ``build_c128a_topk_metadata``): an extract cut short before
it still parses and defines the builder, which then fails with NameError."""
CONSUMERS_EXTRACT = "c128a_vllm_cache_utils.py"


def cached_release(version: str = "0.0.1", source: str = BUILDER_FIRST) -> Path:
    """The cache folder of ``version`` holding a fake wheel and the extracts loaded from it."""
    folder = cache_folder(version)
    make_wheel(folder, version, {SOURCE_PATH: source})
    load_target(f"vllm-release:{version}")
    return folder


def cut_short(path: Path) -> None:
    """The extract without its last definition (``_grid``), still parsing."""
    text = path.read_text()
    path.write_text(text[: text.rindex("\n\n# ")] + "\n")
    ast.parse(path.read_text())


def edited(path: Path) -> None:
    """The extract with one constant changed, every name still defined."""
    text = path.read_text()
    assert "LANES = 16" in text
    path.write_text(text.replace("LANES = 16", "LANES = 8"))


def tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every file and folder under ``root``: its modification time, and a file's bytes."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def read_only(tmp_path):
    """``read_only(folder)``: ``folder`` seen through a read-only bind mount
    (root ignores mode bits; a read-only mount refuses it too), unmounted at
    the end. Skips where mounting is not permitted."""
    views: list[Path] = []

    def mount(folder: Path) -> Path:
        view = tmp_path / f"read-only-{len(views)}"
        view.mkdir()
        for command in (["mount", "--bind", str(folder), str(view)],
                        ["mount", "-o", "remount,ro,bind", str(view)]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot mount {view} read-only here: `{' '.join(command)}` said "
                            f"{done.stderr.strip() or done.returncode}")
            if view not in views:
                views.append(view)  # bound: unmounted at the end, even if the remount fails
        with pytest.raises(OSError) as refused:
            (view / ".probe").write_text("")
        assert refused.value.errno == errno.EROFS
        return view

    yield mount
    for view in reversed(views):
        if subprocess.run(["umount", str(view)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(view)], capture_output=True)


def refusal(tmp_path, capsys, device, spec: str) -> str:
    """What ``c128a fuzz --target SPEC`` says, asserting it exits 2 with one
    line and saves no case."""
    capsys.readouterr()
    status = cli.main([
        "fuzz", "--device", device.type, "--workers", "1", "--no-stateful", "--no-live",
        "--only", "matches_oracle", "--max-examples", "2", "--db", str(tmp_path / "db"),
        "--cases-dir", str(tmp_path / "cases"), "--target", spec,
    ])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE, err
    assert not list((tmp_path / "cases").rglob("*.json"))
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("c128a fuzz: "), err
    return lines[0]


def test_a_loaded_cache_is_read_again_without_writing(tmp_path, vllm_cache):
    cached_release()
    before = tree(vllm_cache)
    assert callable(load_target("vllm-release:0.0.1").build_c128a_topk_metadata)
    assert tree(vllm_cache) == before


def test_a_read_only_cache_holding_the_extract_loads(tmp_path, vllm_cache, read_only, monkeypatch,
                                                    c128a_device):
    """A cache folder copied to a GPU host and mounted read-only there."""
    cached_release()
    monkeypatch.setenv(CACHE_ENV, str(read_only(vllm_cache)))
    views = load_target("vllm-release:0.0.1").build_c128a_topk_metadata(*small_call(c128a_device))
    assert views[1].tolist() == [1, 0]


@pytest.mark.parametrize("damage", [cut_short, edited])
def test_a_damaged_extract_is_rebuilt_from_the_cached_wheel(tmp_path, vllm_cache, damage):
    folder = cached_release()
    extract = folder / EXTRACT_NAME
    written = extract.read_text()
    damage(extract)
    load_target("vllm-release:0.0.1")
    assert extract.read_text() == written


@pytest.mark.parametrize("damage", [cut_short, edited])
def test_a_damaged_extract_without_its_wheel_is_refused(tmp_path, vllm_cache, capsys,
                                                        c128a_device, damage):
    """Not loaded (its NameError would be blamed on vLLM), and not
    downloaded again: one line, exit status 2, no case saved."""
    folder = cached_release()
    cached_wheel(folder, "0.0.1").unlink()
    damage(folder / EXTRACT_NAME)
    with pytest.raises(TargetUnavailable) as raised:
        load_target("vllm-release:0.0.1")
    message = str(raised.value)
    assert "\n" not in message
    assert "vllm-release:0.0.1" in message and str(folder / EXTRACT_NAME) in message
    assert "differs from what was written" in message
    assert f"remove {folder}" in message
    assert "vllm-release:0.0.1" in refusal(tmp_path, capsys, c128a_device, "vllm-release:0.0.1")


def test_a_damaged_consumer_extract_is_rebuilt_or_refused(tmp_path, vllm_cache):
    folder = cached_release()
    consumers = folder / CONSUMERS_EXTRACT
    written = consumers.read_text()
    consumers.write_text(written + "X = 1\n")
    load_target("vllm-release:0.0.1")
    assert consumers.read_text() == written
    cached_wheel(folder, "0.0.1").unlink()
    consumers.write_text(written + "X = 1\n")
    with pytest.raises(TargetUnavailable, match=f"{consumers}.*differs from what was written"):
        load_target("vllm-release:0.0.1")


def test_a_read_only_cache_with_a_damaged_extract_is_refused(tmp_path, vllm_cache, read_only,
                                                             monkeypatch, capsys, c128a_device):
    """The wheel is there, but the folder cannot be written to rebuild from it."""
    folder = cached_release()
    cut_short(folder / EXTRACT_NAME)
    view = read_only(vllm_cache)
    monkeypatch.setenv(CACHE_ENV, str(view))
    with pytest.raises(TargetUnavailable) as raised:
        load_target("vllm-release:0.0.1")
    message = str(raised.value)
    assert "differs from what was written" in message
    assert "Read-only file system" in message and f"${CACHE_ENV}" in message
    assert "Read-only file system" in refusal(tmp_path, capsys, c128a_device, "vllm-release:0.0.1")


def test_an_older_extract_without_wheel_or_registry_names_both(tmp_path, vllm_cache, offline_pip):
    """A cache folder copied from an older c128a to a host without a
    registry: the download is tried, and its failure names the old extract."""
    folder = cache_folder("0.0.1")
    folder.mkdir(parents=True)
    (folder / EXTRACT_NAME).write_text("# c128a-extract-format: 0\n# c128a-vllm-version: 0.0.1\n")
    with pytest.raises(TargetUnavailable) as raised:
        load_target("vllm-release:0.0.1")
    message = str(raised.value)
    assert "the package index has no vllm 0.0.1" in message
    assert f"{folder / EXTRACT_NAME} is of extract format 0" in message and "\n" not in message


def test_a_users_own_extract_is_checked_for_its_names_only(tmp_path, vllm_cache):
    """``vllm-release:PATH`` at an extract: no digest to hold it to (the
    user's own, edited as they like), but every name it must define."""
    built = cached_release() / EXTRACT_NAME
    mine = tmp_path / "mine" / EXTRACT_NAME
    mine.parent.mkdir()
    shutil.copy(built, mine)
    edited(mine)
    assert callable(load_target(f"vllm-release:{mine}").build_c128a_topk_metadata)
    cut_short(mine)
    with pytest.raises(TargetUnavailable) as raised:
        load_target(f"vllm-release:{mine}")
    assert "\n" not in str(raised.value)
    assert f"{mine}" in str(raised.value) and "defines no _grid" in str(raised.value)
    # Made by hand, with no list of its names: what the builder reads is followed.
    mine.write_text("".join(line for line in mine.read_text().splitlines(keepends=True)
                            if not line.startswith("# c128a-selected:")))
    with pytest.raises(TargetUnavailable, match="uses names it neither defines nor imports: _grid"):
        load_target(f"vllm-release:{mine}")


def test_a_failed_download_is_shared_within_one_run_only(tmp_path, monkeypatch):
    """The workers of one pytest-xdist run get the first worker's reason at
    once, instead of each trying pip in turn; the next run tries pip again,
    however soon it starts, and so does every load outside such a run."""
    from c128a.targets import vllm_release

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    attempts = []

    def no_network(version, folder):
        attempts.append(version)
        raise TargetUnavailable(f"vLLM {version}: pip could not reach the package index")

    monkeypatch.setattr(vllm_release, "download_wheel", no_network)
    monkeypatch.setenv(vllm_release.RUN_ID_ENV, "run-1")
    for _ in range(3):
        with pytest.raises(TargetUnavailable, match="could not reach the package index"):
            load_target("vllm-release:0.34.0")
    assert attempts == ["0.34.0"]
    monkeypatch.setenv(vllm_release.RUN_ID_ENV, "run-2")
    with pytest.raises(TargetUnavailable, match="could not reach the package index"):
        load_target("vllm-release:0.34.0")
    assert attempts == ["0.34.0"] * 2
    monkeypatch.delenv(vllm_release.RUN_ID_ENV)
    for _ in range(2):
        with pytest.raises(TargetUnavailable, match="could not reach the package index"):
            load_target("vllm-release:0.34.0")
    assert attempts == ["0.34.0"] * 4


def test_a_version_that_does_not_load_leaves_no_cache_folder(tmp_path, vllm_cache, offline_pip,
                                                             monkeypatch):
    from c128a.targets import vllm_release

    monkeypatch.setenv(vllm_release.RUN_ID_ENV, "run-1")  # its failure is remembered, elsewhere
    with pytest.raises(TargetUnavailable, match="the package index has no vllm 0.0.2"):
        load_target("vllm-release:0.0.2")
    assert not cache_folder("0.0.2").exists()
    wheel = make_wheel(tmp_path / "w", "0.0.3", {"vllm/other.py": "X = 1\n"})
    with pytest.raises(TargetUnavailable, match="defines build_c128a_topk_metadata"):
        load_target(f"vllm-release:{wheel}")
    assert not cache_folder("0.0.3").exists()


def _unwritable_cache(tmp_path, read_only, monkeypatch) -> str:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(CACHE_ENV, str(read_only(tmp_path / "empty")))
    return "Read-only file system"


def _corrupt_wheel(tmp_path, read_only, monkeypatch) -> str:
    cache_folder("0.0.1").mkdir(parents=True)
    (cache_folder("0.0.1") / "vllm-0.0.1-py3-none-any.whl").write_bytes(b"not a zip")
    return "is not a readable wheel"


def _no_such_version(tmp_path, read_only, monkeypatch) -> str:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    return "the package index has no vllm 0.0.1"


def _no_network(tmp_path, read_only, monkeypatch) -> str:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    return "pip could not reach the package index"


@pytest.mark.parametrize(
    "fault", [_unwritable_cache, _corrupt_wheel, _no_such_version, _no_network]
)
def test_every_failure_to_load_a_version_is_one_line(tmp_path, vllm_cache, read_only, monkeypatch,
                                                     capsys, c128a_device, fault):
    why = fault(tmp_path, read_only, monkeypatch)
    with pytest.raises(TargetUnavailable) as raised:
        load_target("vllm-release:0.0.1")
    assert "\n" not in str(raised.value) and why in str(raised.value)
    assert "0.0.1" in str(raised.value)
    assert why in refusal(tmp_path, capsys, c128a_device, "vllm-release:0.0.1")


@pytest.fixture
def full_cache(tmp_path, monkeypatch) -> Path:
    """$C128A_CACHE on a real 64 KiB tmpfs holding release 0.0.1's fake wheel
    and a file that took every free byte left; unmounted at the end."""
    with small_tmpfs(tmp_path / "full") as mount_point:
        monkeypatch.setenv(CACHE_ENV, str(mount_point))
        make_wheel(cache_folder("0.0.1"), "0.0.1", {SOURCE_PATH: STAND_IN})
        fill_to_the_last_byte(mount_point)
        yield mount_point


def test_a_full_cache_is_one_line_and_leaves_nothing_half_written(full_cache):
    with pytest.raises(TargetUnavailable) as raised:
        load_target("vllm-release:0.0.1")
    message = str(raised.value)
    assert "\n" not in message and "No space left on device" in message, message
    assert message.startswith("vllm-release:0.0.1: ") and f"${CACHE_ENV}" in message
    folder = cache_folder("0.0.1")
    assert sorted(p.name for p in folder.iterdir()) == ["vllm-0.0.1-py3-none-any.whl"]
