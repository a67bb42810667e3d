"""The checks of a target, shipped with the package.

From any folder, after ``pip install c128a``::

    pytest --pyargs c128a.conformance --c128a-target=SPEC -n auto

Every test module here judges the selected target (``--c128a-target``) and
nothing else; the suite's own machinery is tested in the repository's
``tests/``. Every such test carries the marker ``conformance(NAME)``: NAME is
the property or the regression case it checks, the name a known-failures
file gives it (``--c128a-known-failures``). The regression cases kept with
the package (``regressions/``) run by default; ``--c128a-cases DIR`` adds a
folder of one's own.

Importing this package imports nothing heavy: the pytest plugin reads the
names and folders below while it configures.
"""

from __future__ import annotations

from pathlib import Path

KEPT_CASES = Path(__file__).parent / "regressions"
"""The cases kept in the repository, shipped as package data."""

CHECKS_BESIDE_PROPERTIES = (
    "persistent_buffers", "replay", "serving_loop", "no_recompiles", "engine_warm_up",
)
"""Checks of this package with no entry in :data:`c128a.checks.PROPERTIES`:
steps into one set of buffers, the CUDA-graph replay scenarios, the serving
loop's state machine, the recompile sweep, and no compile after the engine's
own warm-up (the sanitizer's are named by
:data:`c128a.gpu.compute_sanitizer.PROPERTIES`)."""


def check_names() -> tuple[str, ...]:
    """Every name a ``conformance`` marker may carry, cases aside."""
    from c128a.checks import PROPERTIES
    from c128a.gpu.compute_sanitizer import PROPERTIES as SANITIZER_PROPERTIES

    return (*PROPERTIES, *CHECKS_BESIDE_PROPERTIES, *SANITIZER_PROPERTIES)


def case_folders(added: list[str], base: Path) -> list[tuple[str, Path]]:
    """(label, folder) of the kept cases and of each folder ``added`` names
    (relative to ``base``, the folder pytest was started in), in that order,
    each once."""
    folders = [("", KEPT_CASES)]
    for name in added:
        path = (base / name).resolve()
        if all(path != known for _, known in folders):
            folders.append((name, path))
    return folders


def case_files(folders: list[tuple[str, Path]]) -> list[tuple[str, Path]]:
    """(test id, file) of every case in ``folders``: a kept case's id is its
    file name, an added one's its folder as given, a slash and the name."""
    from c128a.cases import case_files as files_in

    return [
        (f"{label}/{path.name}" if label else path.name, path)
        for label, folder in folders
        for path in files_in(folder)
    ]
