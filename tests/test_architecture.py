"""The house's shape (issue 21): layer contracts by import-linter, module sizes, old import
paths, and the README's test command being exactly what CI runs."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
MAX_LINES = 500


def _lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if not Path(LINT_IMPORTS).exists():
        pytest.fail("lint-imports is missing: import-linter is in the test extra "
                    "(pip install -e '.[test]')", pytrace=False)
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_layer_contracts_hold() -> None:
    """`lint-imports` with pyproject.toml's contracts: every one kept."""
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"Contracts: (\d+) kept, 0 broken", proc.stdout), proc.stdout
    assert int(re.search(r"Contracts: (\d+) kept", proc.stdout).group(1)) >= 5


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("dsh/ledger/events.py", "import dsh.llm.http", "the ledger knows no provider"),
    ("dsh/llm/base.py", "from dsh.run import loop", "adapters know no loop"),
    ("dsh/core/messages.py", "import dsh_shell", "dsh imports no first-party plugin"),
    ("dsh/host/stash.py", "import click", "import nothing heavy"),
    ("dsh/run/budget.py", "from dsh.cli import render", "dsh's layers"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str,
                                              contract: str) -> None:
    """The contracts can fail: a copy of the package with one forbidden import added (inside a
    function, as the lazy imports are) is refused, naming the contract."""
    shutil.copytree(ROOT / "dsh", tmp_path / "dsh", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\ndef _added() -> None:\n    {line}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = _lint_imports(tmp_path, env)
    assert proc.returncode != 0, proc.stdout
    broken = proc.stdout.split("Broken contracts", 1)[1]
    assert contract in broken, proc.stdout


def _long_modules() -> dict[str, int]:
    found = {}
    for path in [*ROOT.glob("dsh/**/*.py"), *ROOT.glob("plugins/*/*/**/*.py")]:
        parts = path.relative_to(ROOT).parts
        if "tests" in parts or "build" in parts or ".venv" in parts:  # pip's build/lib copies
            continue
        with path.open(encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            found[str(path.relative_to(ROOT))] = n
    return found


def test_no_module_over_500_lines_without_its_reason_in_architecture_md() -> None:
    """Modules of one concept each: one over 500 lines names its reason in docs/architecture.md
    (a row of the table under "Long modules", naming the file)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Long modules", 1)[1].split("\n## ", 1)[0] if "## Long modules" in \
        text else ""
    listed = set(re.findall(r"^\| `([^`]+\.py)` \| .{20,}", section, re.M))
    unexplained = {p: n for p, n in _long_modules().items() if p not in listed}
    assert not unexplained, (f"modules over {MAX_LINES} lines with no reason in "
                             f"docs/architecture.md: {unexplained}")
    stale = listed - set(_long_modules())
    assert not stale, f"docs/architecture.md explains modules that are not long: {stale}"


def test_old_module_paths_are_the_new_modules() -> None:
    """Plugins written for the flat 0.3 layout keep importing (for one more minor version,
    with a DeprecationWarning): an old name is the very module object at the new place, so
    a monkeypatch through either is one."""
    from dsh import _compat

    assert len(_compat.MOVED) >= 30
    for old, new in _compat.MOVED.items():
        if old in sys.modules:  # imported (and warned about) by an earlier test
            assert sys.modules[old] is importlib.import_module(new), old
            continue
        with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)} is deprecated .* "
                          rf"now lives at {re.escape(new)}") as caught:
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert caught[0].filename == __file__  # points at the importing line
        assert importlib.import_module(new).__spec__.name == new  # not renamed by the alias
        assert sys.modules[old] is sys.modules[new]


def test_old_names_of_modules_that_became_packages() -> None:
    import dsh.cli.root
    import dsh.ledger.store
    from dsh.batch import Batch  # noqa: F401
    from dsh.cli import main
    from dsh.cli import sessions  # a lazily-imported command, as before
    from dsh.config import load_config  # noqa: F401
    from dsh.ledger import JsonlStore
    from dsh.ledger import Ledger  # noqa: F401
    from dsh.tools import tool  # noqa: F401
    from dsh.tools.registry import tool as new_tool

    assert JsonlStore is dsh.ledger.store.JsonlStore
    assert main is dsh.cli.root.main and callable(main)
    assert sessions.name == "sessions"
    assert tool is new_tool
    with pytest.raises(ImportError):
        from dsh.ledger import no_such_name  # noqa: F401


def test_old_paths_import_in_a_fresh_process_for_an_old_plugin(tmp_path: Path) -> None:
    """An old-style plugin module (``from dsh.events import …``, ``from dsh.app import App``)
    imports and runs in a fresh interpreter."""
    (tmp_path / "oldplugin.py").write_text(
        "from dsh.app import App\nfrom dsh.events import UserMessage\n"
        "from dsh.runcontext import context\nfrom dsh.messages import Usage\n"
        "import dsh.ledger\n"
        "assert dsh.ledger.JsonlStore.__module__ == 'dsh.ledger.store'\n"
        "r = App.from_config({}).run('hi', model='echo')\n"
        "print(r.output, UserMessage.__module__, Usage.__module__)\n")
    proc = subprocess.run([sys.executable, "-W", "default::DeprecationWarning",
                           str(tmp_path / "oldplugin.py")], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, "DSH_HOME": str(tmp_path / "home"),
                               "XDG_DATA_HOME": str(tmp_path / "data")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["hi", "dsh.ledger.events", "dsh.core.messages"]
    # one warning per old module, each naming the plugin's own line
    for line, old in ((1, "dsh.app"), (2, "dsh.events"), (3, "dsh.runcontext"),
                      (4, "dsh.messages")):
        assert f"oldplugin.py:{line}: DeprecationWarning: {old} is deprecated" in proc.stderr


def test_old_paths_fail_under_warnings_as_errors(tmp_path: Path) -> None:
    """``-W error`` makes an old path fail loudly (a plugin's CI finds it), while dsh's own
    imports never warn: a run under ``-W error`` succeeds."""
    run = [sys.executable, "-W", "error::DeprecationWarning", "-c"]
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home")}
    old = subprocess.run([*run, "import dsh.events"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert old.returncode == 1 and "DeprecationWarning: dsh.events is deprecated" in old.stderr
    new = subprocess.run([*run, "import dsh; from dsh import App; "
                          "print(App.from_config({}).run('hi', model='echo').output)"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert new.returncode == 0, new.stderr
    assert new.stdout == "hi\n"


def test_every_package_says_what_it_holds_and_may_import() -> None:
    for init in sorted(ROOT.glob("dsh/*/__init__.py")):
        doc = (init.read_text().split('"""')[1:2] or [""])[0]
        assert "May import" in doc or init.parent.name in {"testing"}, init


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split("Install and run the whole test suite:", 1)[1]
    return block.split("```sh\n", 1)[1].split("\n```", 1)[0].strip()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """.ci/run holds README's test command verbatim, as a line of its own (what a fresh
    machine following the README installs is what CI installs), and that command installs
    what the wheel-building tests need before anything else (a fresh venv has no ``wheel``)."""
    command = _readme_test_command()
    assert command.endswith("python -m pytest")
    install = command.split(" && ")
    assert any("wheel" in step and "setuptools" in step for step in install[:4]), command
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci_lines, ".ci/run does not run README's test command verbatim"
    runs = [line for line in ci_lines if "pip install" in line and "pytest" in line]
    assert runs == [command], runs  # and no second, different install
