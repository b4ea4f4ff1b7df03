"""Versions that mean something (CHANGELOG.md's "Versions" rule).

dsh's version is the changelog's last release while that release is cut, and on main between
releases the next release's development version (``0.5.0.dev0`` after 0.4.0). Each
first-party plugin has its own version, read by its pyproject.toml from its ``__version__``,
and requires a ``dsh-agents`` range holding the core's version (never PyPI's unrelated
``dsh``)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import dsh

ROOT = Path(__file__).resolve().parents[1]
DIST = "dsh-agents"
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})\s*$")


def releases(text: str) -> list[Version]:
    """The released versions of a changelog, newest first; checks every ``## [...]``."""
    found = []
    for line in text.splitlines():
        if line.startswith("## ") and line != "## [Unreleased]":
            m = RELEASE.match(line)
            assert m, f"CHANGELOG.md: {line!r} is neither '## [Unreleased]' nor " \
                      f"'## [X.Y.Z] - YYYY-MM-DD'"
            found.append(Version(m.group(1)))
    return found


def expected_version_ok(version: str, text: str) -> str | None:
    """None when ``version`` follows the rule against changelog ``text``, else why not."""
    released = releases(text)
    if not released:
        return "CHANGELOG.md has no released section"
    last = released[0]
    v = Version(version)
    if v == last:
        return None
    if v.is_devrelease and v.pre is None and v.post is None and v.local is None \
            and v.base_version and Version(v.base_version) > last:
        return None
    return (f"dsh {version} is neither the changelog's last release ({last}) nor a development "
            f"version of a later one (e.g. {last.major}.{last.minor + 1}.0.dev0)")


def test_the_changelog_lists_releases_newest_first() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.count("## [Unreleased]") == 1
    assert text.index("## [Unreleased]") < min(text.index(f"## [{v}]") for v in releases(text))
    released = releases(text)
    assert released == sorted(released, reverse=True)
    assert len(set(released)) == len(released)


def test_dsh_version_follows_the_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert expected_version_ok(dsh.__version__, text) is None, \
        expected_version_ok(dsh.__version__, text)


@pytest.mark.parametrize(("version", "ok"), [
    ("0.4.0", True), ("0.5.0.dev0", True), ("0.5.0.dev3", True), ("1.0.0.dev0", True),
    ("0.3.0", False), ("0.4.1", False), ("0.5.0", False), ("0.4.0.dev0", False),
    ("0.5.0rc1.dev0", False), ("0.5.0.dev0+local", False),
])
def test_the_rule_refuses_what_it_should(version: str, ok: bool) -> None:
    text = "# Changelog\n\n## [Unreleased]\n\n## [0.4.0] - 2026-12-03\n\n## [0.3.0] - 2026-12-02\n"
    assert (expected_version_ok(version, text) is None) is ok


def test_a_release_heading_without_a_date_is_refused() -> None:
    with pytest.raises(AssertionError, match="neither"):
        releases("## [Unreleased]\n\n## [0.4.0]\n")


def test_the_core_distribution_is_dsh_agents() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DIST
    assert project["scripts"]["dsh"] == "dsh.cli.root:main"
    extras = [Requirement(r).name for r in project["optional-dependencies"]["test"]]
    assert "griffe" in extras


def _plugin_version(package: Path) -> str:
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            assert isinstance(node.value, ast.Constant), f"{package}: __version__ not a literal"
            return str(node.value.value)
    raise AssertionError(f"{package}/__init__.py sets no __version__")


PROJECTS = sorted([*ROOT.glob("plugins/*/pyproject.toml"),
                   *ROOT.glob("examples/*/pyproject.toml")])


@pytest.mark.parametrize("pyproject", PROJECTS, ids=lambda p: p.parent.name)
def test_each_first_party_project_requires_this_core(pyproject: Path) -> None:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    deps = [Requirement(d) for d in project.get("dependencies", [])]
    where = pyproject.relative_to(ROOT)
    assert "dsh" not in [d.name for d in deps], \
        f"{where}: depends on 'dsh', an unrelated project on PyPI; the core is {DIST!r}"
    core = [d for d in deps if d.name == DIST]
    assert len(core) == 1, f"{where}: no {DIST} requirement"
    assert core[0].specifier.contains(dsh.__version__, prereleases=True), \
        f"{where}: {core[0]} excludes dsh {dsh.__version__}"


@pytest.mark.parametrize("pyproject", sorted(ROOT.glob("plugins/*/pyproject.toml")),
                         ids=lambda p: p.parent.name)
def test_each_plugin_version_is_its_own_and_consistent(pyproject: Path) -> None:
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    name = data["project"]["name"]
    packages = sorted(p for p in pyproject.parent.glob("dsh_*") if (p / "__init__.py").is_file())
    assert len(packages) == 1, f"{pyproject}: one package dsh_* expected, found {packages}"
    package = packages[0]
    assert data["project"]["dynamic"] == ["version"], f"{name}: its version is not dynamic"
    attr = data["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == f"{package.name}.__version__", f"{name}: version read from {attr}"
    version = Version(_plugin_version(package))  # a valid PEP 440 version
    assert not version.local
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return
    assert Version(installed) == version, (
        f"{name} {installed} is installed but plugins/{pyproject.parent.name} says {version}: "
        f"pip install ./plugins/{pyproject.parent.name}")


def test_version_notes_name_real_releases() -> None:
    """``.. versionadded::`` / ``.. versionchanged::`` in dsh's docstrings (docs/hooks.md is
    generated from them) name a release of the changelog, or the one main is heading to."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    known = {f"{v.major}.{v.minor}" for v in releases(text)}
    upcoming = Version(dsh.__version__)
    known.add(f"{upcoming.major}.{upcoming.minor}")
    wrong = []
    for path in sorted((ROOT / "dsh").rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"\.\. version(?:added|changed):: (\S+)", line):
                if m.group(1).rstrip(".") not in known or re.search(r"\bissue \d", line):
                    wrong.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not wrong, f"notes naming no release (known: {sorted(known)}) or an issue: {wrong}"
