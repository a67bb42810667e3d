"""Sphinx configuration of c128a's documentation.

Build it, warnings as errors, as CI does:
``python -m sphinx -W --keep-going -b html docs docs/_build/html``
(``pip install -e '.[docs]'`` first).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

# Kernels are decorated when their modules are imported: autodoc imports
# them under Triton's interpreter, as the CPU runs them, on any machine.
from c128a.targets import use_device  # noqa: E402

use_device("cpu")

import c128a  # noqa: E402

project = "c128a"
author = "the c128a authors"
copyright = "the c128a authors"
release = version = c128a.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "c128a_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]

myst_enable_extensions = ["deflist"]
# Links to a section of another page ([text](page.md#section)) resolve.
myst_heading_anchors = 3

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "description"
autodoc_typehints_format = "short"

# A code block without a language is plain text (output, messages), not Python.
highlight_language = "text"

html_theme = "furo"
html_title = f"c128a {release}"
html_static_path: list[str] = []
