"""The options the CLI and the pytest plugin share read the same everywhere
(c128a/options.py), and the fuzz defaults have one home."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from c128a import checked, cli, options
from c128a.cli import replay as replay_cli
from c128a.cli import fuzz as fuzz_cli
from c128a.cli import sanitize as sanitize_cli
from c128a.failures import UsageError
from c128a.runners.fuzz import FuzzConfig, FuzzOptions
from c128a.runners.fuzz import config as fuzz_config
from c128a.targets import import_object

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

SUBCOMMANDS = ("fuzz", "bench", "sanitize", "replay")
WIDE = "500"  # columns: no help entry wraps, so none breaks inside a word


def help_entries(text: str) -> dict[str, str]:
    """``--help`` output to {flag: its entry, whitespace collapsed}: the line
    naming the flag (with its metavar or choices) and the help under it."""
    entries: dict[str, list[str]] = {}
    flag = None
    for line in text.splitlines():
        match = re.match(r"  (-\S+?)(?:[ =,]|$)", line)
        if match:
            flag = match.group(1)
            entries[flag] = [line]
        elif flag is not None and line.startswith("    "):
            entries[flag].append(line)
        else:
            flag = None
    return {flag: " ".join(" ".join(lines).split()) for flag, lines in entries.items()}


def expected_entry(option: options.Option, flag: str, separator: str) -> str:
    shown = "{" + ",".join(option.choices) + "}" if option.choices else option.metavar
    return " ".join(f"{flag}{separator}{shown} {option.help_text}".split())


def drift(option: options.Option, entries: dict[str, str], flag: str, separator: str):
    """None when the front end shows ``option`` as the table defines it, else what it shows."""
    shown = entries.get(flag)
    return None if shown == expected_entry(option, flag, separator) else shown


def cli_help(subcommand: str, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", WIDE)
    with pytest.raises(SystemExit) as exit_info:
        cli.main([subcommand, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_every_subcommand_shows_the_shared_options_alike(capsys, monkeypatch):
    shown = {name: help_entries(cli_help(name, capsys, monkeypatch)) for name in SUBCOMMANDS}
    for option in options.SHARED_OPTIONS:
        having = [name for name in SUBCOMMANDS if option.cli in shown[name]]
        assert having, f"no subcommand has {option.cli}"
        for name in having:
            assert drift(option, shown[name], option.cli, " ") is None, (name, option.cli)
    # Where each shared option is expected, so that one dropped is noticed too.
    assert {n for n in SUBCOMMANDS if "--target" in shown[n]} == set(SUBCOMMANDS)
    assert {n for n in SUBCOMMANDS if "--device" in shown[n]} == {"fuzz", "bench", "replay"}
    assert {n for n in SUBCOMMANDS if "--cases-dir" in shown[n]} == {"fuzz", "sanitize"}
    assert {n for n in SUBCOMMANDS if "--properties" in shown[n]} == {"fuzz", "replay"}


@pytest.mark.slow
def test_pytest_help_shows_the_shared_options_as_the_cli(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", WIDE)
    result = pytester.runpytest_subprocess("--help")
    assert result.ret == 0
    entries = help_entries(result.stdout.str())
    pytest_options = [o for o in options.SHARED_OPTIONS if o.pytest]
    assert {o.dest for o in pytest_options} == {"target", "padding_rows", "device"}
    for option in pytest_options:
        assert drift(option, entries, option.pytest, "=") is None, option.pytest


def test_a_drifted_help_text_is_caught(monkeypatch):
    """The comparison above is not vacuous: a front end that writes its own
    help for a shared option, or other choices, fails it."""
    parser = argparse.ArgumentParser(prog="drifted")
    parser.add_argument("--target", metavar="SPEC", help="the target (default triton)")
    parser.add_argument("--device", choices=("cuda", "cpu", "mps"),
                        help=options.DEVICE_OPTION.help_text)
    options.add_to_argparse(parser, options.PADDING_ROWS_OPTION)
    monkeypatch.setenv("COLUMNS", WIDE)
    entries = help_entries(parser.format_help())
    assert drift(options.TARGET_OPTION, entries, "--target", " ") is not None
    assert drift(options.DEVICE_OPTION, entries, "--device", " ") is not None
    assert drift(options.PADDING_ROWS_OPTION, entries, "--padding-rows", " ") is None


def test_fuzz_defaults_come_from_one_place(capsys, monkeypatch):
    config = FuzzConfig()
    assert (config.db, config.cases_dir, config.properties, config.machine) == (
        options.DEFAULT_DB, options.DEFAULT_CASES_DIR, options.DEFAULT_PROPERTIES,
        options.DEFAULT_MACHINE,
    )
    assert (config.target, config.example_timeout, config.profile, config.chunk) == (
        options.DEFAULT_TARGET, options.DEFAULT_EXAMPLE_TIMEOUT_S, options.DEFAULT_FUZZ_PROFILE,
        options.DEFAULT_CHUNK,
    )
    # The modules that use them name the same objects, not copies.
    for module, names in ((checked, ("DEFAULT_PROPERTIES", "DEFAULT_MACHINE")),
                          (fuzz_config, ("DEFAULT_CASES_DIR", "DEFAULT_PROPERTIES",
                                         "DEFAULT_MACHINE"))):
        for name in names:
            assert getattr(module, name) is getattr(options, name), (module.__name__, name)
    assert fuzz_config.DEFAULT_DB is options.DEFAULT_DB
    assert fuzz_config.DEFAULT_MINUTES is options.DEFAULT_MINUTES
    # The commands that take them default to them, and their help says so.
    parser = argparse.ArgumentParser()
    replay_cli.configure_parser(parser)
    args = parser.parse_args(["case.json"])
    assert (args.properties, args.machine) == (options.DEFAULT_PROPERTIES, options.DEFAULT_MACHINE)
    parser = argparse.ArgumentParser()
    sanitize_cli.configure_parser(parser)
    assert parser.parse_args([]).cases_dir == options.DEFAULT_CASES_DIR
    fuzz_help = " ".join(cli_help("fuzz", capsys, monkeypatch).split())
    for text in (f"(default {options.DEFAULT_DB};", f"without --max-examples is "
                 f"{options.DEFAULT_MINUTES:g}", f"(default {options.DEFAULT_EXAMPLE_TIMEOUT_S:g})",
                 f"(default {options.DEFAULT_FUZZ_PROFILE})", f"(default {options.DEFAULT_CHUNK})",
                 f"default: {options.DEFAULT_CASES_DIR}"):
        assert text in fuzz_help


OWN_PROPERTIES = {}


def test_the_default_properties_and_machine_resolve_in_one_place():
    """The defaults are imported plainly (the layer check sees them) and are
    the very objects their ``MODULE:ATTR`` names; any other name is a
    user's, imported by name, and a bad one is a usage error naming the option."""
    defaults = checked.load_properties(), checked.load_machine()
    assert defaults == (import_object(options.DEFAULT_PROPERTIES),
                        import_object(options.DEFAULT_MACHINE))
    assert checked.load_properties(options.DEFAULT_PROPERTIES) is defaults[0]
    assert checked.load_machine(options.DEFAULT_MACHINE) is defaults[1]
    assert checked.load_properties(f"{__name__}:OWN_PROPERTIES") is OWN_PROPERTIES
    with pytest.raises(UsageError, match="--machine 'no_such_module:machine'"):
        checked.load_machine("no_such_module:machine")


def test_each_fuzz_option_is_declared_once_on_its_field():
    """``c128a fuzz`` has an option for each field of FuzzOptions (the
    ``--config`` file's keys) and no other, each from the field's own
    declaration (or the shared one it names)."""
    parser = argparse.ArgumentParser()
    fuzz_cli.configure_parser(parser)
    named = {spec.name for spec in dataclasses.fields(FuzzOptions)}
    assert set(vars(parser.parse_args([]))) - {"config"} == named
    target_arguments = {"target", "padding_rows", "device"}
    for spec in dataclasses.fields(FuzzOptions):
        declared = [key for key in ("fuzz", "shared") if key in spec.metadata]
        assert len(declared) == (0 if spec.name in target_arguments else 1), spec.name
