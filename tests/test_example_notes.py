"""examples/dsh-notes: a plugin written against the public API only (docs/api.md). Its own
tests run here in a pytest subprocess (the example's ``src`` on ``sys.path``; dsh.testing's
fixtures come with dsh, through its ``pytest11`` entry point), and its files import nothing
of dsh but ``dsh`` and ``dsh.testing``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "dsh-notes"
#: The dsh modules a plugin may import: the package itself and its public modules.
PUBLIC = {"dsh", "dsh.testing", "dsh.sandbox"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of ``path`` (``from dsh import x`` gives ``dsh``;
    ``from dsh import sandbox`` gives ``dsh.sandbox``, a module reached through ``dsh``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def test_the_example_imports_only_public_dsh() -> None:
    files = sorted(EXAMPLE.rglob("*.py"))
    assert len(files) >= 3, "the example lost its files"
    deep = [f"{f.relative_to(EXAMPLE)}:{line}: {module}" for f in files
            for line, module in _imports(f)
            if (module == "dsh" or module.startswith("dsh.")) and module not in PUBLIC]
    assert deep == [], "the example imports private dsh modules: " + ", ".join(deep)


def test_the_import_check_sees_a_deep_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from dsh.core.errors import ToolError\nimport dsh.ledger.state\n")
    assert [m for _, m in _imports(bad)] == ["dsh.core.errors", "dsh.ledger.state"]


def test_the_example_uses_every_piece_it_shows() -> None:
    source = (EXAMPLE / "src" / "dsh_notes" / "__init__.py").read_text(encoding="utf-8")
    for piece in ("dsh.StateKey(", ".update(", "reducer_error", "dsh.sandbox.run(",
                  "def pre_execute", "@dsh.pass_app", "def declare_settings",
                  "dsh.settings(", "def turn_prompt", "dsh.escape_controls(", "agent_name"):
        assert piece in source, piece


def test_the_example_tests_pass(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSH_", "COV_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:phoenix",
         "-c", str(EXAMPLE / "pyproject.toml"), "--rootdir", str(EXAMPLE),
         "--basetemp", str(tmp_path / "bt"), str(EXAMPLE / "tests")],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "\n7 passed" in proc.stdout, proc.stdout[-2000:]
