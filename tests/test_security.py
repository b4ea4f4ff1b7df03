"""Security, end to end through the real command line.

* An API key never reaches anything a run writes: the ledger, stdout (plain, ``--json``,
  ``--events``), stderr (also with ``DSH_TRACE_HOOKS``), any file under ``DSH_HOME`` — on
  success, on a 401, through retries, and when a server echoes the key back in its errors.
* dsh-shell keeps a scripted model inside the workspace: ``read_file`` of ``../secret``, an
  absolute path or a symlink out gets an error result, and the secret is written nowhere.
* Config and ledger files are created readable by their owner only, whatever the umask.

The shell plugin's own unit tests (path checks, approvals) are in tests/test_shell_plugin.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_chunks
from tests.servers import openai_completion
from tests.servers import sse

DSH = [sys.executable, "-m", "dsh"]
KEY = "sk-test-SECRET-4242"
#: Every 10-character piece of the key: a message cut in the middle of the key leaks too.
KEY_PIECES = [KEY[i:i + 10] for i in range(len(KEY) - 9)]
SECRET = "TOP-SECRET-CONTENT-7f3a9c"


def run(env: dict[str, str], *args: str, umask: int = -1) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60, umask=umask)


def leaks(text: str | bytes, pieces: list[str] = KEY_PIECES) -> list[str]:
    blob = text.encode() if isinstance(text, str) else text
    return [p for p in pieces if p.encode() in blob]


def leaks_in_files(root: Path, pieces: list[str] = KEY_PIECES,
                   skip: tuple[Path, ...] = ()) -> dict[str, list[str]]:
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path not in skip:
            hit = leaks(path.read_bytes(), pieces)
            if hit:
                found[str(path)] = hit
    return found


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace; ``tmp_path/secret.txt`` lies outside it."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "notes.txt").write_text("inside the workspace\n")
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    return root


@pytest.fixture
def env(tmp_path: Path, ws: Path, server: ScriptedServer) -> dict[str, str]:
    """dsh with the installed dsh-shell (autoload), a workspace, and openai:m on the server."""
    config = tmp_path / "dsh.toml"
    config.write_text(f"""
[plugins.shell]
workspace = {json.dumps(str(ws))}
tty = {json.dumps(str(tmp_path / "no-terminal"))}

[models."openai:m"]
retries = 2
retry_base = 0.01
""")
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "DSH_TRACE_HOOKS", "OPENAI_BASE_URL")}
    e.update(DSH_CONFIG=str(config), OPENAI_API_KEY=KEY, OPENAI_BASE_URL=f"{server.url}/v1")
    return e


# --------------------------------------------------------------------------------------------
# The API key
# --------------------------------------------------------------------------------------------

ENVIRON = '{"command": "cat /proc/self/environ"}'  # an allowlisted command, run by the model


def _cut_inside_key(limit: int, lead: str) -> str:
    """A message whose first ``limit - 1`` characters end 12 characters into the key, so a
    detail cut at ``limit`` characters keeps exactly the key's first 12 characters."""
    return lead + "x" * (limit - 1 - 12 - len(lead)) + KEY + " (from the server)"


def _auth_error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error",
                      "code": "invalid_api_key"}}


