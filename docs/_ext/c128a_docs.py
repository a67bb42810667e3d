"""Reference pages generated from the code, so that they cannot drift from it.

- ``{c128a-command} NAME``: the options of ``c128a NAME``, read off the
  parser its module configures (``c128a.cli.NAME.configure_parser``). Every
  subcommand in :data:`c128a.cli.SUBCOMMANDS` must have one somewhere in the
  docs: a new subcommand without its reference fails the build.
- ``{c128a-pytest-options}``: the options of the pytest plugin's ``c128a``
  group, recorded from the plugin's own ``pytest_addoption`` hooks (the entry
  point's module and the modules its ``pytest_plugins`` names).
- ``{c128a-markers}``: the markers the plugin registers, and those of the
  project's own ``pyproject.toml``.
- ``{c128a-profiles}``: the Hypothesis profiles the suite registers.
- A constant's value longer than a line or two is cut, as its repr can be
  the suite's data.
- A relative ``:mod:`.x``` role in a docstring names the module Python's
  relative import would, which is how the docstrings use it.
- The API reference: one page per package of ``c128a``, each module's
  docstring and members by autodoc, written before the build reads its
  sources (``reference/api/``, not kept in git), so that a module added or
  moved is documented where it now lives.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pkgutil
import re
import sys
import tomllib
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.util.docutils import SphinxDirective

PLUGIN_ENTRY_POINT = "c128a.plugin.pytest_plugin"
PLUGIN_GROUP = "c128a"
API_FOLDER = Path("reference") / "api"
# Modules autodoc must not import: ``python -m c128a.cli`` runs the command.
NOT_IMPORTED = ("__main__",)
USAGE_WIDTH = 88
# A constant's value longer than this is cut: some are the suite's data (the
# historical steps, the property table), megabytes of repr.
VALUE_CHARS = 160


# --------------------------------------------------------------- tables of plain docutils nodes


# Options and environment variables inside help text, shown as code (and
# kept from the typographer, which would make "--" a dash).
_CODE_IN_HELP = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*|\$[A-Z][A-Z0-9_]*)")


def _help_paragraph(text: str) -> nodes.paragraph:
    paragraph = nodes.paragraph()
    for index, part in enumerate(_CODE_IN_HELP.split(text)):
        if part:
            paragraph += nodes.literal(text=part) if index % 2 else nodes.Text(part)
    return paragraph


def _cell(content) -> nodes.entry:
    entry = nodes.entry()
    if isinstance(content, nodes.Node):
        entry += content
    else:
        entry += _help_paragraph(str(content))
    return entry


def _literal(text: str) -> nodes.paragraph:
    paragraph = nodes.paragraph()
    paragraph += nodes.literal(text=text)
    return paragraph


def _table(header: list[str], rows: list[list], widths: list[int]) -> nodes.table:
    table = nodes.table(classes=["c128a-generated"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    head += nodes.row("", *(_cell(title) for title in header))
    group += head
    body = nodes.tbody()
    for row in rows:
        body += nodes.row("", *(_cell(value) for value in row))
    group += body
    return table


# --------------------------------------------------------------------------- c128a subcommands


def _subcommands() -> dict[str, str]:
    from c128a.cli import SUBCOMMANDS

    return SUBCOMMANDS


def _subcommand_parser(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(f"c128a.cli.{name}")
    parser = argparse.ArgumentParser(
        prog=f"c128a {name}", description=_subcommands()[name],
        # A fixed width: the usage line must not follow the terminal the build runs in.
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=USAGE_WIDTH),
    )
    module.configure_parser(parser)
    return parser


def _help_text(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%(" in text:  # argparse's own placeholders, as --help expands them
        text = text % {**vars(action), "prog": parser.prog}
    return text


def _option_name(action: argparse.Action) -> str:
    if not action.option_strings:
        return (action.metavar or action.dest) + (" ..." if action.nargs in ("+", "*") else "")
    if action.nargs == 0:
        value = ""
    elif action.metavar is None and action.choices is not None:
        value = " {" + ",".join(map(str, action.choices)) + "}"  # as argparse shows it
    else:
        value = f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"{name}{value}" for name in action.option_strings)


class CommandDirective(SphinxDirective):
    """The usage line and the options of one ``c128a`` subcommand."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        if name not in _subcommands():
            raise self.error(f"c128a has no subcommand {name!r}; it has: "
                             f"{', '.join(_subcommands())}")
        documented = self.env.domaindata.setdefault("c128a", {}).setdefault("commands", {})
        documented[name] = self.env.docname
        parser = _subcommand_parser(name)
        usage = parser.format_usage().strip()
        rows = [
            [_literal(_option_name(action)), _help_text(action, parser)]
            for action in parser._actions
            if not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS
        ]
        block = nodes.literal_block(text=usage, language="text")
        return [block, _table(["option", "what it does"], rows, [30, 70])]


