"""``c128a bisect`` and ``c128a history`` on a vLLM-like checkout the tests
build (:mod:`vllm_checkout`), and the search and the child processes they
stand on.

The checks run are few and small (``-k``, ``--max-examples``): each
revision is checked in a child forked from a server that imported torch
once, so a step costs about a second on the CPU.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from c128a import cli
from c128a.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from c128a.runners import revisions
from c128a.runners.bisection import BAD, GOOD, SKIP, Commit, Search
from c128a.runners.revisions import keyword_matcher, select_checks
from c128a.targets.vllm_release import CACHE_ENV, WIDTHS_ENV
from helpers import assert_all_ended, descendants, needs_proc, wait_until
from vllm_checkout import make_checkout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("bisect")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(root / "cache"))
        patch.delenv(WIDTHS_ENV, raising=False)
        yield root / "vllm", make_checkout(root / "vllm")


def c128a(capsys, *arguments) -> tuple[int, list[str], str]:
    capsys.readouterr()
    status = cli.main([str(a) for a in arguments])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err


def test_bisect_names_the_mutants_commit_skipping_what_cannot_be_judged(checkout, tmp_path,
                                                                        capsys, c128a_device):
    path, commits = checkout
    cases_dir = tmp_path / "cases"
    status, lines, err = c128a(
        capsys, "bisect", "--checkout", path, "--good", commits["reference"], "--bad",
        commits["still_bad"], "-k", "matches_oracle or width_policy", "--max-examples", 2,
        "--device", c128a_device.type, "--cases-dir", cases_dir, "--step-timeout", 120)
    assert status == EXIT_OK, (lines, err)
    text = "\n".join(lines)
    # width_policy holds at the bad revision: only matches_oracle is bisected.
    assert any(line.startswith("bad  ") and "fails matches_oracle [" in line for line in lines)
    steps = [line for line in lines if line.startswith("step ")]
    crash, = [s for s in steps if commits["crash"][:12] in s]
    assert "skipped: crashed: died of SIGSEGV" in crash
    signature, = [s for s in steps if commits["signature"][:12] in s]
    assert "skipped: does not load" in signature and "topk_buffer" in signature
    assert all("revision(s) left to test" in s for s in steps)
    assert f"first bad commit: {commits['mutant']} Count one more compressed entry per token" \
        in lines
    assert "check: matches_oracle; failing example (shrunk): T=" in text
    assert f"replayed at {commits['mutant'][:12]} (the first bad commit): fails" in text
    assert f"replayed at {commits['unrelated'][:12]} (its parent): passes" in text
    case, = cases_dir.glob("*.json")
    assert json.loads(case.read_text())["target"] == f"vllm-source:{path}@{commits['mutant']}"

    # The case replays: it fails at the first bad commit, passes at its parent.
    for label, expected in (("mutant", EXIT_FAILED), ("unrelated", EXIT_OK)):
        status, lines, err = c128a(capsys, "replay", case, "--device", c128a_device.type,
                                   "--target", f"vllm-source:{path}@{commits[label]}")
        assert status == expected, (label, lines, err)


def test_bisect_refuses_revisions_that_cannot_bound_the_search(checkout, tmp_path, capsys,
                                                               c128a_device):
    path, commits = checkout
    common = ["-k", "matches_oracle", "--max-examples", 1, "--device", c128a_device.type,
              "--cases-dir", tmp_path / "cases"]
    for good, bad, said in (
        ("mutant", "still_bad", "fails matches_oracle too: not a good revision"),
        ("reference", "revert", "passes matches_oracle: nothing to bisect"),
        ("reference", "signature", "cannot be judged: does not load"),
        ("still_bad", "mutant", "is not an ancestor of --bad"),
        ("reference", "no-such-branch", "has no such commit"),
    ):
        status, lines, err = c128a(capsys, "bisect", "--checkout", path, "--good",
                                   commits.get(good, good), "--bad", commits.get(bad, bad),
                                   *common)
        assert status == EXIT_USAGE, (good, bad, lines, err)
        assert said in err and len(err.strip().splitlines()) == 1, (good, bad, err)
    assert not list((tmp_path / "cases").glob("*.json"))
    for arguments, said in (
        (["bisect", "--checkout", tmp_path, "--good", "a", "--bad", "b"], "is not a git checkout"),
        (["history", "--checkout", path, commits["reference"], "nosuch"],
         "revision 'nosuch': "),
    ):
        status, lines, err = c128a(capsys, *arguments, "--device", c128a_device.type)
        assert status == EXIT_USAGE and said in err and not lines, (lines, err)


def test_a_hanging_step_is_killed_at_its_limit(checkout, c128a_device):
    path, commits = checkout
    result = revisions.check_revision(
        revisions.Request(str(path), commits["hangs"], ("matches_oracle",),
                          device=c128a_device.type, max_examples=1), time_limit=3)
    assert result.status == revisions.HUNG
    assert "ran past the step's limit of 3 s and was killed" in result.reason


def test_history_writes_one_row_per_revision(checkout, tmp_path, capsys, c128a_device):
    path, commits = checkout
    table = tmp_path / "history.md"
    labels = ["empty", "mutant", "signature", "fixed"]
    status, lines, err = c128a(
        capsys, "history", "--checkout", path, *(commits[label] for label in labels),
        "-k", "matches_oracle", "--max-examples", 1, "--device", c128a_device.type,
        "--output", table)
    assert status == EXIT_FAILED, (lines, err)
    assert lines[0].startswith("| revision | commit | subject | loads |")
    rows = dict(zip(labels, lines[2:]))
    assert len(lines) == 2 + len(labels) and table.read_text().splitlines() == lines
    assert "| no: does not load |" in rows["empty"] and "defines build_c128a" in rows["empty"]
    assert "| no: does not load |" in rows["signature"] and "topk_buffer" in rows["signature"]
    assert "| yes | adaptive | 0 | 1 | 0 | `matches_oracle` |" in rows["mutant"]
    assert "| yes | W = C only | 1 | 0 | 0 |  |" in rows["fixed"]


# ---------------------------------------------------------------- the search, and -k


def linear(count: int) -> Search:
    """c0 <- c1 <- ... <- c{count-1}, the last bad, c0's parent good."""
    shas = [f"c{i}" for i in range(count)]
    commits = {sha: Commit(sha, sha, (shas[i - 1],) if i else ("good",))
               for i, sha in enumerate(shas)}
    return Search(commits, list(reversed(shas)), shas[-1])


