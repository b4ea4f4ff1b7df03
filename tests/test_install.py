"""``dsh install`` / ``dsh uninstall`` (issue 11), for real: pip into a throwaway venv.

The venv is made without pip and sees the test environment's packages (dsh, pip,
setuptools) through a ``site.addsitedir`` line, after its own site-packages: what pip
installs there shadows nothing of the shared environment, and is gone with ``tmp_path``.
The plugin is tests/data/dsh-demo-plugin, built from its source with no index.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh.cli.commands.install import canonical
from dsh.cli.commands.install import requirement_name

DEMO = Path(__file__).parent / "data" / "dsh-demo-plugin"


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A copy of the plugin's source (setuptools builds in the source tree)."""
    import shutil

    return Path(shutil.copytree(DEMO, tmp_path / "src" / DEMO.name))


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A throwaway venv whose python is ``venv/bin/python``; returns the venv's root."""
    root = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(subprocess.run(
        [str(root / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    shared = sysconfig.get_paths()["purelib"]
    (site / "zz_test_env.pth").write_text(f"import site; site.addsitedir({shared!r})\n")
    return root


def dsh(venv: Path, *args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})}
    return subprocess.run([str(venv / "bin" / "python"), "-m", "dsh", *args],
                          capture_output=True, text=True, env=full, cwd=cwd, timeout=300)


def installed(venv: Path) -> list[str]:
    return sorted(p.name for p in venv.glob("lib/python*/site-packages/dsh_demo*"))


def test_install_shows_what_the_plugin_registers_then_uninstall_removes_it(
        venv: Path, demo: Path, tmp_path: Path) -> None:
    r = dsh(venv, "install", str(demo), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert installed(venv) == ["dsh_demo_plugin", "dsh_demo_plugin-0.1.0.dist-info"]
    lines = r.stdout.splitlines()
    assert lines[0] == "plugin demo (dsh-demo-plugin 0.1.0)"
    assert "  hooks: pre_step, register_commands, register_models, register_tools" in lines
    assert "  tools: demo_shout" in lines
    assert "  models: demo:" in lines
    assert "  commands: demo-hello" in lines
    assert "Successfully installed dsh-demo-plugin-0.1.0" in r.stderr  # pip's output: stderr
    # The shared environment did not get it; the venv's dsh runs the new command.
    assert not list(Path(sysconfig.get_paths()["purelib"]).glob("dsh_demo*"))
    assert dsh(venv, "demo-hello").stdout == "hello from the demo plugin\n"

    r = dsh(venv, "uninstall", "--yes", "dsh-demo-plugin")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "removed plugin demo\n"
    assert installed(venv) == []
    assert dsh(venv, "demo-hello").returncode == 2  # no such command any more


def test_install_names_a_plugin_that_fails_to_load(venv: Path, demo: Path, tmp_path: Path) -> None:
    r = dsh(venv, "install", str(demo), env={"DSH_DEMO_BREAK": "1"}, cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout == "plugin demo (dsh-demo-plugin 0.1.0): failed to load\n"
    assert ("dsh: error: plugin demo (dsh-demo-plugin 0.1.0) failed to load: RuntimeError: "
            "demo plugin broken on purpose\n") in r.stderr
    assert installed(venv)  # installed all the same: `dsh uninstall` removes it


def test_install_names_a_plugin_whose_registration_raises(venv: Path, demo: Path,
                                                         tmp_path: Path) -> None:
    r = dsh(venv, "install", str(demo), env={"DSH_DEMO_TOOLS_FAIL": "1"}, cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout.splitlines()[0] == "plugin demo (dsh-demo-plugin 0.1.0): failed to load"
    assert ("failed to load: plugin demo raised in hook register_tools: ValueError: no tools "
            "today") in r.stderr


def test_install_reports_a_plugin_that_ends_the_interpreter(venv: Path, demo: Path,
                                                             tmp_path: Path) -> None:
    r = dsh(venv, "install", str(demo), env={"DSH_DEMO_EXIT": "7"}, cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dsh: error: loading the new plugins (demo) ended the "
                           "interpreter with exit code 7"), last
    assert "dsh uninstall PKG" in last


def test_install_with_a_broken_config_says_so_after_installing(venv: Path, demo: Path,
                                                             tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("max_steps = 'many'\n")
    r = dsh(venv, "--config", str(config), "install", str(demo), cwd=tmp_path)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dsh: error: checking the new plugins: {config}") and \
        last.endswith("; they are installed"), last
    assert installed(venv)


def test_install_fails_clearly_when_pip_does(venv: Path, tmp_path: Path) -> None:
    r = dsh(venv, "install", str(tmp_path / "no-such-dir"), cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == (
        "dsh: error: pip install failed (exit 1); nothing was changed by dsh")


def test_install_without_packages_is_a_usage_error(venv: Path) -> None:
    r = dsh(venv, "install")
    assert r.returncode == 2
    assert "nothing to install" in r.stderr


def test_uninstall_of_a_package_that_is_no_plugin_says_so(venv: Path, tmp_path: Path) -> None:
    r = dsh(venv, "uninstall", "--yes", "not-installed-anywhere")
    assert r.returncode == 0, r.stderr  # pip: "Skipping … as it is not installed"
    assert r.stdout == ""
    assert "no dsh plugin was removed" in r.stderr


def test_run_and_help_do_not_import_the_command_modules_they_do_not_use(tmp_path: Path) -> None:
    """`dsh run` imports none of dsh/cli/commands/ (nor dsh.chat, dsh.batch); `dsh --help` lists
    every command with its one-line help (cheap: click only)."""
    import click

    from dsh.cli.root import LAZY_COMMANDS
    from dsh.cli.root import cli

    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join(sorted(\n"
            "    m for m in sys.modules if m.startswith('dsh.cli.commands')\n"
            "    or m in ('dsh.cli.repl', 'dsh.cli.chat_commands', 'dsh.batch',\n"
            "             'dsh.batch.runner'))) + '\\n'))\n"
            "from dsh.cli.root import main\n"
            "sys.argv = ['dsh'] + sys.argv[1:]\n"
            "main()\n")
    env = {**os.environ, "DSH_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code, "run", "-m", "echo", "--no-save", "hi"],
                         capture_output=True, text=True, env=env)
    assert run.stdout == "hi\n", run.stderr
    assert "MODULES \n" in run.stderr
    helped = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True,
                            text=True, env=env)
    listed = dict(line.split(None, 1) for line in helped.stdout.split("Commands:\n")[1]
                  .splitlines() if line.startswith("  ") and not line.startswith("   "))
    assert set(listed) == {"run", *LAZY_COMMANDS}
    for name in listed:  # each with its one-line help (the start of its docstring)
        cmd = cli.get_command(click.Context(cli), name)
        assert cmd is not None and cmd.help is not None
        assert listed[name].startswith(" ".join(cmd.help.split()[:3])), (name, listed[name])
    assert "pluggy" not in subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv=['dsh','--help']\n"
         "import dsh.cli.root\ntry:\n    dsh.cli.root.main()\nexcept SystemExit:\n    pass\n"
         "print(' '.join(m for m in sys.modules if m.startswith('pluggy')))"],
        capture_output=True, text=True, env=env).stdout.splitlines()[-1]


@given(st.text(), st.sampled_from(["/", "\\"]), st.text())
def test_requirement_name_gives_no_name_for_paths(head: str, sep: str, tail: str) -> None:
    """Anything with a path separator is a path (or URL) to pip: its name is pip's business."""
    assert requirement_name(head + sep + tail) is None


@pytest.mark.parametrize(("arg", "name"), [
    ("dsh-foo", "dsh-foo"), ("Dsh_Foo>=1.0", "dsh-foo"), ("dsh.foo[x]", "dsh-foo"),
    ("dsh_foo==2; python_version>'3'", "dsh-foo"),
])
def test_requirement_name_of_requirements(arg: str, name: str) -> None:
    assert requirement_name(arg) == name
    assert canonical(name) == name


def test_install_editable_reports_the_plugin_and_follows_its_source(
        venv: Path, demo: Path, tmp_path: Path) -> None:
    r = dsh(venv, "install", "-e", str(demo), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "plugin demo (dsh-demo-plugin 0.1.0)"
    assert "  tools: demo_shout" in r.stdout.splitlines()
    source = demo / "dsh_demo_plugin" / "__init__.py"
    source.write_text(source.read_text().replace("hello from the demo plugin", "edited"))
    assert dsh(venv, "demo-hello").stdout == "edited\n"  # the source, not a copy
