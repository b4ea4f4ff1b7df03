"""``dsh models alias`` and the model names ``-m`` takes: the real ``dsh`` in subprocesses,
with the temporary HOME and config dirs of conftest's ``_isolated_home``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DSH = [sys.executable, "-m", "dsh"]

STARTER = """\
# my models
autoload = false
model = "echo"   # the offline one

[models."openai:gpt-4o-mini"]
price = { input = 0.15, output = 0.60 }
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "dsh.toml"
    path.write_text(STARTER)
    return path


@pytest.fixture
def dsh(config: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, DSH_CONFIG=str(config))
        return subprocess.run([*DSH, *args], env=env, capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)

    return run


def scripted(tmp_path: Path, text: str) -> str:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps({"responses": [{"text": text}]}))
    return f"scripted:{path}"


# -- -m NAME -------------------------------------------------------------------------------


def test_bare_model_name_suggests_its_adapter(dsh: Any) -> None:
    r = dsh("run", "-m", "gpt-4o", "hi")
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown model 'gpt-4o'" in r.stderr
    assert r.stderr.rstrip().endswith("did you mean openai:gpt-4o?"), r.stderr


def test_misspelt_adapter_and_alias_are_suggested(dsh: Any, tmp_path: Path) -> None:
    r = dsh("run", "-m", "anthropc:claude-haiku-4-5", "hi")
    assert r.returncode == 2 and "did you mean anthropic:claude-haiku-4-5?" in r.stderr
    assert dsh("models", "alias", "speedy", scripted(tmp_path, "x")).returncode == 0
    r = dsh("run", "-m", "speedi", "hi")
    assert r.returncode == 2 and "did you mean speedy?" in r.stderr, r.stderr


def test_configured_model_is_suggested_for_its_bare_name(dsh: Any) -> None:
    r = dsh("run", "-m", "gpt-4o-mini", "hi")
    assert r.returncode == 2 and "did you mean openai:gpt-4o-mini?" in r.stderr


def test_empty_model_name_is_an_error(dsh: Any) -> None:
    for value in ("", "  "):
        r = dsh("run", "-m", value, "hi")
        assert r.returncode == 2 and r.stdout == "", (value, r.stdout)
        assert "-m needs a model name" in r.stderr


# -- dsh models alias ----------------------------------------------------------------------


def test_alias_set_list_remove_round_trip(dsh: Any, config: Path) -> None:
    r = dsh("models", "alias", "fast", "openai:gpt-4o-mini")
    assert r.returncode == 0, r.stderr
    assert "alias fast -> openai:gpt-4o-mini" in r.stderr
    assert "sets price; an alias does not inherit" in r.stderr  # the target's own settings
    data = tomllib.loads(config.read_text())
    assert data["models"]["fast"] == {"adapter": "openai", "model": "gpt-4o-mini"}
    assert "# my models" in config.read_text() and "# the offline one" in config.read_text()
    assert dsh("models", "alias", "off", "echo").returncode == 0

    r = dsh("models", "alias", "--list")
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["fast  -> openai:gpt-4o-mini", "off   -> echo"]
    assert dsh("models", "alias").stdout == r.stdout  # no NAME: the list
    rows = json.loads(dsh("models", "alias", "--list", "--json").stdout)
    assert [(x["name"], x["adapter"], x["model"]) for x in rows] == [
        ("fast", "openai", "gpt-4o-mini"), ("off", "echo", "")]

    r = dsh("models", "alias", "--remove", "fast")
    assert r.returncode == 0, r.stderr
    assert "fast" not in tomllib.loads(config.read_text())["models"]
    assert "openai:gpt-4o-mini" in tomllib.loads(config.read_text())["models"]
    assert dsh("models", "alias", "--list").stdout.splitlines() == ["off  -> echo"]


def test_run_with_an_alias_uses_its_target(dsh: Any, tmp_path: Path) -> None:
    target = scripted(tmp_path, "answer from the aliased model")
    assert dsh("models", "alias", "mine", target).returncode == 0
    r = dsh("run", "-m", "mine", "hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "answer from the aliased model"
    assert dsh("models", "alias", "--remove", "mine").returncode == 0
    r = dsh("run", "-m", "mine", "hi")
    assert r.returncode == 2 and "unknown model 'mine'" in r.stderr


def test_alias_refusals_leave_the_file_unchanged(dsh: Any, config: Path) -> None:
    before = config.read_text()
    cases = [
        (("models", "alias", "x", "opnai:gpt-4o"), "did you mean openai:gpt-4o"),
        (("models", "alias", "openai:gpt-4o-mini", "echo"), "own settings, not an alias"),
        (("models", "alias", "has space", "echo"), "no spaces"),
        (("models", "alias", "--remove", "nope"), "no alias 'nope'"),
        (("models", "alias", "lonely"), "missing TARGET"),
    ]
    for args, message in cases:
        r = dsh(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr, (args, r.stderr)
    assert dsh("models", "alias", "a1", "echo").returncode == 0
    r = dsh("models", "alias", "a2", "a1")
    assert r.returncode == 2 and "'a1' is itself an alias (of echo)" in r.stderr
    assert "a2" not in tomllib.loads(config.read_text())["models"]
    assert config.read_text().startswith(before), "the file kept as written, a1 added"


def test_models_still_lists_with_and_without_json(dsh: Any) -> None:
    r = dsh("models")
    assert r.returncode == 0 and "default: echo" in r.stdout
    assert json.loads(dsh("models", "--json").stdout)["default"] == "echo"
