"""Every `planner ...` command the README and docs/ show in a code block names options the CLI has.

A renamed or dropped option leaves the docs telling users to type a command that fails; this reads each
one (continuation lines joined, comments cut) and parses it with --help appended, which checks every
option's name and arity without running anything.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shown_commands(text: str) -> list[str]:
    """The `planner` command lines of the text's code blocks (a shell pipe aside: that is prose)."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split("  #")[0].split(" # ")[0].strip().removeprefix("$ ")
            if line.startswith("planner ") and "|" not in line:
                commands.append(line)
    return commands


COMMANDS = [(path.relative_to(ROOT).as_posix(), command) for path in DOCUMENTS
            for command in shown_commands(path.read_text())]


def test_the_documents_show_commands():
    assert len(COMMANDS) >= 40 and {doc for doc, _ in COMMANDS} >= {"README.md", "docs/fleets.md"}


def test_a_command_with_an_option_the_cli_lacks_is_caught():
    result = CliRunner().invoke(app, ["simulate", "--no-such-option", "1", "--help"])
    assert result.exit_code == 2


@pytest.mark.parametrize("document,command", COMMANDS, ids=[f"{doc}:{i}" for i, (doc, _) in enumerate(COMMANDS)])
def test_a_documented_command_parses(document, command):
    result = CliRunner().invoke(app, [*shlex.split(command)[1:], "--help"])
    assert result.exit_code == 0, f"{document}: {command}\n{result.output[-600:]}"
