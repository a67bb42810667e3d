"""The suite proves its reach: every property's strategy draws every bucket
of every dimension of the input space that applies to it.

The reach counterpart of the kill matrix (:mod:`c128a.runners.reach`): each
property's own Hypothesis test runs with a check that builds nothing and
records where each drawn step falls (:mod:`c128a.strategies.reach`), under
each device's size budget (:mod:`c128a.strategies.budget`; a name only: no
device is touched). A bucket a property should reach and never draws fails,
naming the property, the dimension and the bucket.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from c128a import cli
from c128a.checks import PROPERTIES
from c128a.runners import killmatrix
from c128a.runners.reach import (
    BUDGET_DEVICES,
    README_END,
    README_PAIRS_END,
    README_PAIRS_START,
    README_START,
    REACH_EXAMPLES,
    ENGINE_PAIR_EXAMPLES,
    LEAST_CELL_SHARE,
    ci_profile_reach,
    ci_settings,
    drawn_engine_reach,
    drawn_reach,
    markdown_pairs,
    markdown_reach,
    missing_pairs_text,
    missing_text,
    pair_rows,
    reach_rows,
    unreached,
    unreached_pairs,
)
from c128a.strategies import batches
from c128a.strategies.budget import CPU_BUDGET, size_budget
from c128a.strategies.constraints import CONTRACT, HIDDEN, model
from c128a.strategies.pairs import BY_PAIR_NAME, DIMENSIONS as PAIR_DIMENSIONS, ENGINE_CELLS
from c128a.strategies.pairs import (
    IN_PAIRS,
    INTERACTIONS,
    PAIRS,
    TRIPLES,
    cell_status,
    expected_cells,
    pair_table,
    pairs_of,
)
from c128a.strategies.reach import DIMENSIONS, HISTORY, ONE_BUILD, beyond_budget, expected
from helpers import fill_to_the_last_byte, small_tmpfs

REACH_PAGE = Path(__file__).parent.parent / "docs" / "reference" / "reach-tables.md"
"""The docs page that holds the generated reach tables."""


@pytest.mark.parametrize("device", BUDGET_DEVICES)
@pytest.mark.parametrize("name", list(PROPERTIES))
def test_property_reaches_every_bucket_and_allowed_pair_cell(name, device):
    """Every bucket the property reaches, and LEAST_CELL_SHARE of the
    allowed cells of every pair of dimensions and every declared triple
    (each cell never drawn named where the share falls short): the buckets
    and the small steps' cells in its 1,000 reach draws (one test, so that
    the draws are drawn once, on one worker), the cells only an
    engine-scale step can be in in draws of engine-scale steps only (one
    step in 8 is one: the reach draws hold too few for every such cell).
    And no drawn step lies in a cell the contract forbids: each rule the
    model holds is true of every step drawn."""
    prop = PROPERTIES[name]
    counts = drawn_reach(prop, device, ci_settings(REACH_EXAMPLES))
    engine_counts = drawn_engine_reach(prop, device)
    buckets = unreached(prop, counts, device)
    cells = unreached_pairs(prop, counts, device, engine=False)
    engine = unreached_pairs(prop, engine_counts, device, engine=True)
    statuses = cell_status(size_budget(device))
    impossible = [f"{name}: {key[0]}: cell {BY_PAIR_NAME[key[0]].text(key[1])} drawn "
                  f"{n} times but {statuses[key][1]}"
                  for drawn in (counts, engine_counts) for key, n in drawn.items()
                  if key in statuses and statuses[key][0] == CONTRACT]
    allowed = sum(len(c) for scale in (False, True)
                  for c in expected_cells(prop.reach, size_budget(device), scale).values())
    share = 1 - (len(cells) + len(engine)) / max(allowed, 1)
    draws = f"{REACH_EXAMPLES} derandomised draws"
    assert not buckets and share >= LEAST_CELL_SHARE and not impossible, "\n".join(
        text for text in (
            missing_text({(name, device): buckets}, draws) if buckets else "",
            f"{name}: {share:.2%} of {allowed:,} allowed cells drawn, below "
            f"LEAST_CELL_SHARE={LEAST_CELL_SHARE:.1%}" if share < LEAST_CELL_SHARE else "",
            missing_pairs_text({(name, device): cells}, draws) if share < LEAST_CELL_SHARE else "",
            missing_pairs_text({(name, device): engine},
                               f"{ENGINE_PAIR_EXAMPLES} derandomised engine-scale draws")
            if share < LEAST_CELL_SHARE else "",
            *impossible,
        ) if text)


def test_a_pair_cell_never_drawn_is_named_with_its_property_pair_and_cell():
    small_only = dataclasses.replace(
        PROPERTIES["matches_oracle"], name="small_only",
        strategy=lambda target, max_tokens, budget: batches(target, max_tokens=8, layouts=False),
    )
    missing = unreached_pairs(small_only, drawn_reach(small_only, "cpu", ci_settings(50)), "cpu")
    cell = ("buffer layout x width against need", ("one pool for both buffers", "C"))
    assert cell in missing
    assert ("tokens T x decode/prefill mix", ("above 8,192", "prefill only")) in missing
    assert ("small_only: pair buffer layout x width against need: cell "
            "'one pool for both buffers' x 'C' never drawn in 50 draws (cpu budget)") in (
        missing_pairs_text({("small_only", "cpu"): missing}, "50 draws"))


def test_the_model_names_every_cell_it_leaves_out_with_the_reason():
    table = pair_table({}, size_budget("cpu"))
    mix = table["tokens T x decode/prefill mix"]["cells"]
    assert mix["0 x decode only"].startswith("forbidden by the contract: a step has no tokens")
    assert mix["above 8,192 x decode only"].startswith("forbidden by the contract: 512 requests")
    assert mix["65-1,024 x decode only"] == 0
    capacity = table["capacity C x width W"]["cells"]
    assert capacity["128 x 256-1,023"].startswith("forbidden by the contract: W <= C")
    position = table["compress ratio R x position magnitude"]["cells"]
    assert position["1 x 524,288 and more"].startswith(
        "beyond the size budget: C <= 8,192 columns hold at most 8,192 positions")
    every = sum(len(interaction.cells()) for interaction in INTERACTIONS)
    assert sum(len(entry["cells"]) for entry in table.values()) == every


def test_the_model_derives_cells_no_rule_names_with_the_rules_that_do():
    """No rule speaks of one token beside speculative decoding's long
    requests through the decode rows, nor of one request beside more than
    64 decode rows: the cells follow from the rules, with their reasons."""
    table = pair_table({}, size_budget("cpu"))
    lone = table["tokens T x speculative decode"]["cells"]["1 x 2-8 tokens a request"]
    assert lone.startswith("forbidden by the contract: one token is not several tokens")
    requests = table["requests x decode rows"]["cells"]["1 x above 64"]
    assert requests.startswith("forbidden by the contract: ")
    assert "T <= 8 x requests + 8" in requests
    engine = table["tokens T x capacity C"]["cells"]["above 8,192 x a power of two above 128"]
    assert engine.startswith("beyond the size budget: T x W elements, W <= C, T x C within "
                             "max_elements=1,179,648")


def test_every_pair_of_dimensions_is_an_interaction_and_the_counts_add_up():
    names = list(PAIR_DIMENSIONS)
    assert len(PAIRS) == len(names) * (len(names) - 1) // 2
    assert {frozenset(p.dimensions) for p in PAIRS} == {
        frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1:]}
    assert [t.dimensions for t in TRIPLES] == [
        ("tokens T", "decode/prefill mix", "padding"),
        ("buffer layout", "buffer row alignment", "width against need")]
    statuses = cell_status(size_budget("cpu"))
    assert len(statuses) == sum(len(i.cells()) for i in INTERACTIONS)
    assert not set(HIDDEN) & set(PAIR_DIMENSIONS)


def test_propagating_each_bucket_finds_the_cells_propagating_each_cell_does():
    """Cells are found allowed by fixing one bucket at a time (fast: the
    expected cells of every property come from it); fixing both buckets of
    each pair finds the same cells."""
    the_model = model(size_budget("cpu"))
    statuses = cell_status(size_budget("cpu"))
    for interaction in PAIRS:
        for cell in interaction.cells():
            allowed = the_model.allows(dict(zip(interaction.dimensions, cell)))
            assert allowed == (statuses[interaction.name, cell][0] == "allowed"), (
                interaction.name, cell)


def test_a_property_that_leaves_a_dimension_out_leaves_its_pairs_out():
    # The width policy reads R and the model length only: their pairs with C.
    assert {p.name for p in pairs_of(PROPERTIES["width_policy"].reach)} == {
        "compress ratio R x capacity C", "compress ratio R x model length",
        "capacity C x model length"}
    rejects = expected_cells(PROPERTIES["rejects_bad_input"].reach)
    assert ("0", "no tokens") not in rejects["tokens T x decode/prefill mix"]
    consumers = expected_cells(PROPERTIES["consumers"].reach)
    assert ("65-1,024", "decode only") not in consumers["tokens T x decode/prefill mix"]
    assert ("2-64", "decode only") in consumers["tokens T x decode/prefill mix"]
    # The policy's widths only: W = 8,192 is C, never beside a short list.
    policy = expected_cells(PROPERTIES["adaptive_equals_full"].reach)
    assert ("1-127", "8,192 and more") not in policy["longest list n(t) x width W"]
    assert ("1-127", "8,192 and more") in expected_cells(PROPERTIES["matches_oracle"].reach)[
        "longest list n(t) x width W"]


def test_the_pair_table_shows_the_cells_never_drawn_first(tmp_path):
    pair = BY_PAIR_NAME["padding x speculative decode"]
    table = pair_table({pair.label(("tail", "1 token a request")): 3}, size_budget("cpu"))
    assert table[pair.name]["cells"]["tail x 1 token a request"] == 3
    assert "none x 1 token a request" in table[pair.name]["never drawn"]
    with (tmp_path / "out").open("w") as out:
        Console(file=out, width=400, color_system=None).print(pair_rows(table))
    shown = (tmp_path / "out").read_text()
    assert "speculative decode" in shown and "padding x speculative decode: none x 1 token" in shown
    assert "1 / " in shown  # the one cell drawn, of those with the dimension


def test_the_ci_profile_reaches_every_bucket():
    """The draws of the ci profile itself (those ``c128a/conformance/test_properties.py``
    makes in CI, the historical steps included) reach, over all properties,
    every bucket the interpreter's budget allows: a CI run shows each one."""
    drawn = ci_profile_reach(PROPERTIES, "cpu")
    left_out = beyond_budget(CPU_BUDGET)
    missing = [
        (d.name, bucket) for d in DIMENSIONS for bucket in d.buckets
        if bucket not in left_out.get(d.name, ()) and not drawn[d.name, bucket]
    ]
    assert not missing, missing_text({("every property", "cpu"): missing}, "the ci profile")