SCENARIOS: dict[str, tuple[list[Reply], list[str], dict[str, str], int]] = {
    # name: (replies, dsh run options, extra environment, exit code)
    "success, --events (streamed), a tool reading its environment": (
        [Reply(chunks=openai_chunks(calls=[("call_1", "run_command", [ENVIRON[:12],
                                                                     ENVIRON[12:]])])),
         Reply(chunks=openai_chunks(["The ", "environment ", "is clean."]))],
        ["--events"], {}, 0),
    "success, --json, a tool reading its environment": (
        [Reply(body=openai_completion(calls=[("call_1", "run_command", ENVIRON)])),
         Reply(body=openai_completion("The environment is clean."))],
        ["--json"], {}, 0),
    "success, plain, with DSH_TRACE_HOOKS": (
        [Reply(body=openai_completion(calls=[("call_1", "run_command", ENVIRON)])),
         Reply(body=openai_completion("The environment is clean."))],
        [], {"DSH_TRACE_HOOKS": "1"}, 0),
    "401 echoing the key": (
        [Reply(401, _auth_error(f"Incorrect API key provided: {KEY}. You can find your API "
                                "key at https://platform.openai.com/account/api-keys."))],
        [], {}, 1),
    "401 echoing the key, --events": (
        [Reply(401, _auth_error(f"Incorrect API key provided: {KEY}."))],
        ["--events"], {}, 1),
    "401 with the key cut at the detail limit": (
        [Reply(401, _auth_error(_cut_inside_key(300, "Incorrect API key provided: ")))],
        ["--json"], {}, 1),
    "retries echoing the key, then giving up": (
        [Reply(429, {"error": {"message": f"Rate limit for key {KEY}"}}, {"retry-after": "0"}),
         Reply(503, {"error": {"message": f"overloaded; key={KEY}"}}),
         Reply(500, {"error": {"message": f"internal error for {KEY}"}})],
        ["--json"], {}, 1),
    "retries echoing the key, then success": (
        [Reply(429, {"error": {"message": f"Rate limit for key {KEY}"}}, {"retry-after": "0"}),
         Reply(chunks=openai_chunks(calls=[("call_1", "run_command", [ENVIRON])])),
         Reply(503, {"error": {"message": f"overloaded; key={KEY}"}}),
         Reply(chunks=openai_chunks(["fine ", "now"]))],
        ["--events"], {}, 0),
    "malformed reply echoing the key at the cut": (
        [Reply(body=_cut_inside_key(120, "<html>your key is "),
               headers={"content-type": "text/html"})],
        [], {}, 1),
    "error object in a stream echoing the key": (
        [Reply(chunks=[sse({"error": {"message": f"key {KEY} was revoked",
                                      "code": "invalid_api_key"}})])],
        ["--events"], {}, 1),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_key_never_appears_in_anything_a_run_wrote(env: dict[str, str], server: ScriptedServer,
                                                   tmp_path: Path, name: str) -> None:
    replies, options, extra, code = SCENARIOS[name]
    server.script(*replies)
    r = run({**env, **extra}, "run", "-m", "openai:m", *options, "what is in your environment?")
    assert r.returncode == code, (r.stdout, r.stderr)
    # The key was really in play: sent on every request, in the Authorization header only.
    assert server.received and all(x.headers["authorization"] == f"Bearer {KEY}"
                                   for x in server.received)
    assert not leaks(json.dumps([x.body for x in server.received]))
    assert not leaks(r.stdout), r.stdout
    assert not leaks(r.stderr), r.stderr
    assert not leaks_in_files(tmp_path)  # DSH_HOME (ledger), the workspace, the config dir
    if extra.get("DSH_TRACE_HOOKS"):
        assert "request [hook]" in r.stderr  # the trace of every hook call really ran
    (ledger,) = (Path(env["DSH_HOME"]) / "sessions").glob("*.jsonl")
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    if code == 0:
        # The model's tool really read the environment, and the key was withheld from it.
        (result,) = [e for e in events if e["type"] == "tool/result"]
        assert result["status"] == "ok" and "PATH=" in result["output"]
        assert "OPENAI_API_KEY" not in result["output"]
    else:
        assert events[-1]["outcome"] == "error"
        assert "[redacted]" in events[-1]["reason"]  # the echo was there, and was scrubbed
        assert "[redacted]" in r.stderr


def test_literal_key_in_the_config_stays_out_of_every_output(
        env: dict[str, str], server: ScriptedServer, tmp_path: Path) -> None:
    """A key written into the config (``api_key``) is sent, but never printed or logged."""
    config = Path(env["DSH_CONFIG"])
    config.write_text(config.read_text() + f'api_key = "{KEY}"\n')
    env = {k: v for k, v in env.items() if k != "OPENAI_API_KEY"}
    server.script(Reply(body=openai_completion("hello")),
                  Reply(401, _auth_error(f"Incorrect API key provided: {KEY}")),
                  Reply(body=openai_completion("traced")))
    outputs = []
    first = run(env, "run", "-m", "openai:m", "--events", "hi")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout.splitlines()[0])["session"]
    failed = run(env, "run", "-m", "openai:m", "--session", sid, "again")
    assert failed.returncode == 1 and "check the api_key setting" in failed.stderr
    traced = run({**env, "DSH_TRACE_HOOKS": "1"}, "run", "-m", "openai:m", "--json", "trace")
    assert traced.returncode == 0 and "request [hook]" in traced.stderr
    outputs += [first, failed, traced]
    for args in (["models", "--json"], ["models"], ["agents", "--json"], ["plugins", "--json"],
                 ["sessions", "list", "--json"], ["sessions", "show", "--full", sid],
                 ["sessions", "export", "--format", "jsonl", sid], ["sessions", "export", sid]):
        r = run(env, *args)
        assert r.returncode == 0, (args, r.stderr)
        outputs.append(r)
    for r in outputs:
        assert not leaks(r.stdout) and not leaks(r.stderr), r.args
    assert [x.headers["authorization"] for x in server.received] == [f"Bearer {KEY}"] * 3
    assert not leaks_in_files(tmp_path, skip=(config,))


# --------------------------------------------------------------------------------------------
# The workspace: a scripted model reaching outside it
# --------------------------------------------------------------------------------------------


@pytest.fixture
def escapes(tmp_path: Path, ws: Path) -> dict[str, str]:
    """Paths a model might try, each leading to ``tmp_path/secret.txt``."""
    (ws / "out").symlink_to(tmp_path, target_is_directory=True)
    (ws / "innocent.txt").symlink_to(tmp_path / "secret.txt")
    return {"dotdot": "../secret.txt", "deeper dotdot": "sub/../../secret.txt",
            "absolute": str(tmp_path / "secret.txt"), "symlinked dir": "out/secret.txt",
            "symlinked file": "innocent.txt"}


@pytest.mark.parametrize("kind", ["dotdot", "deeper dotdot", "absolute", "symlinked dir",
                                  "symlinked file"])
