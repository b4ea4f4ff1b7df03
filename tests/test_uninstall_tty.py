"""``dsh uninstall`` without a terminal: pip would ask "Proceed (Y/n)?" and fail on the closed
input with a traceback, so dsh refuses before pip runs, saying to pass ``-y`` (exit 2). The
real ``dsh``; the package named is not installed, so pip, when it runs, only says it skips it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pexpect

NAME = "dsh-h6-not-installed-anywhere"


def env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text("autoload = false\n")
    return {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home"),
            "NO_COLOR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def test_without_a_terminal_it_refuses_before_pip_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dsh", "uninstall", NAME], env=env(tmp_path),
                          text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "-y" in done.stderr and "not a terminal" in done.stderr
    assert "Traceback" not in done.stderr and "EOFError" not in done.stderr
    assert "Skipping" not in done.stderr  # pip never ran
    assert done.stdout == ""


def test_with_yes_pip_runs_without_a_terminal(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dsh", "uninstall", "-y", NAME],
                          env=env(tmp_path), text=True, capture_output=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "Skipping" in done.stderr and "no dsh plugin was removed" in done.stderr


def test_on_a_terminal_pip_runs_and_may_ask(tmp_path: Path) -> None:
    child = pexpect.spawn(sys.executable, ["-m", "dsh", "uninstall", NAME], env=env(tmp_path),
                          encoding="utf-8", timeout=180)
    child.expect("Skipping")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
