"""tools/api_check.py: the public API against the last release (CHANGELOG.md's deprecation
policy). Runs the real script in subprocesses, on this tree (it must pass) and on copies with
a deliberate break (it must fail naming the object, then pass once [Unreleased] announces it)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "api_check.py"
IGNORE = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "node_modules", "dist")


def check(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of this tree's package, plugins, changelog and baselines."""
    root = tmp_path / "tree"
    root.mkdir()
    for name in ("dsh", "plugins"):
        shutil.copytree(ROOT / name, root / name, ignore=IGNORE)
    shutil.copytree(ROOT / "api", root / "api")
    shutil.copy(ROOT / "CHANGELOG.md", root / "CHANGELOG.md")
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path}: {old!r} is not there once"
    path.write_text(text.replace(old, new), encoding="utf-8")


def announce(root: Path, line: str, heading: str = "Changed") -> None:
    """Add ``line`` under ``### heading`` of [Unreleased] (the heading is made if missing)."""
    path = root / "CHANGELOG.md"
    text = path.read_text(encoding="utf-8")
    start = text.index("## [Unreleased]")
    end = text.find("\n## [", start + 1)
    section = text[start:end]
    if f"\n### {heading}\n" in section:
        section = section.replace(f"\n### {heading}\n", f"\n### {heading}\n\n- {line}\n", 1)
    else:
        section = section.rstrip("\n") + f"\n\n### {heading}\n\n- {line}\n\n"
    path.write_text(text[:start] + section + text[end:], encoding="utf-8")


def test_this_tree_breaks_nothing_unannounced() -> None:
    r = check()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("api_check: ok against api/dsh-"), r.stdout


def test_the_baseline_is_the_last_release_in_the_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    last = re.search(r"^## \[(\d+\.\d+\.\d+)\]", text, re.M)
    assert last is not None
    assert (ROOT / "api" / f"dsh-{last.group(1)}.json").is_file(), \
        f"no baseline for {last.group(1)}: python tools/api_check.py --dump " \
        f"api/dsh-{last.group(1)}.json"


def test_a_changed_signature_fails_until_announced(tree: Path) -> None:
    edit(tree / "dsh" / "sandbox" / "__init__.py", "def policy_for(agent: Any) -> Policy:",
         "def policy_for(agent: Any, strict: bool) -> Policy:")
    r = check("--root", tree)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "dsh.sandbox.policy_for(strict): Parameter was added as required: (none) -> " \
           "strict: bool" in r.stderr
    assert "1 breaking change(s)" in r.stderr and r.stdout == ""

    announce(tree, "`dsh.sandbox.policy_for` says which policy it picked", heading="Added")
    assert check("--root", tree).returncode == 1  # Added announces no break

    announce(tree, "`dsh.sandbox.policy_for(agent, strict)` takes `strict`: …")
    r = check("--root", tree)
    assert r.returncode == 0, r.stderr
    assert "1 announced breaking change(s)" in r.stdout


def test_a_released_section_announces_nothing(tree: Path) -> None:
    edit(tree / "dsh" / "sandbox" / "__init__.py", "def policy_for(agent: Any) -> Policy:",
         "def policy_for(who: Any) -> Policy:")
    changelog = tree / "CHANGELOG.md"
    text = changelog.read_text(encoding="utf-8")
    release = text.index("\n## [", text.index("## [Unreleased]") + 1)
    changelog.write_text(text[:release] + "\n## [9.9.9] - 2026-12-31\n\n### Changed\n\n- "
                         "`dsh.sandbox.policy_for`\n" + text[release:], encoding="utf-8")
    r = check("--root", tree)
    assert r.returncode == 1
    assert "dsh.sandbox.policy_for(agent): Parameter was removed" in r.stderr


def test_a_name_public_only_through_the_lazy_map_is_checked(tree: Path) -> None:
    """dsh's public names are imported by ``__getattr__`` from ``_LAZY``: a name with no
    TYPE_CHECKING import is still followed to its definition."""
    init = tree / "dsh" / "__init__.py"
    edit(init, "    from dsh.tools.registry import tool\n", "")
    registry = tree / "dsh" / "tools" / "registry.py"
    text = registry.read_text(encoding="utf-8")
    at = text.index("\ndef tool(")
    param = text.index("    name: str | None = None,", at)
    registry.write_text(text[:param] + "    label" + text[param + len("    name"):],
                        encoding="utf-8")
    r = check("--root", tree)
    assert r.returncode == 1
    assert "dsh.tool(name): Parameter was removed: name: str | None = None (keyword-only) -> " \
           "(none)" in r.stderr