def test_read_file_outside_the_workspace_is_an_error_and_the_secret_stays_out(
        env: dict[str, str], tmp_path: Path, escapes: dict[str, str], kind: str) -> None:
    path = escapes[kind]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "let me look", "tool_calls": [{"name": "read_file", "arguments": {"path": path}},
                                               {"name": "read_file",
                                                "arguments": {"path": "notes.txt"}}]},
        {"text": "I could not read it."}]}))
    r = run(env, "run", "-m", f"scripted:{script}", "--events", "read the secret")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert (result["outcome"], result["output"]) == ("completed", "I could not read it.")
    events = [json.loads(line) for line in Path(result["path"]).read_text().splitlines()]
    refused, allowed = [e for e in events if e["type"] == "tool/result"]
    assert refused["status"] == "error"
    assert any(word in refused["output"] for word in ("absolute paths are refused",
                                                      "leaves the workspace",
                                                      "symlink that leads outside"))
    assert (allowed["status"], allowed["output"]) == ("ok", "inside the workspace\n")
    # The secret's content is nowhere dsh wrote.
    assert SECRET not in r.stdout and SECRET not in r.stderr
    assert not leaks_in_files(Path(env["DSH_HOME"]), [SECRET])


def test_write_file_outside_the_workspace_is_refused(env: dict[str, str], tmp_path: Path,
                                                     escapes: dict[str, str]) -> None:
    calls = [{"name": "write_file", "arguments": {"path": p, "content": "pwned"}}
             for p in ("../pwned.txt", str(tmp_path / "pwned2.txt"), "out/pwned3.txt",
                       "innocent.txt")]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"tool_calls": calls}, {"text": "done"}]}))
    r = run(env, "run", "-m", f"scripted:{script}", "--json", "--yes", "write outside")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in
              Path(json.loads(r.stdout)["path"]).read_text().splitlines()]
    assert [e["status"] for e in events if e["type"] == "tool/result"] == ["error"] * 4
    assert not list(tmp_path.glob("pwned*"))
    assert (tmp_path / "secret.txt").read_text() == SECRET + "\n"  # not overwritten via link


def test_session_ids_cannot_name_files_outside_the_sessions_dir(env: dict[str, str],
                                                                tmp_path: Path) -> None:
    assert run(env, "run", "-m", "echo", "hi").returncode == 0
    for args in (["sessions", "show", "../../secret"], ["sessions", "export", "../secret.txt"],
                 ["sessions", "rm", "../secret.txt"], ["run", "--session", "../secret", "x"]):
        r = run(env, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert SECRET not in r.stdout + r.stderr
    assert (tmp_path / "secret.txt").exists()


# --------------------------------------------------------------------------------------------
# File modes
# --------------------------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_config_files_are_created_owner_only(tmp_path: Path, umask: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DSH_CONFIG"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "new" / "xdg")
    r = run(env, "config", "init", umask=umask)  # the default location, directories created
    assert r.returncode == 0, r.stderr
    created = tmp_path / "new" / "xdg" / "dsh" / "config.toml"
    assert mode(created) == 0o600 and "model" in created.read_text()
    other = tmp_path / "other" / "config.toml"
    r = run(env, "--config", str(other), "config", "set", "model", "echo", umask=umask)
    assert r.returncode == 0, r.stderr
    assert mode(other) == 0o600 and "model" in other.read_text()
    # Setting a key rewrites the file (temporary file, rename): still 0600, nothing left over.
    r = run(env, "--config", str(other), "config", "set", "max_steps", "7", umask=umask)
    assert r.returncode == 0, r.stderr
    assert mode(other) == 0o600
    assert sorted(p.name for p in other.parent.iterdir()) == ["config.toml"]
    r = run(env, "--config", str(created), "config", "init", "--force", umask=umask)
    assert r.returncode == 0 and mode(created) == 0o600


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_ledger_is_owner_only_in_an_owner_only_directory(tmp_path: Path, umask: int) -> None:
    home = tmp_path / "fresh-home"
    env = {**os.environ, "DSH_HOME": str(home)}
    env.pop("DSH_CONFIG", None)
    r = run(env, "run", "-m", "echo", "--json", "hi", umask=umask)
    assert r.returncode == 0, r.stderr
    ledger = Path(json.loads(r.stdout)["path"])
    assert ledger.parent == home / "sessions"
    assert mode(ledger) == 0o600
    assert mode(ledger.parent) == 0o700
    # Resuming appends to the same file; its mode does not change.
    again = run(env, "run", "-m", "echo", "--session", ledger.stem, "more", umask=umask)
    assert again.returncode == 0 and mode(ledger) == 0o600


def test_no_save_writes_no_file(tmp_path: Path) -> None:
    home = tmp_path / "fresh-home"
    env = {**os.environ, "DSH_HOME": str(home)}
    env.pop("DSH_CONFIG", None)
    r = run(env, "run", "-m", "echo", "--no-save", "--json", "private")
    assert r.returncode == 0 and json.loads(r.stdout)["path"] is None
    assert not home.exists() or not [p for p in home.rglob("*") if p.is_file()]
