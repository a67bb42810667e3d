"""The documentation in docs/ against the README it was written from.

The kill matrix and the reach tables are generated into the README
(``c128a mutants --update-readme``, ``c128a reach --update-readme``), and
``tests/test_reach.py`` checks the README's reach tables against the
strategies. The reference pages in docs/ hold the same tables between the
same markers: they must hold the README's text exactly, so that a
regenerated table cannot leave a stale copy there. The docs build itself
(Sphinx, warnings as errors) runs in ``.ci/run``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from c128a.runners import killmatrix, reach

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

GENERATED_TABLES = [
    pytest.param(killmatrix.README_START, killmatrix.README_END,
                 DOCS / "reference" / "kill-matrix.md", id="kill-matrix"),
    pytest.param(reach.README_START, reach.README_END,
                 DOCS / "reference" / "reach-tables.md", id="reach"),
    pytest.param(reach.README_PAIRS_START, reach.README_PAIRS_END,
                 DOCS / "reference" / "reach-tables.md", id="reach-pairs"),
]


def shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


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
def test_the_docs_hold_the_generated_table_the_readme_holds(start, end, page):
    assert marked(page, start, end) == marked(README, start, end), (
        f"{shown(page)}'s table between {start} and {end} differs from README.md's: "
        "copy the README's table there (the commands write the README)"
    )


def test_a_table_that_differs_from_the_readmes_is_found(tmp_path):
    start, end = reach.README_START, reach.README_END
    stale = tmp_path / "reach-tables.md"
    stale.write_text(f"# Reach\n\n{start}\n| an old table |\n{end}\n", encoding="utf-8")
    assert marked(stale, start, end) != marked(README, start, end)


def test_a_page_missing_its_markers_is_named(tmp_path):
    page = tmp_path / "kill-matrix.md"
    page.write_text("# Kill matrix\n\nno markers\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="holds <!-- kill-matrix:start --> 0 time"):
        marked(page, killmatrix.README_START, killmatrix.README_END)