def test_a_removed_public_name_fails(tree: Path) -> None:
    edit(tree / "dsh" / "sandbox" / "__init__.py", '"parse_policy", "policy_for", "run"]',
         '"parse_policy", "run"]')
    r = check("--root", tree)
    assert r.returncode == 1
    assert "dsh.sandbox.policy_for: Public object was removed" in r.stderr
    announce(tree, "`dsh.sandbox.policy_for`: use `dsh.sandbox.Policy`", heading="Removed")
    assert check("--root", tree).returncode == 0


def test_hooks_may_gain_arguments_but_not_lose_them(tree: Path) -> None:
    """An implementation names only the arguments it uses: a new one breaks nobody."""
    hookspecs = tree / "dsh" / "hookspecs.py"
    edit(hookspecs, "def agent_plugins(agent: AgentHandle, installed: list[str])",
         "def agent_plugins(session: Any, agent: AgentHandle, installed: list[str])")
    assert check("--root", tree).returncode == 0
    edit(hookspecs, "def agent_plugins(session: Any, agent: AgentHandle, installed: list[str])",
         "def agent_plugins(agent: AgentHandle)")
    r = check("--root", tree)
    assert r.returncode == 1
    assert "dsh.hookspecs.agent_plugins(installed): Parameter was removed" in r.stderr


def test_a_plugin_public_name_is_checked(tree: Path) -> None:
    init = tree / "plugins" / "dsh-llama" / "dsh_llama" / "__init__.py"
    text = init.read_text(encoding="utf-8")
    assert '"default_model"' in text
    init.write_text(text.replace('"default_model", ', ""), encoding="utf-8")
    r = check("--root", tree)
    assert r.returncode == 1
    assert "dsh_llama.default_model: Public object was removed" in r.stderr


def test_against_a_git_ref(tree: Path) -> None:
    """--against REF reads the package at a tag or commit (git archive: nothing is checked
    out), for a clone that has the release's tag."""
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True, timeout=120)
    subprocess.run([*git, "add", "-A"], check=True, timeout=300)
    subprocess.run([*git, "commit", "-q", "-m", "release", "--no-gpg-sign"], check=True,
                   timeout=300)
    subprocess.run([*git, "tag", "v9.0.0"], check=True, timeout=120)
    edit(tree / "dsh" / "sandbox" / "__init__.py", "def policy_for(agent: Any) -> Policy:",
         "def policy_for(*, agent: Any) -> Policy:")
    r = check("--root", tree, "--against", "v9.0.0")
    assert r.returncode == 1
    assert "dsh.sandbox.policy_for(agent): Parameter kind was changed" in r.stderr
    r = check("--root", tree, "--against", "no-such-ref")
    assert r.returncode == 2
    assert r.stderr.startswith("api_check: error: --against no-such-ref: git archive failed")


def test_a_damaged_baseline_is_an_error(tree: Path) -> None:
    bad = tree / "api" / "dsh-99.0.0.json"
    bad.write_text('{"format": 1, "modules": [1]}', encoding="utf-8")
    r = check("--root", tree)
    assert r.returncode == 2
    assert r.stderr == "api_check: error: api/dsh-99.0.0.json: not an API baseline of format 1\n"


def test_a_baseline_with_damaged_objects_is_an_error(tree: Path) -> None:
    bad = tree / "api" / "dsh-99.0.0.json"
    bad.write_text('{"format": 1, "modules": {"dsh": {"kind": "module", "members": {"x": '
                   '{"kind": "function", "name": 1}}}}}', encoding="utf-8")
    r = check("--root", tree)
    assert r.returncode == 2
    assert r.stderr.startswith("api_check: error: api/dsh-99.0.0.json: a damaged API dump ("), \
        r.stderr
    assert "Traceback" not in r.stderr
