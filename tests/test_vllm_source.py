"""The ``vllm-source:PATH[@REF]`` target, and what a builder declares about
the widths it is called at.

The checkout is one the tests build (:mod:`vllm_checkout`: the project's
reference builder written as a vLLM source file, a mutant, a revert, a
moved file, a changed signature); vLLM's own 0.34.0 files are put in a
repository at test time only, from the cached wheel.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from c128a import cli
from c128a.checks import PROPERTIES
from c128a.contract import oracle
from c128a.failures import EXIT_USAGE, InvariantViolation, TargetSpecError, TargetUnavailable
from c128a.runners.killmatrix import ci_settings, run_property
from c128a.targets import Target, load_target
from c128a.targets.vllm_release import CACHE_ENV, EXTRACT_NAME, WIDTHS_ENV, cache_folder, cached_wheel
from c128a.targets.vllm_source import PREFIX
from vllm_checkout import MOVED, USUAL, commit, git, make_checkout

CONSUMER_FILES = ("vllm/models/deepseek_v4/common/ops/cache_utils.py",
                  "vllm/models/deepseek_v4/attention.py")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """(path, {label: commit}) of the tests' vLLM-like checkout, with a
    cache of extracts of its own for the module."""
    root = tmp_path_factory.mktemp("vllm-source")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(root / "cache"))
        patch.delenv(WIDTHS_ENV, raising=False)
        yield root / "vllm", make_checkout(root / "vllm")


def spec(checkout, label: str) -> str:
    path, commits = checkout
    return f"{PREFIX}:{path}@{commits[label]}"


def refusal(tmp_path, capsys, device, target_spec: str) -> str:
    """What ``c128a fuzz --target SPEC`` says: exit 2, one line, no case."""
    capsys.readouterr()
    status = cli.main([
        "fuzz", "--device", device.type, "--workers", "1", "--no-stateful", "--no-live",
        "--only", "matches_oracle", "--max-examples", "2", "--db", str(tmp_path / "db"),
        "--cases-dir", str(tmp_path / "cases"), "--target", target_spec,
    ])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE, err
    assert not list((tmp_path / "cases").rglob("*.json"))
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- each revision


def test_each_revision_loads_from_where_it_defines_the_builder(checkout, c128a_device):
    path, commits = checkout
    for label in ("reference", "mutant", "moved", "revert", "fixed"):
        target = load_target(spec(checkout, label))
        assert callable(target.build_c128a_topk_metadata), label
        assert str(target.spec).endswith(commits[label])
    extract = Path(load_target(spec(checkout, "moved")).build_c128a_topk_metadata
                   .__code__.co_filename)
    assert extract.name == EXTRACT_NAME
    assert f"# c128a-source: {MOVED}" in extract.read_text()
    # The checkout has no consumers' files: each is named, the oracle's stand in.
    gaps = dict(load_target(spec(checkout, "reference")).consumer_gaps)
    assert set(gaps) == {"global_topk", "mixed_sparse", "combine_swa", "short_context_fill"}
    assert all(f"defined nowhere at commit {commits['reference'][:12]}" in why
               for why in gaps.values()), gaps


def test_a_revision_without_the_builder_is_one_line_naming_it(checkout, tmp_path, capsys,
                                                               c128a_device):
    with pytest.raises(TargetUnavailable) as raised:
        load_target(spec(checkout, "empty"))
    message = str(raised.value)
    assert "\n" not in message
    assert checkout[1]["empty"][:12] in message and '"Add the vllm package"' in message
    assert f"no file of vllm/ defines build_c128a_topk_metadata" in message
    assert f"{USUAL} is missing" in message
    line = refusal(tmp_path, capsys, c128a_device, spec(checkout, "empty"))
    assert "Add the vllm package" in line


def test_a_changed_signature_is_refused_at_load_naming_what_differs(checkout, tmp_path, capsys,
                                                                    c128a_device):
    with pytest.raises(TargetUnavailable) as raised:
        load_target(spec(checkout, "signature"))
    message = str(raised.value)
    assert "\n" not in message
    assert checkout[1]["signature"][:12] in message and '"Share one topk buffer"' in message
    assert "no parameter for global_decode_buffer, prefill_buffer" in message
    assert "requires topk_buffer, which vLLM does not pass" in message
    assert "Share one topk buffer" in refusal(tmp_path, capsys, c128a_device,
                                              spec(checkout, "signature"))


def test_an_unloadable_revision_stops_pytest_with_exit_status_4(checkout, runpytest_on_the_cpu):
    result = runpytest_on_the_cpu("--pyargs", "c128a.conformance.test_properties", "-p",
                                  "no:cacheprovider", f"--c128a-target={spec(checkout, 'signature')}")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*does not load*topk_buffer*"])


def test_any_builder_whose_signature_differs_is_refused_naming_the_parameters():
    def ten(positions, compress_ratio, num_decode_tokens, token_to_req_indices, block_table,
            block_size, slot_mapping, topk_buffer, decode_lens_buffer, max_compressed_tokens=8192):
        raise AssertionError("never called")

    with pytest.raises(TargetSpecError) as raised:
        Target.from_object("fork", SimpleNamespace(build_c128a_topk_metadata=ten))
    assert "no parameter for global_decode_buffer, prefill_buffer" in str(raised.value)
    assert "\n" not in str(raised.value)
    # A wrapper passing *args on is taken as it is; so are the project's builders.
    Target.from_object("wrapper", SimpleNamespace(build_c128a_topk_metadata=lambda *a: a))
    Target.from_object("reference", oracle)


@pytest.mark.parametrize("argument, message", [
    ("", "needs a vLLM checkout"),
    ("/nonexistent/vllm", "is not an existing folder"),
])
def test_bad_specs_are_spec_errors(argument, message):
    with pytest.raises(TargetSpecError, match=message):
        load_target(f"{PREFIX}:{argument}")


def test_a_folder_that_is_no_checkout_or_lacks_the_revision_is_a_spec_error(checkout, tmp_path):
    with pytest.raises(TargetSpecError, match="is not a git checkout"):
        load_target(f"{PREFIX}:{tmp_path}")
    with pytest.raises(TargetSpecError, match="has no commit 'no-such-branch'"):
        load_target(f"{PREFIX}:{checkout[0]}@no-such-branch")


def test_revisions_are_read_from_git_without_touching_the_work_tree(checkout, tmp_path):
    path, commits = checkout
    (path / "vllm" / "other.py").write_text("VERSION = 'edited, not committed'\n")
    before = git(path, "status", "--porcelain"), git(path, "rev-parse", "HEAD")
    files = {p: p.read_bytes() for p in path.rglob("*") if p.is_file() and ".git" not in p.parts}
    for label in ("reference", "moved", "fixed"):
        load_target(spec(checkout, label))
    assert load_target(f"{PREFIX}:{path}").spec == f"{PREFIX}:{path}"  # HEAD, the branch's tip
    assert (git(path, "status", "--porcelain"), git(path, "rev-parse", "HEAD")) == before
    assert files == {p: p.read_bytes() for p in path.rglob("*")
                     if p.is_file() and ".git" not in p.parts}
    git(path, "checkout", "--", "vllm/other.py")


def test_extracts_are_cached_by_the_files_blobs(checkout, tmp_path):
    """Two commits whose builder file is the same share one extract folder;
    a damaged extract is refused with the remedy, not imported."""
    first = load_target(spec(checkout, "reference")).build_c128a_topk_metadata
    second = load_target(spec(checkout, "unrelated")).build_c128a_topk_metadata
    assert first.__code__.co_filename == second.__code__.co_filename
    extract = Path(first.__code__.co_filename)
    written = extract.read_text()
    assert "# c128a-git-blob: " in written
    extract.write_text(written.replace("_TOPK_ALIGNMENT = 128", "_TOPK_ALIGNMENT = 64"))
    try:
        load_target(spec(checkout, "unrelated"))  # rebuilt from git, under the lock
        assert extract.read_text() == written
    finally:
        extract.write_text(written)


# ---------------------------------------------------------------- the widths it is called at


def test_the_engine_call_declares_a_fixed_width_builder(checkout):
    target = load_target(spec(checkout, "fixed"))
    assert target.fixed_width
    assert "recognised: the engine call at vllm/attention/c128a.py:" in target.fixed_width_origin
    assert "max_compressed_tokens=self.capacity" in target.fixed_width_origin
    adaptive = load_target(spec(checkout, "reference"))
    assert not adaptive.fixed_width and adaptive.uses_project_policy


def test_a_source_file_or_wheel_declares_its_engines_widths_too(tmp_path, monkeypatch):
    """``vllm-release:PATH`` reads the same call: a fixed-width file given
    alone is held to W = C, an adaptive one to every width."""
    from vllm_checkout import FIXED, REFERENCE

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(WIDTHS_ENV, raising=False)
    for name, text, fixed in (("fixed.py", FIXED, True), ("adaptive.py", REFERENCE, False)):
        (tmp_path / name).write_text(text)
        target = load_target(f"vllm-release:{tmp_path / name}")
        assert target.fixed_width is fixed, name
    assert "passes max_compressed_tokens=width, a width chosen per step" in (
        Path(target.build_c128a_topk_metadata.__code__.co_filename).read_text())


WIDTH_CHECKS = ("views", "matches_oracle", "width_policy", "history_independent")
"""The checks that draw W (history_independent: the earlier step's W too)."""


def test_a_fixed_width_builder_declared_as_such_passes(checkout, c128a_device):
    target = load_target(spec(checkout, "fixed"))
    for name in WIDTH_CHECKS:
        outcome = run_property(PROPERTIES[name], target, c128a_device, ci_settings(2))
        assert not outcome.killed and not outcome.errored, (name, outcome.message)


def test_the_same_builder_undeclared_fails_views(checkout, c128a_device, monkeypatch):
    monkeypatch.setenv(WIDTHS_ENV, "adaptive")
    target = load_target(spec(checkout, "fixed"))
    assert not target.fixed_width
    outcome = run_property(PROPERTIES["views"], target, c128a_device, ci_settings(4))
    assert outcome.killed and "has shape" in outcome.message, outcome.message
    monkeypatch.setenv(WIDTHS_ENV, "fixed")
    forced = load_target(spec(checkout, "reference"))
    assert forced.fixed_width and forced.fixed_width_origin == f"from ${WIDTHS_ENV}=fixed"
    monkeypatch.setenv(WIDTHS_ENV, "sometimes")
    with pytest.raises(TargetSpecError, match="is not one of auto, fixed, adaptive"):
        load_target(spec(checkout, "reference"))


def test_any_target_may_declare_a_fixed_width(c128a_device):
    """Every W drawn is then C, the explicit examples' too, and the
    width_policy check holds it to W = C; the header says so."""
    from c128a.plugin.pytest_plugin import widths_line

    target = Target.from_object("fixed oracle", SimpleNamespace(
        build_c128a_topk_metadata=oracle.build_c128a_topk_metadata, fixed_width=True))
    widths = []

    def around(batch, run):
        widths.append((batch.width, batch.capacity, batch.prefill_extra_columns))
        run()

    PROPERTIES["views"].test(target, c128a_device, settings=ci_settings(10), around=around)()
    assert widths and all(w == c and extra == 0 for w, c, extra in widths), widths
    assert widths_line(target) == ("c128a widths: W = C only, a fixed-width builder (declared "
                                   "by the target)")
    outcome = run_property(PROPERTIES["width_policy"], target, c128a_device, ci_settings(3))
    assert not outcome.killed and not outcome.errored, outcome.message
    # A target declared fixed-width whose policy still adapts breaks width_policy.
    adapting = dataclasses.replace(load_target("reference"), fixed_width=True,
                                   fixed_width_origin="declared by a test")
    with pytest.raises(InvariantViolation, match="declares a fixed width .declared by a test"):
        PROPERTIES["width_policy"].replay(adapting, PROPERTIES["views"].examples[0],
                                          c128a_device)
    with pytest.raises(TargetSpecError, match="declare one"):
        Target.from_object("both", SimpleNamespace(
            build_c128a_topk_metadata=oracle.build_c128a_topk_metadata, fixed_width=True,
            active_topk_width=lambda s, r, c: c))


# ---------------------------------------------------------------- vLLM 0.34.0's own files


@pytest.fixture(scope="module")
def release_checkout(tmp_path_factory):
    """A repository whose one commit holds vLLM 0.34.0's builder and
    consumer files, taken at test time from the cached wheel (nothing of
    vLLM is kept in this repository)."""
    from c128a.targets.vllm_release import SOURCE_PATH

    wheel = cached_wheel(cache_folder("0.34.0"), "0.34.0")
    if wheel is None:
        try:
            load_target("vllm-release:0.34.0")  # downloads it, as the release's tests do
        except TargetUnavailable as exc:
            if subprocess.os.environ.get("CI"):
                pytest.fail(f"{exc}: CI must run the vLLM 0.34.0 tests")
            pytest.skip(f"no cached vLLM 0.34.0 wheel, and it cannot be fetched: {exc}")
        wheel = cached_wheel(cache_folder("0.34.0"), "0.34.0")
    root = tmp_path_factory.mktemp("vllm-0.34.0")
    with zipfile.ZipFile(wheel) as archive:
        files = {name: archive.read(name).decode() for name in (SOURCE_PATH, *CONSUMER_FILES)}
    git(root, "init", "-q", "-b", "main")
    release = commit(root, "vLLM 0.34.0's files", files)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(root.parent / "cache-0.34.0"))
        yield f"{PREFIX}:{root}@{release}"
    shutil.rmtree(root, ignore_errors=True)


def test_vllm_0_34_0_from_source_finds_the_wheels_compile_key_miss(release_checkout,
                                                                 c128a_device):
    target = load_target(release_checkout)
    assert not target.consumer_gaps and not target.fixed_width
    failing = []

    def around(batch, run):
        try:
            run()
        except InvariantViolation:
            failing.append(batch)
            raise

    with pytest.raises(InvariantViolation) as raised:
        PROPERTIES["compile_keys"].test(target, c128a_device, settings=ci_settings(20),
                                        around=around)()
    message = str(raised.value)
    for part in ("consumer global_topk", "ComputeGlobalTopkIndicesAndLensKernel",
                 "topk_indices_stride", "is warmed only with"):
        assert part in message, (part, message)
    with pytest.raises(InvariantViolation, match="topk_indices_stride"):
        PROPERTIES["compile_keys"].replay(target, failing[-1], c128a_device)
