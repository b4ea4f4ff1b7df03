"""An installed plugin that fails to import leaves every command usable, with a warning.

A real distribution is made on a temporary path (a module raising ImportError at import, a
``*.dist-info`` with METADATA and ``entry_points.txt``) and put on PYTHONPATH, so dsh finds it
through the ``dsh`` entry-point group as it would find any installed third-party plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DSH = [sys.executable, "-m", "dsh"]
WARNING = ("dsh: warning: plugin broken (dsh-broken 0.1) failed to load: "
           "ImportError: dsh_broken needs libfoo, which is not installed")

BROKEN_MODULE = '''
import os
with open(os.environ["DSHTEST_BROKEN_MARKER"], "a") as f:
    f.write("imported\\n")
raise ImportError("dsh_broken needs libfoo, which is not installed")
'''


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    info = site / "dsh_broken-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "dsh_broken.py").write_text(BROKEN_MODULE)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dsh-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[dsh]\nbroken = dsh_broken\n")
    config = tmp_path / "dsh.toml"
    config.write_text('model = "echo"\n\n[agents.helper]\nsystem = "You help."\n')
    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS")}
    e.update(DSH_CONFIG=str(config), PYTHONPATH=str(site),
             DSHTEST_BROKEN_MARKER=str(tmp_path / "imported"))
    return e


def dsh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


def warned(r: subprocess.CompletedProcess[str]) -> None:
    """Exactly one warning line naming the plugin, its distribution and the error; no
    traceback."""
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    mentions = [line for line in r.stderr.splitlines() if "broken" in line]
    assert mentions == [WARNING], r.stderr


def test_run_works_and_warns_on_stderr_only(env: dict[str, str]) -> None:
    r = dsh(env, "run", "-m", "echo", "hi")
    assert (r.returncode, r.stdout) == (0, "hi\n")  # stdout is only the answer
    warned(r)
    r = dsh(env, "run", "-m", "echo", "--json", "hi")
    assert r.returncode == 0 and json.loads(r.stdout)["output"] == "hi"
    warned(r)


@pytest.mark.parametrize("args", [
    ["plugins"], ["plugins", "--json"], ["tools"], ["tools", "--json"], ["models"], ["agents"],
    ["agents", "--json"], ["sessions", "list"], ["config", "validate"],
])
def test_every_command_stays_usable_and_names_the_plugin(env: dict[str, str],
                                                         args: list[str]) -> None:
    dsh({**env, "DSH_LOAD_PLUGINS": ""}, "run", "-m", "echo", "a session to list")
    r = dsh(env, *args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    warned(r)
    if args == ["plugins"]:
        assert "ImportError: dsh_broken needs libfoo" in r.stdout
    if args == ["plugins", "--json"]:
        row = next(p for p in json.loads(r.stdout) if p["name"] == "broken")
        assert (row["dist"], row["version"]) == ("dsh-broken", "0.1")
        assert row["error"].startswith("ImportError: dsh_broken needs libfoo")
    if args == ["config", "validate"]:
        assert r.stdout == f"ok: {env['DSH_CONFIG']}\n"
    if args == ["sessions", "list"]:
        assert "a session to list" in r.stdout
    if args == ["agents", "--json"]:
        assert {a["name"] for a in json.loads(r.stdout)} == {"default", "helper"}


def test_the_other_plugins_still_load(env: dict[str, str]) -> None:
    """The broken plugin is skipped, not everything: dsh-shell's tools are still there."""
    r = dsh(env, "tools", "--json")
    assert r.returncode == 0, r.stderr
    assert {"read_file", "write_file", "run_command"} <= {t["name"] for t in json.loads(r.stdout)}


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["run", "--help"],
                                  ["config", "path"]])
def test_help_does_not_even_import_it(env: dict[str, str], args: list[str]) -> None:
    r = dsh(env, *args)
    assert (r.returncode, r.stderr) == (0, "")
    assert not Path(env["DSHTEST_BROKEN_MARKER"]).exists()


def test_excluded_by_the_allow_list_it_is_neither_imported_nor_warned_about(
        env: dict[str, str]) -> None:
    r = dsh({**env, "DSH_LOAD_PLUGINS": "shell"}, "run", "-m", "echo", "hi")
    assert (r.returncode, r.stdout, r.stderr) == (0, "hi\n", "")
    assert not Path(env["DSHTEST_BROKEN_MARKER"]).exists()


def test_strict_plugins_makes_it_a_clear_error(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text("strict_plugins = true\n")
    r = dsh(env, "run", "-m", "echo", "hi")
    assert r.returncode != 0 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("dsh: error: plugin broken (dsh-broken 0.1) failed to load: "
                           "ImportError: dsh_broken needs libfoo")
    assert not list((Path(env["DSH_HOME"]) / "sessions").glob("*.jsonl"))
