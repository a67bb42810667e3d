"""The two padding-row variants: ``slots`` (vLLM 0.33/0.34: a padding token's
decode row holds real slot ids) and ``inert`` (the row is -1 in every column
< W). How a target declares one and an option overrides it, what the oracle
expects under each, the project's kernel and oracle under ``inert``, the
mutant each variant alone kills, cases that record and replay the variant,
and vLLM 0.34.0 held to ``inert``."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types

import pytest
import torch

from c128a import cases, cli
from c128a.checks import PROPERTIES, check_padding, check_step
from c128a.contract import INERT, SLOTS, oracle, padding_rows_of
from c128a.failures import CaseError, InvariantViolation, ReplayMismatch, TargetSpecError
from c128a.failures import EXIT_FAILED, EXIT_OK, TargetUnavailable
from c128a.mutants import MUTANTS
from c128a.runners.killmatrix import kill_matrix
from c128a.step import build, oracle_build
from c128a.strategies import HISTORICAL_BATCHES
from c128a.targets import (
    PADDING_ROWS_ENV,
    Target,
    held_to,
    load_target,
    resolve_padding_rows,
)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

PADDED = "padding_tail_and_inside"  # tail and inside padding tokens with stale positions
PADDING_BATCHES = [name for name, b in HISTORICAL_BATCHES.items()
                   if any(s < 0 for s in b.slot_mapping[: b.num_decode_tokens])]
KEEPS_SLOTS = "c128a.mutants:inert_claim_keeps_slots"  # declares inert, writes slots
BLANKS = "c128a.mutants:blanks_padding_rows"  # declares slots, writes inert
KILL_EXAMPLES = 5


@pytest.fixture(autouse=True)
def _no_variant_from_the_environment(monkeypatch):
    monkeypatch.delenv(PADDING_ROWS_ENV, raising=False)


# ---------------------------------------------------------------- declaration and options


def test_a_target_declares_its_variant_and_slots_is_the_default():
    assert load_target("triton").padding_rows == SLOTS
    assert load_target("reference").padding_rows == SLOTS
    assert load_target("triton-inert").padding_rows == INERT
    assert load_target("reference-inert").padding_rows == INERT
    assert load_target(KEEPS_SLOTS).padding_rows == INERT
    declared = types.SimpleNamespace(
        build_c128a_topk_metadata=oracle.build_c128a_topk_metadata, padding_rows="inert"
    )
    assert Target.from_object("mine", declared).padding_rows == INERT


@pytest.mark.parametrize("value", ["Inert", "", "-1", 0])
def test_an_unknown_declaration_names_the_target_and_both_variants(value):
    bad = types.SimpleNamespace(
        build_c128a_topk_metadata=oracle.build_c128a_topk_metadata, padding_rows=value
    )
    with pytest.raises(TargetSpecError) as raised:
        Target.from_object("my_kernels:bad", bad)
    message = str(raised.value)
    assert "target 'my_kernels:bad'" in message
    assert f"padding_rows={value!r}" in message and "'slots'" in message and "'inert'" in message
    with pytest.raises(TargetSpecError, match="target 'triton'"):
        dataclasses.replace(load_target("triton"), padding_rows="blank")


def test_overriding_replaces_only_the_variant():
    target = load_target("triton")
    inert = load_target("triton", INERT)
    assert inert == dataclasses.replace(target, padding_rows=INERT)
    assert inert.spec == "triton" and inert.jit_functions == target.jit_functions
    assert held_to(target, None) is target and held_to(target, SLOTS) is target
    assert padding_rows_of(held_to(oracle, INERT)) == INERT  # any target object
    assert padding_rows_of(oracle) == SLOTS


def test_option_wins_over_environment_over_declaration(monkeypatch):
    assert resolve_padding_rows(None) == (None, "declared by the target")
    monkeypatch.setenv(PADDING_ROWS_ENV, "inert")
    assert resolve_padding_rows(None) == (INERT, f"from ${PADDING_ROWS_ENV}")
    assert resolve_padding_rows("slots", "--padding-rows") == (SLOTS, "from --padding-rows")
    monkeypatch.setenv(PADDING_ROWS_ENV, "blank")
    with pytest.raises(TargetSpecError, match=rf"\${PADDING_ROWS_ENV}: padding_rows='blank'"):
        resolve_padding_rows(None)


PROBE = """
def test_probe(c128a_target, c128a_padding_rows_override):
    print("HELD", c128a_target.spec, c128a_target.padding_rows, c128a_padding_rows_override)
