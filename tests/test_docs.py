"""The generated tables in docs/: each in exactly one page, each its generator's.

The kill matrix and the reach tables are generated into the reference pages
(``c128a mutants --update-docs docs/reference/kill-matrix.md``, ``c128a
reach --update-docs docs/reference/reach-tables.md``), between markers. A
table's markers held by two pages would leave one copy stale after a
regeneration, and by none would leave the command nowhere to write: each is
in exactly one page, the one the commands and tests name.
``tests/test_reach.py`` checks the reach tables' text against the
strategies; the kill matrix takes minutes to run, so here its rows and
columns are checked against the mutants and properties registered now,
which is what goes stale when a mutant or property is added. The docs build
itself (Sphinx, warnings as errors) runs in ``.ci/run``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from c128a.checks import PROPERTIES
from c128a.runners import killmatrix, reach

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
KILL_MATRIX_PAGE = DOCS / "reference" / "kill-matrix.md"
REACH_PAGE = DOCS / "reference" / "reach-tables.md"

GENERATED_TABLES = [
    pytest.param(killmatrix.README_START, killmatrix.README_END, KILL_MATRIX_PAGE,
                 id="kill-matrix"),
    pytest.param(reach.README_START, reach.README_END, REACH_PAGE, id="reach"),
    pytest.param(reach.README_PAIRS_START, reach.README_PAIRS_END, REACH_PAGE,
                 id="reach-pairs"),
]


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def doc_pages(root: Path = DOCS) -> list[Path]:
    """The docs' Markdown sources (not the build's copies)."""
    return sorted(p for p in root.rglob("*.md") if "_build" not in p.relative_to(root).parts)


def pages_holding(marker: str, root: Path = DOCS) -> list[Path]:
    return [p for p in doc_pages(root) if marker in p.read_text(encoding="utf-8")]


def marked(path: Path, start: str, end: str) -> str:
    """The text between ``start`` and ``end`` in ``path``, which must hold
    each marker exactly once."""
    text = path.read_text(encoding="utf-8")
    counts = (text.count(start), text.count(end))
    assert counts == (1, 1), (
        f"{shown(path)} holds {start} {counts[0]} time(s) and {end} {counts[1]} "
        "time(s); it must hold each once"
    )
    return re.search(re.escape(start) + r"\n(.*)\n" + re.escape(end), text, re.DOTALL).group(1)


@pytest.mark.parametrize("start, end, page", GENERATED_TABLES)
def test_each_generated_table_is_in_exactly_one_docs_page(start, end, page):
    for marker in (start, end):
        holding = [shown(p) for p in pages_holding(marker)]
        assert holding == [shown(page)], (
            f"{marker} is in {holding or 'no page'}; it must be in {shown(page)} alone, "
            "where the command that generates the table writes it"
        )
    marked(page, start, end)
    assert start not in (ROOT / "README.md").read_text(encoding="utf-8"), (
        f"README.md holds {start}: the table lives in {shown(page)} alone"
    )


def test_a_marker_in_a_second_page_is_found(tmp_path):
    for name in ("kill-matrix.md", "copy.md"):
        (tmp_path / name).write_text(
            f"{killmatrix.README_START}\n| a table |\n{killmatrix.README_END}\n", encoding="utf-8"
        )
    (tmp_path / "_build").mkdir()
    (tmp_path / "_build" / "built.md").write_text(killmatrix.README_START, encoding="utf-8")
    assert [p.name for p in pages_holding(killmatrix.README_START, tmp_path)] == [
        "copy.md", "kill-matrix.md"
    ]


class _Unrun:
    """A cell of a matrix that was not run: its rows and columns are what
    is compared."""

    def cell(self) -> str:
        return "?"


def _rows_and_columns(table: str) -> list[str]:
    """Each line of a kill matrix up to its property cells: the header, the
    rule, and each row's target and bug class."""
    lines = table.splitlines()
    return lines[:2] + [" | ".join(line.split(" | ")[:2]) for line in lines[2:]]


def generated_rows_and_columns() -> list[str]:
    """What ``c128a mutants --update-docs`` writes, less the outcomes: the
    correct targets, then every registered mutant, by every property."""
    expect_pass = killmatrix.DEFAULT_EXPECT_PASS
    specs = list(expect_pass) + killmatrix.default_mutant_specs()
    matrix = {spec: {name: _Unrun() for name in PROPERTIES} for spec in specs}
    return _rows_and_columns(killmatrix.markdown_table(matrix, expect_pass))


def test_the_kill_matrix_has_a_row_for_each_mutant_and_a_column_for_each_property():
    page = _rows_and_columns(marked(KILL_MATRIX_PAGE, killmatrix.README_START,
                                    killmatrix.README_END))
    generated = generated_rows_and_columns()
    assert page == generated, (
        f"{shown(KILL_MATRIX_PAGE)}'s kill matrix is stale (rows missing: "
        f"{sorted(set(generated) - set(page))}; rows no longer registered: "
        f"{sorted(set(page) - set(generated))}): run c128a mutants --markdown "
        f"--update-docs {shown(KILL_MATRIX_PAGE)}"
    )


def test_a_kill_matrix_missing_a_mutant_is_found():
    generated = generated_rows_and_columns()
    stale = "\n".join(generated[:-1])
    assert _rows_and_columns(stale) != generated


def test_a_page_missing_its_markers_is_named(tmp_path):
    page = tmp_path / "kill-matrix.md"
    page.write_text("# Kill matrix\n\nno markers\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="holds <!-- kill-matrix:start --> 0 time"):
        marked(page, killmatrix.README_START, killmatrix.README_END)
