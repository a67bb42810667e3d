"""A compatibility table: the property suite at each of a checkout's revisions.

``c128a history --checkout PATH REV...`` checks each revision in a child
process (:mod:`c128a.runners.revisions`) and writes one row per revision:
whether its target loads, the widths its checks drew W from, how many
checks passed, failed or do not apply, and the failing checks (as
"Findings in released vLLM", docs/explanation/compile-keys.md, does for
wheels).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..targets.vllm_source import git
from . import revisions
from .bisection import commit_of


@dataclass(frozen=True)
class Row:
    revision: str
    commit: str
    subject: str
    result: revisions.RevisionResult

    @property
    def clean(self) -> bool:
        return (self.result.status == revisions.CHECKED
                and not self.result.failed and not self.result.named(revisions.ERROR))


HEADER = ("| revision | commit | subject | loads | widths | passed | failed | not applicable "
          "| failing checks |")
RULE = "|---|---|---|---|---|---|---|---|---|"


def resolved(checkout, refs: list[str]) -> list[tuple[str, str]]:
    """(revision, its full hash) of each of ``refs``: a usage error naming
    the first the checkout lacks, before anything runs."""
    return [(ref, commit_of(checkout, ref, "revision")) for ref in refs]


def history(checkout, revisions_: list[tuple[str, str]], checks: tuple[str, ...], *,
            device: str, max_examples: int, time_limit: float, say) -> list[Row]:
    """A row for each (revision, commit) of ``revisions_`` (:func:`resolved`),
    each checked in its own child; ``say`` gets each row's line as it is made."""
    rows = []
    for ref, commit in revisions_:
        subject = git(checkout, "log", "-1", "--format=%s", commit,
                      spec="log").stdout.decode("utf-8", "replace").strip()
        result = revisions.check_revision(
            revisions.Request(str(checkout), commit, checks, device=device,
                              max_examples=max_examples, stop_at_first_failure=False),
            time_limit)
        rows.append(Row(ref, commit, subject, result))
        say(markdown_row(rows[-1]))
    return rows


def markdown_row(row: Row) -> str:
    result = row.result
    subject = row.subject.replace("|", "\\|")
    if result.status != revisions.CHECKED:
        reason = " ".join(result.reason.split()).replace("|", "\\|")
        return (f"| `{row.revision}` | `{row.commit[:12]}` | {subject} | no: {result.status} "
                f"| | | | | {reason} |")
    errors = result.named(revisions.ERROR)
    failing = ", ".join(f"`{name}`" for name in result.failed)
    if errors:
        failing += (", " if failing else "") + "errors: " + ", ".join(f"`{n}`" for n in errors)
    widths = "W = C only" if result.widths.startswith("W = C only") else "adaptive"
    return (f"| `{row.revision}` | `{row.commit[:12]}` | {subject} | yes | {widths} "
            f"| {len(result.named(revisions.PASSED))} | {len(result.failed)} "
            f"| {len(result.named(revisions.NOT_APPLICABLE))} | {failing} |")


def markdown_table(rows: list[Row]) -> str:
    return "\n".join([HEADER, RULE, *(markdown_row(row) for row in rows)])
