"""The mutants known to survive, each named with why: a checked-in file.

One mutant a line, by id, a kind and the reason::

    # _slot_ids:89 [comparison] block_shift >= 0 -> block_shift > 0
    adaptive-029d1327 equivalent: B = 1 shifts by 0 and masks with 0, as the division does

- ``equivalent``: no input the contract allows tells the mutant from the
  kernel (or it differs only outside the contract). Left out of the score.
- ``survives``: a real fault this run cannot reach (say why, and what would).
  It stays in the score as a survivor; listing it keeps the run green.

Both are strict, as pytest's ``xfail_strict`` and a known-failures file
are: a listed mutant that is killed, or that the kernels no longer have,
fails the run, so the file cannot go stale silently. Blank lines and lines
starting with ``#`` are comments; ``c128a mutate --list`` prints every
mutant's id and what it changes, for the comment above an entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ...failures import UsageError

EQUIVALENT, SURVIVES = "equivalent", "survives"
KNOWN_KINDS = (EQUIVALENT, SURVIVES)
DEFAULT_KNOWN = Path(__file__).parent / "known_mutants.txt"
"""The project kernels' list, kept with the package."""

_LINE = re.compile(r"^(?P<id>[A-Za-z0-9_.]+-[0-9a-f]{8})\s+(?P<kind>\w+)\s*:\s*(?P<reason>.*)$")


@dataclass(frozen=True)
class KnownMutant:
    id: str
    kind: str
    reason: str
    line: int


def read_known(path: Path) -> dict[str, KnownMutant]:
    """{id: entry} of the file at ``path``; a malformed line, an unknown kind,
    an entry without a reason or an id listed twice is a
    :class:`~c128a.failures.UsageError` naming the file and line."""
    if not path.is_file():
        raise UsageError(f"--known {path}: no such file; name the list of known mutants")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--known {path}: cannot read: {exc}") from None
    known: dict[str, KnownMutant] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        match = _LINE.match(line)
        if match is None or not match["reason"].strip():
            raise UsageError(
                f"{where}: {line!r} is not 'ID KIND: reason' (a mutant id such as "
                f"adaptive-1a2b3c4d, one of {', '.join(KNOWN_KINDS)}, a colon and why)"
            )
        if match["kind"] not in KNOWN_KINDS:
            raise UsageError(
                f"{where}: kind={match['kind']!r} is not one of {', '.join(KNOWN_KINDS)}"
            )
        if match["id"] in known:
            raise UsageError(
                f"{where}: {match['id']} is listed already on line {known[match['id']].line}"
            )
        known[match["id"]] = KnownMutant(match["id"], match["kind"], match["reason"].strip(),
                                         number)
    return known