REGENERATE = "run c128a reach --update-docs docs/reference/reach-tables.md"


def test_the_docs_show_the_reach_table_of_these_strategies():
    text = REACH_PAGE.read_text()
    shown = re.search(re.escape(README_START) + r"\n(.*)\n" + re.escape(README_END), text,
                      re.DOTALL)
    assert shown, f"{REACH_PAGE.name} has no {README_START} ... {README_END} markers"
    assert shown.group(1) == markdown_reach(PROPERTIES), (
        f"{REACH_PAGE.name}'s reach table is stale: {REGENERATE}"
    )


def test_the_docs_show_the_pair_table_of_these_strategies():
    text = REACH_PAGE.read_text()
    shown = re.search(re.escape(README_PAIRS_START) + r"\n(.*)\n" + re.escape(README_PAIRS_END),
                      text, re.DOTALL)
    assert shown, f"{REACH_PAGE.name} has no {README_PAIRS_START} ... {README_PAIRS_END} markers"
    assert shown.group(1) == markdown_pairs(PROPERTIES), (
        f"{REACH_PAGE.name}'s reach table of pairs is stale: {REGENERATE}"
    )


def test_the_gpu_budget_reaches_buckets_the_interpreters_does_not():
    assert beyond_budget(size_budget("cuda")) == {}
    assert beyond_budget(size_budget("cpu")) == {"elements T x W": ("above 8,388,608",)}