def run(search: Search, verdicts) -> list[str]:
    tested = []
    while not search.done and (sha := search.next()) is not None:
        tested.append(sha)
        search.mark(sha, verdicts(sha))
    return tested


def test_the_search_halves_and_goes_around_skipped_revisions():
    search = linear(16)
    first_bad = 11
    tested = run(search, lambda sha: BAD if int(sha[1:]) >= first_bad else GOOD)
    assert search.done and search.bad == f"c{first_bad}" and len(tested) <= 4
    # c3 and c4 cannot be judged, c4 broke it: the first bad commit is
    # c3, c4 or c5 (c2 good, c5 bad); all three are named.
    search = linear(8)
    run(search, lambda sha: SKIP if sha in ("c3", "c4") else BAD if int(sha[1:]) >= 4 else GOOD)
    assert not search.done
    assert [c.sha for c in search.could_be()] == ["c3", "c4", "c5"]


def test_the_search_counts_ancestry_across_a_merge():
    # base <- a1 <- a2 <- merge, base <- b1 <- merge; b1 broke it.
    commits = {
        "a1": Commit("a1", "a1", ("base",)), "a2": Commit("a2", "a2", ("a1",)),
        "b1": Commit("b1", "b1", ("base",)), "merge": Commit("merge", "merge", ("a2", "b1")),
    }
    search = Search(commits, ["merge", "a2", "a1", "b1"], "merge")
    run(search, lambda sha: BAD if sha in ("b1", "merge") else GOOD)
    assert search.done and search.bad == "b1"


@pytest.mark.parametrize("expression, chosen", [
    (None, None),
    ("views", ("views",)),
    ("oracle or VIEWS", ("matches_oracle", "views")),
    ("consumers and not replay", ("consumers",)),
    ("not (consumers or width or bad or geometries or history or keys or independent)", (
        "matches_oracle", "adaptive_equals_full", "views", "untouched_memory", "padding",
        "idempotent")),
])
def test_k_selects_checks_as_pytest_does(expression, chosen):
    from c128a.checks import PROPERTIES

    assert select_checks(expression) == (chosen or tuple(PROPERTIES))


@pytest.mark.parametrize("expression", ["views or", "(views", "and views", "nothing_matches"])
def test_a_bad_k_expression_is_a_usage_error(expression):
    with pytest.raises(UsageError, match="-k"):
        select_checks(expression)
    assert keyword_matcher("a")("A")


@needs_proc
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_a_signal_stops_the_command_and_its_step(checkout, cli_process, signum):
    """``c128a history`` checking a revision that hangs, given a long step
    limit: SIGINT (SIGTERM takes the same handler) ends it at once, with one
    line and 128 + the signal; SIGKILL ends it with no word. Either way the
    step's process, and the server it was forked from, end with it."""
    path, commits = checkout
    history = cli_process("history", "--checkout", path, commits["hangs"], "-k",
                          "matches_oracle", "--max-examples", 1, "--device", "cpu",
                          "--step-timeout", 600, env={CACHE_ENV: os.environ[CACHE_ENV]})
    wait_until(lambda: len(history.output()[0].splitlines()) >= 2, 60, "the table's header")
    # multiprocessing's resource tracker and fork server, and the step forked
    # from the server; the step hangs once it has loaded its target.
    started = wait_until(lambda: len(descendants(history.pid)) >= 3 and descendants(history.pid),
                         60, "a step running")
    time.sleep(1)
    os.kill(history.pid, signum)
    status = history.wait(30)
    err = history.errors().strip().splitlines()
    if signum == signal.SIGKILL:
        assert status == -signum and not err, (status, err)
    else:
        assert status == 128 + signum
        assert err == [f"c128a history: interrupted by {signal.Signals(signum).name}; the "
                       "revision being checked was stopped, nothing more runs"], err
    assert_all_ended(started, what="the step's processes after the command ended")


def test_a_check_that_cannot_judge_a_revision_skips_it():
    """The suite's own error, or a check that does not apply to a
    revision's target, says nothing of the revision: skipped, not good."""
    from c128a.runners.bisection import judged

    def result(*outcomes, status=revisions.CHECKED):
        return revisions.RevisionResult("c0", status, "why", outcomes=tuple(
            revisions.CheckOutcome(name, verdict, "said") for name, verdict in outcomes))

    assert judged(result(("views", revisions.PASSED)), ("views",))[0] == GOOD
    assert judged(result(("views", revisions.FAILED), ("keys", revisions.ERROR)), ())[0] == BAD
    for verdict in (revisions.ERROR, revisions.NOT_APPLICABLE):
        kind, words = judged(result(("views", revisions.PASSED), ("keys", verdict)), ())
        assert kind == SKIP and f"keys ({verdict}: said)" in words
    assert judged(result(status=revisions.HUNG), ()) == (SKIP, "skipped: hung: why")
