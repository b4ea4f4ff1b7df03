"""``dsh run /NAME ARGS…`` without quotes: the words after a command are its arguments; the
quoted form keeps working; anything else with extra words is a usage error saying to quote.
The real ``dsh`` in subprocesses, with a small command plugin and the offline echo model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = '''
from dsh.hookspecs import hookimpl

@hookimpl
def expand_command(name, arguments, agent):
    if name == "bullets":
        return "Make bullets of: " + arguments
    return None

@hookimpl
def list_commands(agent):
    return {"bullets": "bullet points"}
'''


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "slashplug.py").write_text(PLUGIN)
    config = tmp_path / "dsh.toml"
    config.write_text(f'autoload = false\nload = ["slashplug"]\nmodel = "echo"\n'
                      f'sessions_dir = "{tmp_path / "sessions"}"\n')
    return {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home"),
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
            "NO_COLOR": "1"}


def dsh(env: dict[str, str], *args: str, input: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", *args], env=env, text=True,
                          capture_output=True, timeout=120, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL)


def sent(env: dict[str, str], done: subprocess.CompletedProcess[str]) -> list[str]:
    session = json.loads(done.stdout)["session"]
    path = Path(env["DSH_CONFIG"]).parent / "sessions" / f"{session}.jsonl"
    return [json.loads(line)["text"] for line in path.read_text().splitlines()
            if json.loads(line)["type"] == "user/message"]


def test_the_words_after_a_command_are_its_arguments(env: dict[str, str]) -> None:
    done = dsh(env, "run", "--json", "/bullets", "my", "text")
    assert done.returncode == 0, done.stderr
    assert sent(env, done) == ["Make bullets of: my text"]


def test_the_quoted_form_keeps_working(env: dict[str, str]) -> None:
    done = dsh(env, "run", "--json", "/bullets my text")
    assert done.returncode == 0, done.stderr
    assert sent(env, done) == ["Make bullets of: my text"]


def test_stdin_still_follows_the_expansion(env: dict[str, str]) -> None:
    done = dsh(env, "run", "--json", "/bullets", "these", "lines", input="one\ntwo\n")
    assert done.returncode == 0, done.stderr
    assert sent(env, done) == ["Make bullets of: these lines\n\n<stdin>\none\ntwo\n</stdin>"]


def test_an_unknown_command_with_arguments_names_the_known_ones(env: dict[str, str]) -> None:
    done = dsh(env, "run", "/bulets", "my", "text")
    assert done.returncode == 2
    assert "/bulets" in done.stderr and "/bullets" in done.stderr
    assert "unexpected extra argument" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("words", [["my", "text"], ["/etc/passwd", "what"], ["//x", "y"]])
def test_other_unquoted_words_are_a_usage_error_saying_to_quote(
        env: dict[str, str], words: list[str]) -> None:
    done = dsh(env, "run", *words)
    assert done.returncode == 2
    assert "quote the prompt" in done.stderr and done.stdout == ""
    assert not (Path(env["DSH_CONFIG"]).parent / "sessions").exists()