def test_a_bucket_never_drawn_is_named_with_its_property_and_dimension():
    small_only = dataclasses.replace(
        PROPERTIES["matches_oracle"], name="small_only",
        strategy=lambda target, max_tokens, budget: batches(target, max_tokens=8, layouts=False),
    )
    counts = drawn_reach(small_only, "cpu", ci_settings(50))
    missing = unreached(small_only, counts, "cpu")
    for bucket in (("tokens T", "above 8,192"), ("requests", "257-512"),
                   ("buffer layout", "one pool for both buffers")):
        assert bucket in missing
    assert "small_only: tokens T: bucket 'above 8,192' never drawn in 50 draws (cpu budget)" in (
        missing_text({("small_only", "cpu"): missing}, "50 draws"))


def test_the_command_lists_what_a_short_run_misses(capsys):
    assert cli.main(["reach", "--property", "views", "--examples", "5"]) == 1
    out = capsys.readouterr().out
    assert "views: tokens T: bucket 'above 8,192' never drawn in 5 derandomised draws" in out


def test_the_command_lists_the_cells_left_out_and_what_the_ci_profile_misses(capsys):
    # width_policy's 36 cells all come up in its CI draws' 1,000 (not in 200).
    status = cli.main(["reach", "--property", "width_policy", "--examples", "1000",
                       "--left-out", "--ci"])
    out = capsys.readouterr().out
    assert status == 0, out[-2000:]
    assert ("tokens T x decode/prefill mix: 0 x decode only: forbidden by the contract "
            "(cpu budget): a step has no tokens exactly when its mix is 'no tokens'") in out
    assert re.search(r"the ci profile's draws reach [\d,]+ of [\d,]+ allowed cells \(cpu budget\)"
                     r"; never drawn:\n  (pair|triple) [^:]+: cell '", out)