"""


@pytest.mark.parametrize(
    "options, env, lines",
    [
        ([], None, ["c128a target: triton (from default)",
                    "c128a padding rows: slots (declared by the target)",
                    "*HELD triton slots None*"]),
        (["--c128a-padding-rows=inert"], None,
         ["c128a padding rows: inert (from --c128a-padding-rows)", "*HELD triton inert inert*"]),
        (["--c128a-target=triton-inert"], "slots",
         ["c128a padding rows: slots (from $C128A_PADDING_ROWS)",
          "*HELD triton-inert slots slots*"]),
        (["--c128a-target=reference-inert"], None,
         ["c128a padding rows: inert (declared by the target)",
          "*HELD reference-inert inert None*"]),
    ],
)
@pytest.mark.slow
def test_plugin_option_and_header(pytester, monkeypatch, options, env, lines):
    if env:
        monkeypatch.setenv(PADDING_ROWS_ENV, env)
    pytester.makepyfile(PROBE)
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "-s", *options)
    result.stdout.fnmatch_lines(lines)
    assert result.ret == 0


@pytest.mark.slow
def test_plugin_refuses_an_unknown_variant(pytester, monkeypatch):
    pytester.makepyfile(PROBE)
    result = pytester.runpytest_subprocess("--c128a-device=cpu", "--c128a-padding-rows=blank")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    monkeypatch.setenv(PADDING_ROWS_ENV, "blank")
    result = pytester.runpytest_subprocess("--c128a-device=cpu")
    result.stderr.fnmatch_lines(["*c128a: $C128A_PADDING_ROWS: padding_rows='blank' must be*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


@pytest.mark.parametrize("command", ["fuzz", "replay", "mutants", "bench"])
def test_every_cli_subcommand_with_a_target_takes_padding_rows(command):
    extra = ["case.json"] if command == "replay" else []
    args = cli.build_parser().parse_args([command, *extra, "--padding-rows", "inert"])
    assert args.padding_rows == INERT
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([command, *extra, "--padding-rows", "blank"])


def test_fuzz_config_file_takes_the_variant(tmp_path):
    from c128a.failures import UsageError
    from c128a.runners.fuzz import load_config_file

    config = tmp_path / "fuzz.toml"
    config.write_text('[fuzz]\npadding-rows = "inert"\n')
    assert load_config_file(str(config)).padding_rows == INERT
    config.write_text('[fuzz]\npadding_rows = "blank"\n')
    with pytest.raises(UsageError, match=r"fuzz.padding_rows='blank': must be one of 'slots'"):
        load_config_file(str(config))


def test_cli_load_holds_the_target_to_the_option_or_environment(monkeypatch):
    from c128a.cli.common import load

    assert load("triton")[0].padding_rows == SLOTS
    assert load("triton", padding_rows="inert")[0].padding_rows == INERT
    monkeypatch.setenv(PADDING_ROWS_ENV, "slots")
    assert load("triton-inert")[0].padding_rows == SLOTS


# ---------------------------------------------------------------- the oracle


@pytest.mark.parametrize("name", PADDING_BATCHES)
def test_oracle_inert_blanks_only_padding_decode_rows(name, c128a_device):
    batch = HISTORICAL_BATCHES[name]
    slots = oracle_build(batch, c128a_device).buffers
    inert = oracle_build(batch, c128a_device, padding_rows=INERT).buffers
    d, t, w = batch.num_decode_tokens, batch.num_tokens, batch.width
    padding = torch.tensor([s < 0 for s in batch.slot_mapping[:d]], device=c128a_device)
    # Inert: every column < W of a padding row is -1; the same lens (0 there).
    assert torch.equal(inert.global_decode[:d, :w][padding],
                       torch.full_like(inert.global_decode[:d, :w][padding], -1))
    assert torch.equal(inert.global_decode[:d][~padding], slots.global_decode[:d][~padding])
    assert torch.equal(inert.decode_lens, slots.decode_lens)
    assert torch.equal(inert.prefill, slots.prefill)
    assert torch.equal(inert.global_decode[d:], slots.global_decode[d:])  # rows past T untouched
    assert int(slots.decode_lens[:d][padding].abs().sum()) == 0
    # Slots: the same padding rows hold real slot ids where n(t) > 0.
    lengths = [min((p + 1) // batch.compress_ratio, w) for p in batch.positions[:d]]
    stale = [i for i in range(d) if batch.slot_mapping[i] < 0 and lengths[i] > 0]
    assert stale or name == "every_length_zero", f"{name}: no padding token with n(t) > 0"
    for row in stale:
        request = batch.token_to_req_indices[row]
        first = batch.block_table[request][0] * batch.block_size
        assert int(slots.global_decode[row, 0]) == first != -1
        assert int(inert.global_decode[row, 0]) == -1
    assert t >= d


def test_reference_inert_refuses_nothing_the_reference_accepts(c128a_device):
    for batch in HISTORICAL_BATCHES.values():
        check_step(load_target("reference-inert"), batch, c128a_device)


# ---------------------------------------------------------------- the project's kernel


@pytest.mark.parametrize("name", list(HISTORICAL_BATCHES))
def test_triton_inert_passes_padding_and_matches_oracle(name, c128a_device):
    target = load_target("triton-inert")
    result = build(target, HISTORICAL_BATCHES[name], c128a_device)
    check_padding(target, result)
    PROPERTIES["matches_oracle"].replay(target, HISTORICAL_BATCHES[name], c128a_device)


def test_triton_inert_gpu_tile_paths(c128a_device):
    """The GPU tile (128-column tiles, decode_lens on the first) and the
    persistent grid-stride loop with the inert flag, under the interpreter too."""
    from c128a.kernels import adaptive
    from c128a.kernels.builder import triton_builder

    launch = functools.partial(adaptive.launch_tiled, tile=(4, 128, 1024), num_warps=4,
                               programs_per_sm=0, max_programs=2, inert_padding=True)
    target = Target("triton-inert, gpu tile", triton_builder(launch), padding_rows=INERT)
    for name in PADDING_BATCHES + ["crosses_1024_columns", "more_than_64_decode_rows"]:
        check_step(target, HISTORICAL_BATCHES[name], c128a_device)


@pytest.mark.parametrize("spec", ["triton", "triton-inert"])
def test_project_kernel_fails_the_other_variant(spec, c128a_device):
    other = SLOTS if spec == "triton-inert" else INERT
    with pytest.raises(InvariantViolation, match=r"\[matches_oracle\] global_decode_buffer row"):
        check_step(load_target(spec, other), HISTORICAL_BATCHES[PADDED], c128a_device)


def test_triton_inert_names_the_kernel_it_launches():
    from c128a.kernels import adaptive

    assert load_target("triton-inert").jit_functions == adaptive.jit_functions


# ---------------------------------------------------------------- mutants


def _killed(target, device) -> dict[str, bool]:
    names = ("padding", "matches_oracle")
    row = kill_matrix([target], device, {n: PROPERTIES[n] for n in names}, KILL_EXAMPLES)
    outcomes = row[str(target.spec)]
    assert not any(o.errored for o in outcomes.values()), outcomes
    return {name: o.killed for name, o in outcomes.items()}


def test_each_variant_has_a_mutant_in_the_registry():
    assert MUTANTS["inert_claim_keeps_slots"].target.padding_rows == INERT
    assert getattr(MUTANTS["blanks_padding_rows"].target, "padding_rows", SLOTS) == SLOTS


def test_keeping_slots_is_killed_under_inert_only(c128a_device):
    assert _killed(load_target(KEEPS_SLOTS), c128a_device) == {
        "padding": True, "matches_oracle": True
    }
    assert _killed(load_target(KEEPS_SLOTS, SLOTS), c128a_device) == {
        "padding": False, "matches_oracle": False
    }


def test_blanking_padding_rows_is_killed_under_slots_only(c128a_device):
    assert _killed(load_target(BLANKS), c128a_device) == {
        "padding": False, "matches_oracle": True
    }
    assert _killed(load_target(BLANKS, INERT), c128a_device) == {
        "padding": False, "matches_oracle": False
    }


def test_the_inert_padding_diff_names_the_row_its_slot_and_the_slot_id(c128a_device):
    batch = HISTORICAL_BATCHES[PADDED]
    target = load_target(KEEPS_SLOTS)
    with pytest.raises(InvariantViolation) as raised:
        check_padding(target, build(target, batch, c128a_device))
    row = next(i for i, s in enumerate(batch.slot_mapping) if s < 0)
    message = str(raised.value)
    assert message.startswith(f"[padding] global_decode_buffer row {row}, column 0: ")
    assert f"the row of a padding token (slot_mapping {batch.slot_mapping[row]} < 0)" in message
    assert "expected -1 in every column < W=" in message
    assert "a slot id (block_table[" in message and "publishes a physical cache index" in message


# ---------------------------------------------------------------- replay harness


@pytest.mark.slow
def test_replay_harness_reads_the_oracle_consumer_of_the_variant(c128a_device):
    from c128a.replay import ReplayHarness

    def harness(target):
        return ReplayHarness(target, c128a_device, max_model_len=81_920, kv_slots=16_384,
                             capture_limit=8)

    def step(h):
        # Two decode tokens, the second one padding at a stale position (n(t) = 7).
        batch = HISTORICAL_BATCHES["entry_boundaries"]
        table = (tuple(range(100, 108)), tuple(range(200, 208)))
        return h.pad(dataclasses.replace(
            batch, positions=(900, 901), num_decode_tokens=2, token_to_req_indices=(0, 1),
            block_table=table, slot_mapping=(900, -1), capacity=h.capacity, width=128,
            buffer_rows=h.rows, block_table_row_stride=0, prefill_extra_columns=0,
        ))

    for spec in ("reference", "reference-inert"):
        h = harness(load_target(spec))
        h.run_step(step(h))
    h = harness(load_target(KEEPS_SLOTS))
    with pytest.raises(ReplayMismatch) as raised:
        h.run_step(step(h))
    assert (raised.value.kind, raised.value.section, raised.value.row) == ("window", "decode", 1)


# ---------------------------------------------------------------- cases


def _case(**fields) -> cases.Case:
    values = dict(property="padding", target="reference", kind="failure",
                  failure="[padding] ...", batch=HISTORICAL_BATCHES[PADDED], device="cpu")
    values.update(fields)
    return cases.new_case(**values)


def test_a_case_records_its_variant_through_json(tmp_path):
    case = _case(padding_rows=INERT)
    path, _ = cases.write_case(case, tmp_path)
    assert json.loads(path.read_text())["padding_rows"] == "inert"
    assert cases.load_case(path) == case
    # The same inputs under the other variant are another failure; an old case keeps its name.
    assert cases.case_filename(case) != cases.case_filename(_case(padding_rows=SLOTS))
    assert cases.case_filename(_case()) != cases.case_filename(case)
    data = case.to_json()
    data["padding_rows"] = "blank"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(CaseError) as raised:
        cases.load_case(tmp_path / "bad.json")
    assert raised.value.field == "padding_rows" and "'slots', 'inert'" in str(raised.value)


def test_replay_holds_the_target_to_the_recorded_variant(c128a_device):
    case = _case(padding_rows=INERT)
    reference = load_target("reference")
    assert not cases.replay_case(case, reference, c128a_device).passed
    assert cases.replay_case(case, load_target("reference-inert"), c128a_device).passed
    assert cases.replay_case(case, reference, c128a_device, padding_rows=SLOTS).passed
    assert cases.replay_case(_case(), reference, c128a_device).passed  # no variant recorded


@pytest.mark.slow
def test_fuzz_records_the_variant_and_replay_reports_it(tmp_path, capsys, c128a_device):
    assert cli.main([
        "fuzz", "--device", c128a_device.type, "--workers", "1", "--no-stateful", "--no-live",
        "--db", "none", "--cases-dir", str(tmp_path / "cases"), "--target", "reference",
        "--padding-rows", "inert", "--only", "padding", "--max-examples", "20", "--exitfirst",
        "--report", str(tmp_path / "report.json"),
    ]) == EXIT_FAILED
    assert json.loads((tmp_path / "report.json").read_text())["padding_rows"] == "inert"
    [saved] = cases.case_files(tmp_path / "cases")
    case = cases.load_case(saved)
    assert (case.target, case.padding_rows) == ("reference", "inert")
    capsys.readouterr()

    replay = ["replay", str(saved), "--device", c128a_device.type]
    assert cli.main(replay) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "padding:  padding_rows=inert (recorded in the case)" in out
    assert "the row of a padding token" in out
    assert cli.main([*replay, "--target", "reference-inert"]) == EXIT_OK
    assert cli.main([*replay, "--padding-rows", "slots"]) == EXIT_OK
    assert "padding:  padding_rows=slots (from --padding-rows)" in capsys.readouterr().out


# ---------------------------------------------------------------- vLLM 0.34.0 held to inert


@pytest.fixture(scope="module")
def release_0_34():
    try:
        return load_target("vllm-release:0.34.0")
    except TargetUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}: CI must run the real-release tests")
        pytest.skip(str(exc))


def test_vllm_0_34_keeps_slots_and_fails_inert(release_0_34, c128a_device):
    batch = HISTORICAL_BATCHES[PADDED]
    assert release_0_34.padding_rows == SLOTS
    check_step(release_0_34, batch, c128a_device)  # what 0.33/0.34 promise
    inert = held_to(release_0_34, INERT)
    with pytest.raises(InvariantViolation) as raised:
        check_padding(inert, build(inert, batch, c128a_device))
    row = next(i for i, s in enumerate(batch.slot_mapping) if s < 0)
    message = str(raised.value)
    assert f"global_decode_buffer row {row}, column 0" in message
    assert f"the row of a padding token (slot_mapping {batch.slot_mapping[row]} < 0)" in message
    assert "expected -1 in every column < W" in message and "a slot id" in message
