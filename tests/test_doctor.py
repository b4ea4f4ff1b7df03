"""``dsh doctor``: the real ``dsh`` in subprocesses, with the temporary HOME and config dirs of
conftest's ``_isolated_home``; reachability against a loopback server (tests/servers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import closed_port
from tests.servers import openai_completion

DSH = [sys.executable, "-m", "dsh"]


def doctor(tmp_path: Path, config: str | None, *args: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, DSH_KEYS_BACKEND="file", **(env or {}))
    e.pop("OPENAI_BASE_URL", None)
    if config is not None:
        path = tmp_path / "dsh.toml"
        path.write_text(config)
        e["DSH_CONFIG"] = str(path)
    return subprocess.run([*DSH, "doctor", *args], env=e, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def lines(r: subprocess.CompletedProcess[str], check: str) -> list[str]:
    return [ln for ln in r.stdout.splitlines() if ln.split(None, 1)[1].startswith(check + ":")]


def checks(r: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    data = json.loads(r.stdout)
    assert isinstance(data, list)
    return data


def test_doctor_passes_on_a_default_machine(tmp_path: Path) -> None:
    r = doctor(tmp_path, None)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert all(ln.split()[0] in ("ok", "warning") for ln in out), r.stdout
    for name in ("config", "plugins", "agents", "model echo", "keys", "sessions", "sandbox"):
        assert lines(r, name), f"no {name} check:\n{r.stdout}"
    assert "the defaults apply" in lines(r, "config")[0]
    assert "0 failed" in r.stderr


def test_doctor_names_a_broken_base_url_with_its_fix(tmp_path: Path) -> None:
    r = doctor(tmp_path, 'autoload = false\nmodel = "box"\n'
                         '[models.box]\nadapter = "openai"\nmodel = "qwen"\n'
                         'base_url = "127.0.0.1:8765/v1"\n')
    assert r.returncode == 1, r.stdout + r.stderr
    # the loader refuses it (then the config check fails) or the model check does
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("fail ")]
    assert "'127.0.0.1:8765/v1'" in line and "no scheme" in line and "box" in line
    assert "fix: dsh config set 'models.box.base_url' 'http://127.0.0.1:8765/v1'" in line
    assert lines(r, "sandbox") and lines(r, "keys"), "checks that need no config still run"


def test_doctor_names_a_missing_key_with_its_fix(tmp_path: Path) -> None:
    r = doctor(tmp_path, 'autoload = false\nmodel = "openai:gpt-4o-mini"\n'
                         '[agents.writer]\nmodel = "anthropic:claude-haiku-4-5"\n')
    assert r.returncode == 1, r.stdout + r.stderr
    (key,) = lines(r, "model openai:gpt-4o-mini")
    assert key.startswith("fail ") and "OPENAI_API_KEY is not set" in key
    assert "fix: export OPENAI_API_KEY=… or run `dsh keys set openai`" in key
    (key,) = lines(r, "model anthropic:claude-haiku-4-5")
    assert key.startswith("fail ") and "fix: export ANTHROPIC_API_KEY=… or run " \
        "`dsh keys set anthropic`" in key


def test_doctor_names_the_misspelt_default_agent(tmp_path: Path) -> None:
    r = doctor(tmp_path, 'autoload = false\nagent = "codr"\n[agents.coder]\n')
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = lines(r, "agent codr")
    assert line.startswith("fail ") and "fix: dsh config set 'agent' 'coder'" in line


def test_doctor_finds_the_key_and_never_prints_it(tmp_path: Path) -> None:
    secret = "sk-doctor-test-0123456789abcdef"
    r = doctor(tmp_path, 'autoload = false\nmodel = "openai:gpt-4o-mini"\n', "--json",
               env={"OPENAI_API_KEY": secret})
    assert r.returncode == 0, r.stdout + r.stderr
    (key,) = [c for c in checks(r) if c["check"] == "model openai:gpt-4o-mini"]
    assert key["status"] == "ok" and "from OPENAI_API_KEY" in key["message"]
    assert secret not in r.stdout + r.stderr


def test_doctor_sends_no_request_without_check_models(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        r = doctor(tmp_path, f'autoload = false\nmodel = "up"\n[models.up]\nadapter = "openai"'
                             f'\nbase_url = "{server.url}/v1"\n')
        assert r.returncode == 0, r.stdout + r.stderr
        assert server.received == []
    assert not any("reachable" in ln for ln in r.stdout.splitlines())


def test_doctor_check_models_reports_reachable_and_unreachable(tmp_path: Path) -> None:
    dead = closed_port()
    with ScriptedServer() as server:
        server.script(Reply(body=openai_completion("pong")))
        r = doctor(tmp_path, 'autoload = false\nmodel = "up"\n'
                             f'[models.up]\nadapter = "openai"\nmodel = "m-up"\n'
                             f'base_url = "{server.url}/v1"\n'
                             f'[models.down]\nadapter = "openai"\nmodel = "m-down"\n'
                             f'base_url = "http://127.0.0.1:{dead}/v1"\n', "--check-models")
        assert len(server.received) == 1  # ONE tiny request, to the live server only
        sent = server.received[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "m-up" and sent.body["max_tokens"] == 1
    assert r.returncode == 1, r.stdout + r.stderr
    up = [ln for ln in lines(r, "model up") if "reachable" in ln]
    assert up == [f"ok       model up: reachable at {server.url}/v1"], r.stdout
    (down,) = [ln for ln in lines(r, "model down") if "reachable" in ln]
    assert down.startswith("fail ") and "unreachable" in down and str(dead) in down
    assert "fix: start the server, or fix the base_url: dsh config set " \
           "'models.down.base_url' URL" in down


def test_doctor_check_models_names_a_refused_key(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        server.script(Reply(status=401, body={"error": {"message": "bad key"}}))
        r = doctor(tmp_path, f'autoload = false\nmodel = "openai:gpt-4o"\n'
                             f'[models."openai:gpt-4o"]\nbase_url = "{server.url}/v1"\n',
                   "--check-models", "--json", env={"OPENAI_API_KEY": "sk-wrong-key-123"})
    assert r.returncode == 1, r.stdout + r.stderr
    reach = [c for c in checks(r) if "reachable" in c["message"]]
    assert [c["status"] for c in reach] == ["fail"]
    assert "key was refused" in reach[0]["message"] and "dsh keys set" in reach[0]["fix"]
    assert "sk-wrong-key-123" not in r.stdout + r.stderr


def test_doctor_names_a_plugin_that_fails_to_import(tmp_path: Path) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "dshtest_broken.py").write_text('raise ImportError("needs libfoo")\n')
    r = doctor(tmp_path, 'autoload = false\nload = ["dshtest_broken"]\n',
               env={"PYTHONPATH": str(mods)})
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = lines(r, "plugin dshtest_broken")
    assert line.startswith("fail ") and "ImportError: needs libfoo" in line
    assert "fix: " in line and "disable" in line


def test_doctor_config_that_does_not_load_is_a_fail_with_the_file(tmp_path: Path) -> None:
    r = doctor(tmp_path, "model = [\n")
    assert r.returncode == 1
    (line,) = lines(r, "config")
    assert line.startswith("fail ") and "invalid TOML" in line
    assert f"fix: edit {tmp_path / 'dsh.toml'}" in line
    assert lines(r, "sandbox"), "checks that need no config still run"


def test_doctor_unknown_model_suggests_the_fix(tmp_path: Path) -> None:
    r = doctor(tmp_path, 'autoload = false\n[agents.coder]\nmodel = "gpt-4o"\n')
    assert r.returncode == 1
    (line,) = lines(r, "model gpt-4o")
    assert "did you mean openai:gpt-4o?" in line
    assert "dsh config set agents.coder.model openai:gpt-4o" in line


def test_doctor_reports_the_session_index(tmp_path: Path) -> None:
    e = dict(os.environ, DSH_CONFIG=str(tmp_path / "dsh.toml"))
    (tmp_path / "dsh.toml").write_text("autoload = false\n")
    for cmd in (["run", "-m", "echo", "hi"], ["sessions", "list"]):
        done = subprocess.run([*DSH, *cmd], env=e, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    r = doctor(tmp_path, "autoload = false\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok       sessions: 1 in" in r.stdout
    (index,) = lines(r, "session index")
    assert index.startswith("ok ") and "version 2, 1 sessions" in index
    db = Path(os.environ["DSH_HOME"]) / "sessions" / ".index" / "sessions.sqlite3"
    for extra in ("-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    db.write_bytes(b"not a database" * 100)
    r = doctor(tmp_path, "autoload = false\n")
    assert r.returncode == 0, "a damaged index is rebuilt by the next listing: a warning"
    (index,) = lines(r, "session index")
    assert index.startswith("warning ") and "dsh sessions list" in index
    assert db.read_bytes().startswith(b"not a database"), "doctor never writes the index"


@pytest.mark.parametrize("flag", ["--check-models", "--json"])
def test_doctor_options_are_in_its_help(flag: str, tmp_path: Path) -> None:
    r = subprocess.run([*DSH, "doctor", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and flag in r.stdout


def test_doctor_missing_key_of_a_model_no_agent_uses_is_a_warning(tmp_path: Path) -> None:
    r = doctor(tmp_path, 'autoload = false\nmodel = "echo"\n'
                         '[models."anthropic:claude-haiku-4-5"]\ncontext_window = 200000\n')
    assert r.returncode == 0, r.stdout + r.stderr
    (key,) = lines(r, "model anthropic:claude-haiku-4-5")
    assert key.startswith("warning ") and "no agent uses this model" in key
    assert "fix: export ANTHROPIC_API_KEY=…" in key