@pytest.mark.parametrize("argv, message", [
    (["--examples", "0"], "--examples=0 must be >= 1"),
    (["--property", "nope"], "unknown --property nope"),
    (["--update-docs", "/nonexistent/reach-tables.md"], "no such file"),
    (["--examples", "100001"], "--examples=100001 must be >= 1 and <= 100,000"),
    (["--examples", str(10**12)], f"--examples={10**12} must be >= 1 and <= 100,000"),
])
def test_the_command_refuses_bad_options(argv, message, capsys):
    assert cli.main(["reach", *argv]) == 2
    assert message in capsys.readouterr().err


def test_each_property_names_only_dimensions_that_exist():
    names = {d.name for d in DIMENSIONS}
    pair_names = set(BY_PAIR_NAME) | {ENGINE_CELLS}
    in_pairs = {name + IN_PAIRS for name in PAIR_DIMENSIONS}
    the_model = model()
    for prop in PROPERTIES.values():
        assert set(prop.reach) <= (names | set(PAIR_DIMENSIONS) | pair_names | in_pairs
                                   | set(HIDDEN)), prop.name
        for dimension, buckets in prop.reach.items():
            if dimension in pair_names:
                cells = () if dimension == ENGINE_CELLS else BY_PAIR_NAME[dimension].cells()
                assert buckets is None or set(buckets) <= set(cells), (prop.name, dimension)
                continue
            if dimension in HIDDEN:
                known = the_model.values[the_model.index(dimension)]
            else:
                known = PAIR_DIMENSIONS[dimension.removesuffix(IN_PAIRS)].buckets
            assert buckets is None or set(buckets) <= set(known), (prop.name, dimension)
    assert set(expected(ONE_BUILD)) == names - set(HISTORY)
    assert HISTORY == ("width history", "decode rows history", "prefill rows history",
                       "tokens history", "layout history", "geometry history", "address reuse")


def test_the_reach_table_lists_every_bucket_and_marks_the_missing(tmp_path):
    table = {d.name: {b: 0 for b in d.buckets} for d in DIMENSIONS}
    table["tokens T"]["1"] = 7
    with (tmp_path / "out").open("w") as out:
        Console(file=out, width=400, color_system=None).print(reach_rows(table))
    shown = (tmp_path / "out").read_text()
    assert "tokens T" in shown and "1: 7" in shown and "above 8,192: 0" in shown
    assert all(d.name in shown for d in DIMENSIONS)


# ---------------------------------------------------------------- --update-docs on real faults

_MARKED = (f"{README_START}\nthe old table\n{README_END}\nmore\n"
           f"{README_PAIRS_START}\nthe old pairs\n{README_PAIRS_END}\n"
           f"{killmatrix.README_START}\nthe old matrix\n{killmatrix.README_END}\n")
OLD_PAGE = "intro\n".ljust(10 * 4096 - 64 - len(_MARKED), ".") + _MARKED
"""Just under ten 4 KiB pages: a new table makes it longer than the pages
it frees when it is truncated, so writing it in place on a full disk
would leave it cut short."""


@pytest.fixture
def page_in_a_read_only_folder(tmp_path):
    """A docs page in a folder mounted read-only (root ignores mode bits)."""
    with small_tmpfs(tmp_path / "ro") as folder:
        (folder / "tables.md").write_text(OLD_PAGE)
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield folder / "tables.md"


@pytest.fixture
def page_on_a_full_disk(tmp_path):
    """A docs page on a filesystem a filler file has filled: creating a
    file still works, writing a byte fails with ENOSPC."""
    with small_tmpfs(tmp_path / "full") as folder:
        (folder / "tables.md").write_text(OLD_PAGE)
        fill_to_the_last_byte(folder)
        yield folder / "tables.md"


