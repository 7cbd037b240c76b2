"""Issue 13 items 10 and 11: the documentation ships and keeps up with the code."""

from __future__ import annotations

import tomllib
from pathlib import Path

import click

from batch.cli import main
from batch.institutions_check import PROVIDER_KEYS, SECTIONS, TOP_LEVEL
from tests.cli.console import cli, ok

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "operator.md"


def _command_paths(group: click.Group, prefix: str = "") -> list[str]:
    out = []
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            out += _command_paths(cmd, f"{path} ")
        else:
            out.append(path)
    return out


def test_the_guide_names_every_command_and_every_institutions_key() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    missing = [p for p in _command_paths(main) if f"`{p}" not in text]
    assert missing == []
    keys = set(TOP_LEVEL) | set(PROVIDER_KEYS) | {k for ks in SECTIONS.values() for k in ks}
    assert [k for k in sorted(keys) if k not in text] == []
    assert [s for s in SECTIONS if f"[providers.{s}]" not in text] == []
    for heading in ("## Exit codes", "## What happens to a consent", "## Running under cron",
                    "## Going to PostgreSQL", "## Files"):
        assert heading in text


def test_readme_and_help_point_to_the_guide_not_to_files_that_are_not_shipped() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/operator.md" in readme
    assert "MYDATA.md" not in readme and "DESIGN.md" not in readme
    assert "docs/operator.md" in ok(cli("--help")).stdout


def test_the_license_is_apache_2_and_pyproject_says_so() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == {"text": "Apache-2.0"}


def test_ci_runs_the_demo_after_the_tests() -> None:
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.strip().startswith("#")]
    assert lines.index("make test") < lines.index("make demo")


def _all_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out += _all_paths(cmd, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


def test_no_help_cites_an_unshipped_file_or_a_missing_feature() -> None:
    """The test above reads the README and the root --help only; every command's help."""
    from click.testing import CliRunner

    found = []
    for path in _all_paths(main):
        text = CliRunner().invoke(main, [*path, "--help"]).output
        found += [(" ".join(path), w) for w in ("MYDATA.md", "DESIGN.md",
                                                  "Not available in this version")
                  if w in " ".join(text.split())]
    assert found == []