def _check_every_command_documented(app, env) -> None:
    documented = env.domaindata.get("c128a", {}).get("commands", {})
    missing = [name for name in _subcommands() if name not in documented]
    if missing:
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            "c128a subcommand(s) %s have no reference: add a ```{c128a-command} NAME``` "
            "block to docs/reference/cli.md", ", ".join(missing),
        )


def _merge_commands(app, env, docnames, other) -> None:
    ours = env.domaindata.setdefault("c128a", {}).setdefault("commands", {})
    ours.update(other.domaindata.get("c128a", {}).get("commands", {}))


def _purge_commands(app, env, docname) -> None:
    commands = env.domaindata.get("c128a", {}).get("commands", {})
    for name in [n for n, page in commands.items() if page == docname]:
        del commands[name]


# ------------------------------------------------------------------------ the pytest plugin


class _OptionRecorder:
    """Stands for pytest's parser and its option group in a plugin's
    ``pytest_addoption(parser)``: records what the hook adds."""

    def __init__(self):
        self.options: list[tuple[tuple[str, ...], dict]] = []

    def getgroup(self, name: str, description: str = "") -> _OptionRecorder:
        if name != PLUGIN_GROUP:
            raise ValueError(f"the plugin adds options to group {name!r}, not {PLUGIN_GROUP!r}")
        return self

    def addoption(self, *names: str, **settings) -> None:
        self.options.append((names, settings))

    def addini(self, *args, **kwargs) -> None:
        pass


def _plugin_modules(name: str = PLUGIN_ENTRY_POINT, seen=None) -> list:
    """The entry point's module and those its ``pytest_plugins`` names, in
    the order pytest registers them."""
    seen = [] if seen is None else seen
    module = importlib.import_module(name)
    if module in seen:
        return seen
    seen.append(module)
    for other in getattr(module, "pytest_plugins", ()):
        _plugin_modules(other, seen)
    return seen


class PytestOptionsDirective(SphinxDirective):
    """Every option of the plugin's ``c128a`` group."""

    def run(self) -> list[nodes.Node]:
        recorder = _OptionRecorder()
        for module in _plugin_modules():
            hook = getattr(module, "pytest_addoption", None)
            if hook is not None:
                hook(recorder)
        rows = []
        for names, settings in recorder.options:
            flag = settings.get("action") in ("store_true", "store_false")
            value = "" if flag else f"={settings.get('metavar') or settings.get('dest', '').upper()}"
            if settings.get("choices") and not settings.get("metavar"):
                value = "={" + ",".join(settings["choices"]) + "}"  # as argparse shows it
            text = settings.get("help", "")
            if settings.get("action") == "append":
                text += " (repeatable)" if "repeatable" not in text else ""
            rows.append([_literal(", ".join(f"{n}{value}" for n in names)), text])
        return [_table(["option", "what it does"], rows, [30, 70])]


# ------------------------------------------------------------------------ Hypothesis profiles


class ProfilesDirective(SphinxDirective):
    """The Hypothesis profiles the suite registers, read off their settings."""

    def run(self) -> list[nodes.Node]:
        from hypothesis import settings

        from c128a.checks import profiles

        profiles.register_profiles()
        rows = []
        for name in profiles.PROFILES:
            chosen = settings.get_profile(name)
            phases = ", ".join(phase.name for phase in chosen.phases)
            rows.append([
                _literal(name), f"{chosen.max_examples:,}",
                "yes" if chosen.derandomize else "no",
                "none" if chosen.database is None else "the example database",
                "none" if chosen.deadline is None else str(chosen.deadline), phases,
            ])
        return [_table(["profile", "examples", "derandomised", "database", "deadline",
                        "phases"], rows, [10, 12, 14, 20, 10, 34])]


# -------------------------------------------------------------------------------- markers


def _registered_markers() -> list[tuple[str, str, str]]:
    """(marker, what it marks, who registers it)."""
    from c128a.plugin.conformance_options import CONFORMANCE_MARKER
    from c128a.plugin.pytest_plugin import MARKERS

    found = [(line, "the plugin") for line in (*MARKERS, CONFORMANCE_MARKER)]
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    with pyproject.open("rb") as handle:
        ini = tomllib.load(handle)["tool"]["pytest"]["ini_options"]
    found += [(line, "this repository's pyproject.toml") for line in ini.get("markers", ())]
    markers = []
    for line, source in found:
        name, _, text = line.partition(":")
        markers.append((name.strip(), text.strip(), source))
    return markers