def _one_line_and_the_page_as_it_was(page: Path, captured, command: str, words: str) -> None:
    [line] = captured.err.splitlines()
    assert line.startswith(f"c128a {command}: --update-docs {page}: ") and words in line, line
    assert "Traceback" not in captured.err
    assert page.read_text() == OLD_PAGE
    assert sorted(p.name for p in page.parent.iterdir()) in (["tables.md"],
                                                              ["filler", "tables.md"])


def test_reach_update_docs_in_a_read_only_folder_is_one_line_exit_2(
    page_in_a_read_only_folder, capsys
):
    page = page_in_a_read_only_folder
    status = cli.main(["reach", "--property", "views", "--examples", "1",
                       "--update-docs", str(page)])
    assert status == 2
    _one_line_and_the_page_as_it_was(page, capsys.readouterr(), "reach",
                                     "Read-only file system")


def test_reach_update_docs_on_a_full_disk_leaves_the_page_whole(page_on_a_full_disk, capsys):
    """The new table is written aside and renamed over the page: a disk
    that fills leaves the old page, never a truncated one."""
    page = page_on_a_full_disk
    status = cli.main(["reach", "--property", "views", "--examples", "1",
                       "--update-docs", str(page)])
    assert status == 2
    _one_line_and_the_page_as_it_was(page, capsys.readouterr(), "reach",
                                     "No space left on device")


def test_mutants_update_docs_in_a_read_only_folder_is_refused_before_any_row(
    page_in_a_read_only_folder, capsys, c128a_device
):
    page = page_in_a_read_only_folder
    status = cli.main(["mutants", "--device", c128a_device.type,
                       "--spec", "c128a.mutants:packed_stride",
                       "--expect-pass", "reference", "--property", "views", "--max-examples", "1",
                       "--markdown", "--update-docs", str(page)])
    assert status == 2
    captured = capsys.readouterr()
    assert "packed_stride" not in captured.out  # no matrix: refused before it
    _one_line_and_the_page_as_it_was(page, captured, "mutants", "Read-only file system")


def test_update_page_replaces_only_the_marked_text_and_keeps_the_mode(tmp_path):
    from c128a.runners.readme import update_page

    page = tmp_path / "tables.md"
    page.write_text(OLD_PAGE)
    page.chmod(0o640)
    update_page(page, "the new table", README_START, README_END, "the reach table")
    assert page.read_text() == OLD_PAGE.replace("the old table", "the new table")
    assert page.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["tables.md"]


@pytest.mark.parametrize("command", ["reach", "mutants"])
def test_update_readme_is_still_the_update_docs_option(command):
    """``--update-readme``, the option's name while the tables lived in the
    README, still parses as ``--update-docs``."""
    parser = cli.build_parser()
    args = parser.parse_args([command, "--update-readme", "page.md"])
    assert args.update_docs == Path("page.md")


def test_reach_update_readme_still_writes_the_tables(tmp_path, capsys):
    """The alias does the option's work: both reach tables written between
    their markers."""
    page = tmp_path / "tables.md"
    page.write_text(OLD_PAGE)
    assert cli.main(["reach", "--property", "views", "--examples", "1",
                     "--update-readme", str(page)]) in (0, 1)
    text = page.read_text()
    assert "the old table" not in text and "the old pairs" not in text
    assert "the old matrix" in text and "| dimension | bucket |" in text


SERVING_LOOP_REACH = ci_settings(8)
"""The serving loop's draws for its reach: a few runs (each step builds)."""


def test_the_serving_loop_reaches_every_history_bucket():
    """The serving loop's steps (as serving_loop_machine draws them: with
    steps after another layer's), against the build before each (the loop's
    own last step, or another layer's of another shape), reach every bucket
    of every history dimension. Built with the reference builder and no
    checks: the reach is the draws'."""
    from collections import Counter

    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from c128a.replay import build_machine
    from c128a.replay.serving import MAX_OTHER_LAYER_STEPS
    from c128a.strategies.reach import BY_NAME, parse_label
    from c128a.targets import load_target

    labels: Counter = Counter()
    machine = build_machine(load_target("reference"), "cpu", check_invariants=False,
                            check_window=False, on_reach=labels.update,
                            other_layer_steps=MAX_OTHER_LAYER_STEPS)
    run_state_machine_as_test(machine, settings=settings(SERVING_LOOP_REACH,
                                                         stateful_step_count=20))
    drawn = {parse_label(label) for label in labels}
    missing = [(name, bucket) for name in HISTORY for bucket in BY_NAME[name].buckets
               if (name, bucket) not in drawn]
    assert not missing, missing_text({("serving_loop", "cpu"): missing},
                                     "8 derandomised runs of 20 steps")