class MarkersDirective(SphinxDirective):
    """Every marker the plugin registers, with its registered description."""

    def run(self) -> list[nodes.Node]:
        rows = [[_literal(name), text, source] for name, text, source in _registered_markers()]
        return [_table(["marker", "what it marks", "registered by"], rows, [20, 65, 15])]


# ---------------------------------------------------------------------------- API reference


def _packages() -> dict[str, list[str]]:
    """Every package of c128a and the modules directly in it."""
    import c128a

    packages: dict[str, list[str]] = {"c128a": []}
    for info in pkgutil.walk_packages(c128a.__path__, "c128a."):
        parent, _, leaf = info.name.rpartition(".")
        if leaf in NOT_IMPORTED:
            continue
        if info.ispkg:
            packages.setdefault(info.name, [])
        else:
            packages.setdefault(parent, []).append(info.name)
    return packages


def _api_page(package: str, modules: list[str]) -> str:
    title = f"``{package}``"
    lines = [title, "=" * len(title), "", f".. automodule:: {package}", "   :members:",
             "   :ignore-module-all:", ""]
    for module in modules:
        heading = f"``{module}``"
        lines += [heading, "-" * len(heading), "", f".. automodule:: {module}", "   :members:",
                  "   :ignore-module-all:", ""]
    return "\n".join(lines)


def write_api_pages(app) -> None:
    """One page per package; a page whose text is unchanged is not
    rewritten (Sphinx then keeps its cached build)."""
    folder = Path(app.srcdir) / API_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    pages = {f"{package}.rst": _api_page(package, modules)
             for package, modules in sorted(_packages().items())}
    for stale in folder.glob("*.rst"):
        if stale.name not in pages:
            stale.unlink()
    for name, text in pages.items():
        path = folder / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


# ------------------------------------------------- relative module roles, as Python reads them

_RELATIVE_MODULE_ROLE = re.compile(r":mod:`(\.[A-Za-z_][A-Za-z0-9_.]*)`")


def _package_of(name: str) -> str | None:
    """The package relative imports start from in the module holding ``name``."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None:
            return module.__package__
    return None


def resolve_relative_module_roles(app, what, name, obj, options, lines) -> None:
    """``:mod:`.reach``` in a docstring of ``c128a.strategies.engine`` names
    ``c128a.strategies.reach``, as ``from .reach import ...`` there would:
    the docstrings' convention. Sphinx reads a leading dot as "any module
    ending in .reach", which is ambiguous where several packages have one;
    the role is given its full target, its text left as written."""
    package = _package_of(name)
    if not package:
        return

    def full(match: re.Match) -> str:
        relative = match.group(1)
        target = importlib.util.resolve_name(relative, package)
        if target not in sys.modules and importlib.util.find_spec(target) is None:
            return match.group(0)  # not a module there: left to Sphinx's own search
        return f":mod:`{relative} <{target}>`"

    lines[:] = [_RELATIVE_MODULE_ROLE.sub(full, line) for line in lines]


# ------------------------------------------------------------------- long values of constants


def shorten_long_values(app, doctree) -> None:
    """Cut the ``= value`` autodoc shows for a module constant or attribute
    to :data:`VALUE_CHARS` characters."""
    for annotation in doctree.findall(addnodes.desc_annotation):
        if not any(isinstance(child, addnodes.desc_sig_punctuation) and child.astext() == "="
                   for child in annotation.children):
            continue
        for text in list(annotation.findall(nodes.Text)):
            if len(text) > VALUE_CHARS:
                text.parent.replace(text, nodes.Text(text[:VALUE_CHARS] + " ..."))


def setup(app):
    app.add_directive("c128a-command", CommandDirective)
    app.add_directive("c128a-pytest-options", PytestOptionsDirective)
    app.add_directive("c128a-markers", MarkersDirective)
    app.add_directive("c128a-profiles", ProfilesDirective)
    app.connect("builder-inited", write_api_pages)
    app.connect("autodoc-process-docstring", resolve_relative_module_roles)
    app.connect("doctree-read", shorten_long_values)
    app.connect("env-check-consistency", _check_every_command_documented)
    app.connect("env-merge-info", _merge_commands)
    app.connect("env-purge-doc", _purge_commands)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True,
            "env_version": 1}
