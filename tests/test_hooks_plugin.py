"""plugins/dsh-hooks, installed as a third party's plugin would be (.ci/run installs it):
Claude Code command-hook scripts, written as the protocol's public examples write them, run
as real processes by real ``dsh run`` subprocesses (scripted model, dsh-shell, no terminal,
stdin a pipe), and the ledger checked after each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh.core.errors import ConfigError

try:
    import dsh_hooks
except ImportError:  # reported by the autouse fixture, as a failure, not a skip
    dsh_hooks = None  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-hooks-test-9f8e7d6c5b4a39281706"
needs_jq = pytest.mark.skipif(
    shutil.which("jq") is None,
    reason="jq is not installed (the bash examples of the protocol use it)")

# ------------------------------------------------------------------ the protocol's examples

# PreToolUse, exit 2: the reason on stderr goes to the model; the call does not run.
RM_BLOCKER = """\
#!/usr/bin/env python3
import json
import re
import sys

input_data = json.load(sys.stdin)
tool_name = input_data.get("tool_name", "")
command = input_data.get("tool_input", {}).get("command", "")
if tool_name != "Bash" or not command:
    sys.exit(0)
if re.search(r"\\brm\\s+-rf\\b", command):
    print("Dangerous command blocked: rm -rf is not allowed", file=sys.stderr)
    sys.exit(2)
sys.exit(0)
"""

# PreToolUse, JSON output with jq: permissionDecision deny.
JQ_DENY = """\
#!/bin/bash
COMMAND=$(jq -r '.tool_input.command')
if echo "$COMMAND" | grep -q 'rm -rf'; then
  jq -n '{
    hookSpecificOutput: {
      hookEventName: "PreToolUse",
      permissionDecision: "deny",
      permissionDecisionReason: "Destructive command blocked by hook"
    }
  }'
fi
exit 0
"""

# PreToolUse, updatedInput: rewrite the command before it runs.
REWRITE = """\
#!/usr/bin/env python3
import json
import sys

data = json.load(sys.stdin)
cmd = data["tool_input"].get("command", "")
if cmd.startswith("echo original"):
    print(json.dumps({
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "permissionDecisionReason": "rewritten to a safe echo",
            "updatedInput": {"command": "echo rewritten", "description": "ignored by dsh"},
        }
    }))
sys.exit(0)
"""

# UserPromptSubmit: plain stdout on exit 0 is added as context; "password" is blocked.
PROMPT_HOOK = """\
#!/usr/bin/env python3
import json
import sys

try:
    input_data = json.load(sys.stdin)
except json.JSONDecodeError as e:
    print(f"Error: Invalid JSON input: {e}", file=sys.stderr)
    sys.exit(1)

prompt = input_data.get("prompt", "")
if "password" in prompt.lower():
    output = {
        "decision": "block",
        "reason": "Security policy violation: Prompt contains potential secrets.",
    }
    print(json.dumps(output))
    sys.exit(0)

context = "Current branch: hook-test-branch"
print(context)
sys.exit(0)
"""

# Stop: block once, then honour stop_hook_active (jq).
STOP_ONCE = """\
#!/bin/bash
INPUT=$(cat)
echo "$INPUT" >> "$CLAUDE_PROJECT_DIR/stop-inputs.jsonl"
if [ "$(echo "$INPUT" | jq -r '.stop_hook_active')" = "true" ]; then
  exit 0
fi
echo '{"decision": "block", "reason": "Run the tests before stopping"}'
"""

# PostToolUse logger (the docs' bash-command-log example, logging to the project).
POST_LOGGER = """\
#!/bin/bash
jq -r '"\\(.tool_name) \\(.tool_input.command // .tool_input.file_path) -> \\(
  .tool_response.status)"' >> "$CLAUDE_PROJECT_DIR/tool-log.txt"
"""

# Environment probe: what a hook sees of dsh's environment and memory.
ENV_PROBE = """\
#!/usr/bin/env python3
import json
import os
import sys

json.load(sys.stdin)
found = {"env": dict(os.environ), "proc": {}}
pid = os.getppid()
for _ in range(4):
    for name in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                found["proc"][f"{pid}/{name}"] = f.read().decode("latin-1")
        except OSError as exc:
            found["proc"][f"{pid}/{name}"] = f"refused: {exc.strerror}"
    try:
        with open(f"/proc/{pid}/status") as f:
            pid = int(next(x for x in f if x.startswith("PPid:")).split()[1])
    except (OSError, StopIteration, ValueError):
        break
    if pid <= 1:
        break
with open(os.path.join(os.environ["CLAUDE_PROJECT_DIR"], "env.json"), "w") as f:
    json.dump(found, f)
"""


@pytest.fixture(autouse=True)
def _require_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    if dsh_hooks is None:
        pytest.fail(f"dsh-hooks is not installed: run `{sys.executable} -m pip install "
                    f"{REPO / 'plugins' / 'dsh-hooks'}` (.ci/run does)", pytrace=False)
    monkeypatch.delenv("DSH_LOAD_PLUGINS", raising=False)


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    """The project (cwd, dsh-shell workspace) with the example scripts in .claude/hooks."""
    root = tmp_path / "proj"
    (root / ".claude" / "hooks").mkdir(parents=True)
    for name, text in {"rm_blocker.py": RM_BLOCKER, "jq_deny.sh": JQ_DENY,
                       "rewrite.py": REWRITE, "prompt.py": PROMPT_HOOK,
                       "stop_once.sh": STOP_ONCE, "post_logger.sh": POST_LOGGER,
                       "env_probe.py": ENV_PROBE}.items():
        path = root / ".claude" / "hooks" / name
        path.write_text(text)
        path.chmod(0o755)
    (root / "victim").mkdir()
    (root / "victim" / "keep.txt").write_text("keep me\n")
    (root / "notes.txt").write_text("some notes\n")
    return root


def script(proj: Path, name: str) -> str:
    """A hook command as users write them in .claude/settings.json."""
    return f'"$CLAUDE_PROJECT_DIR"/.claude/hooks/{name}'


def hook(event: str, command: str, matcher: str | None = None,
         timeout: float | None = None) -> dict[str, Any]:
    h: dict[str, Any] = {"type": "command", "command": command}
    if timeout is not None:
        h["timeout"] = timeout
    group: dict[str, Any] = {"hooks": [h]}
    if matcher is not None:
        group["matcher"] = matcher
    return {event: [group]}


def write_config(tmp: Path, proj: Path, hooks: dict[str, Any] | None = None,
                 **extra: Any) -> Path:
    import tomli_w

    settings: dict[str, Any] = {**extra}
    if hooks is not None:
        settings["hooks"] = hooks
    cfg = {"sessions_dir": str(tmp / "sessions"),
           "plugins": {"hooks": settings,
                       "shell": {"workspace": str(proj), "tty": str(tmp / "no-tty")}}}
    path = tmp / "dsh.toml"
    path.write_text(tomli_w.dumps(cfg))
    return path


def model(tmp: Path, *responses: dict[str, Any]) -> str:
    path = tmp / "script.json"
    path.write_text(json.dumps({"responses": list(responses)}))
    return f"scripted:{path}"


def bash_call(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}


def dsh(tmp: Path, proj: Path, config: Path, *args: str, stdin: str = "",
        env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``dsh --config CONFIG ARGS`` in the project, in a pipeline: stdin a pipe, stdout a
    pipe, no controlling terminal (its own session)."""
    full = {**os.environ, "OPENAI_API_KEY": SECRET, "HOME": str(tmp / "home"),
            **(env or {})}
    full.pop("DSH_LOAD_PLUGINS", None)
    (tmp / "home").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), *args],
                          input=stdin, capture_output=True, text=True, cwd=proj, env=full,
                          timeout=timeout, start_new_session=True)


def approve(path: Path, kind: str = "hooks") -> None:
    """Trust the current bytes of a project file (as `dsh trust approve PATH` does); the
    record is in this test's XDG_CONFIG_HOME, which the dsh subprocesses inherit."""
    from dsh.config import trust

    trust.approve(path.parent, path.name, trust.digest(path.read_bytes()), kind)


def ledger(tmp: Path) -> list[dict[str, Any]]:
    files = sorted((tmp / "sessions").glob("*.jsonl"))
    assert files, "no session ledger was written"
    return [json.loads(line) for line in files[-1].read_text().splitlines()]


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def consistent(events: list[dict[str, Any]]) -> None:
    """Every tool call has a result, every step and turn is closed."""
    calls = {e["call_id"] for e in of(events, "tool/call")}
    results = {e["call_id"] for e in of(events, "tool/result")}
    assert calls == results
    assert len(of(events, "step/start")) == len(of(events, "step/end"))
    assert len(of(events, "turn/start")) == len(of(events, "turn/end"))


# ------------------------------------------------------------------ PreToolUse


def test_pre_execute_rm_rf_blocked_by_exit_2(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("PreToolUse", script(proj, "rm_blocker.py"), "Bash"))
    m = model(tmp_path, bash_call("rm -rf victim"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-m", m, "clean up")
    assert r.returncode == 0, r.stderr
    assert (proj / "victim" / "keep.txt").exists()  # the command never ran
    events = ledger(tmp_path)
    [res] = of(events, "tool/result")
    assert res["status"] == "error"
    assert "Dangerous command blocked: rm -rf is not allowed" in res["output"]
    assert "rm_blocker.py" in res["output"]  # the hook command is named in the record
    consistent(events)


@needs_jq
def test_pre_execute_json_permission_deny_with_jq(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("PreToolUse", script(proj, "jq_deny.sh"), "Bash"))
    m = model(tmp_path, bash_call("rm -rf victim"), bash_call("echo still-fine"),
              {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    assert (proj / "victim").exists()
    results = of(ledger(tmp_path), "tool/result")
    assert results[0]["status"] == "error"
    assert "Destructive command blocked by hook" in results[0]["output"]
    assert results[1]["status"] == "ok" and "still-fine" in results[1]["output"]


def test_pre_execute_updated_input_rewrites_and_is_recorded(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("PreToolUse", script(proj, "rewrite.py"), "Bash"))
    m = model(tmp_path, bash_call("echo original"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")  # no --yes: echo is allowlisted
    assert r.returncode == 0, r.stderr
    events = ledger(tmp_path)
    [call] = of(events, "tool/call")
    assert call["arguments"] == {"command": "echo original"}  # what the model asked
    [res] = of(events, "tool/result")
    assert res["status"] == "ok"
    assert "rewritten" in res["output"] and "original" not in res["output"].split("\n\n")[0]
    assert 'rewrote the arguments: {"command": "echo rewritten"}' in res["output"]


def test_pre_execute_allow_skips_approval_for_that_call_only(tmp_path: Path, proj: Path) -> None:
    allow = ("python3 -c 'import json,sys; d=json.load(sys.stdin); "
             "print(json.dumps({\"hookSpecificOutput\": {\"permissionDecision\": "
             "\"allow\" if \"touch\" in d[\"tool_input\"][\"command\"] else \"\"}}))'")
    cfg = write_config(tmp_path, proj, hook("PreToolUse", allow, "Bash"))
    m = model(tmp_path, bash_call("touch made-by-allow"), bash_call("mkdir not-allowed"),
              {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")  # no --yes, no terminal
    assert r.returncode == 0, r.stderr
    assert (proj / "made-by-allow").exists()
    assert not (proj / "not-allowed").exists()  # approval was back for the next call
    results = of(ledger(tmp_path), "tool/result")
    assert "allowed the call without approval" in results[0]["output"]
    assert "needs approval" in results[1]["output"]


def test_pre_execute_ask_without_terminal_blocks(tmp_path: Path, proj: Path) -> None:
    ask = ("echo '{\"hookSpecificOutput\": {\"permissionDecision\": \"ask\", "
           "\"permissionDecisionReason\": \"writes files\"}}'")
    cfg = write_config(tmp_path, proj, hook("PreToolUse", ask, "Bash"))
    m = model(tmp_path, bash_call("echo hi"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    [res] = of(ledger(tmp_path), "tool/result")
    assert res["status"] == "error" and "no terminal to ask on" in res["output"]


# ------------------------------------------------------------------ PostToolUse


@needs_jq
def test_post_execute_logger_sees_protocol_names(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("PostToolUse", script(proj, "post_logger.sh"),
                                            "Bash|Read"))
    m = model(tmp_path, bash_call("echo logged"),
              {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
              {"tool_calls": [{"name": "write_file",
                               "arguments": {"path": "w.txt", "content": "x"}}]},
              {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    log = (proj / "tool-log.txt").read_text().splitlines()
    # Write does not match "Bash|Read": two lines, Read's path absolute as Claude Code's.
    assert log == ["Bash echo logged -> ok", f"Read {proj / 'notes.txt'} -> ok"]


def test_post_execute_block_reason_and_context_reach_the_result(tmp_path: Path,
                                                                proj: Path) -> None:
    fb = ("echo '{\"decision\": \"block\", \"reason\": \"lint failed: fix it\", "
          "\"hookSpecificOutput\": {\"hookEventName\": \"PostToolUse\", "
          "\"additionalContext\": \"style guide: PEP 8\"}}'")
    cfg = write_config(tmp_path, proj, hook("PostToolUse", fb, "Write"))
    m = model(tmp_path, {"tool_calls": [{"name": "write_file",
                                         "arguments": {"path": "a.py", "content": "x=1"}}]},
              {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    [res] = of(ledger(tmp_path), "tool/result")
    assert "lint failed: fix it" in res["output"] and "style guide: PEP 8" in res["output"]


# ------------------------------------------------------------------ UserPromptSubmit, SessionStart


def test_pre_step_prompt_context_injected_before_the_message(tmp_path: Path, proj: Path) -> None:
    hooks = {**hook("UserPromptSubmit", script(proj, "prompt.py")),
             **hook("SessionStart", "echo session-start-context", "startup")}
    cfg = write_config(tmp_path, proj, hooks)
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "summarise", stdin="piped data\n")
    assert r.returncode == 0, r.stderr
    events = ledger(tmp_path)
    kinds = [e["type"] for e in events]
    first_user = kinds.index("user/message")
    injected = of(events, "context/injected")
    assert [e["text"] for e in injected] == ["session-start-context",
                                              "Current branch: hook-test-branch"]
    assert all(events.index(e) < first_user for e in injected)
    assert "prompt.py" in injected[1]["source"] and "UserPromptSubmit" in injected[1]["source"]
    assert of(events, "user/message")[0]["text"].startswith("summarise")


def test_pre_step_prompt_block_rejects_the_step(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("UserPromptSubmit", script(proj, "prompt.py")))
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "my password is hunter2")
    assert r.returncode == 4, r.stderr  # rejected by a plugin
    events = ledger(tmp_path)
    [rej] = of(events, "step/rejected")
    assert rej["plugin"] == "hooks"
    assert "Security policy violation" in rej["reason"] and "prompt.py" in rej["reason"]
    assert not of(events, "user/message") and not of(events, "assistant/message")


def test_session_start_fires_on_startup_then_resume(tmp_path: Path, proj: Path) -> None:
    log = ("python3 -c 'import json,sys,os; d=json.load(sys.stdin); "
           "open(os.environ[\"DSH_PROJECT_DIR\"]+\"/ss.log\",\"a\").write(d[\"source\"]+\"\\n\")'")
    cfg = write_config(tmp_path, proj, {**hook("SessionStart", log),
                                        **hook("SessionEnd", log.replace("source", "reason"))})
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "one")
    assert r.returncode == 0, r.stderr
    sid = ledger(tmp_path)[0]["session"]
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "--session", sid, "two")
    assert r.returncode == 0, r.stderr
    assert (proj / "ss.log").read_text().split() == ["startup", "other", "resume", "other"]


# ------------------------------------------------------------------ Stop


@needs_jq
def test_turn_stopping_blocks_once_then_honours_stop_hook_active(tmp_path: Path,
                                                                 proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("Stop", script(proj, "stop_once.sh")))
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "finish")
    assert r.returncode == 0, r.stderr
    inputs = [json.loads(x) for x in (proj / "stop-inputs.jsonl").read_text().splitlines()]
    assert [i["stop_hook_active"] for i in inputs] == [False, True]
    assert all(i["hook_event_name"] == "Stop" for i in inputs)
    events = ledger(tmp_path)
    users = of(events, "user/message")
    assert len(users) == 2 and users[1]["source"] == "plugin:hooks"
    assert "Run the tests before stopping" in users[1]["text"]
    assert "stop_once.sh" in users[1]["text"]
    assert of(events, "turn/end")[0]["outcome"] == "completed"
    assert inputs[0]["transcript_path"].endswith(".jsonl")
    # the Claude Code-shaped rendering (not the ledger), removed when the run ended
    assert (tmp_path / "sessions") not in Path(inputs[0]["transcript_path"]).parents
    assert not Path(inputs[0]["transcript_path"]).exists()


def test_continue_false_stops_the_run(tmp_path: Path, proj: Path) -> None:
    stop = "echo '{\"continue\": false, \"stopReason\": \"quota for today used\"}'"
    cfg = write_config(tmp_path, proj, hook("PostToolUse", stop))
    m = model(tmp_path, bash_call("echo one"), bash_call("echo two"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert "quota for today used" in r.stderr
    events = ledger(tmp_path)
    assert len(of(events, "tool/call")) == 1  # stopped after the step
    assert of(events, "turn/end")[0]["outcome"] == "stopped"
    assert "quota for today used" in of(events, "tool/result")[0]["output"]


# ------------------------------------------------------------------ faults


@pytest.mark.parametrize(("command", "says"), [
    ("sleep 30", "timed out after 1s"),
    ("python3 -c 'raise SystemExit(\"boom\")'", "exit 1: boom"),
    ("echo '{\"hookSpecificOutput\": garbage'", "stdout is not valid JSON"),
    ("python3 -c 'import sys; sys.stdout.write(\"x\" * 10_000_000)'",
     "printed more than 1048576 bytes"),
    ("/nonexistent/dir/hook.sh", "COMMAND NOT FOUND (exit 127)"),
])
def test_pre_execute_faults_are_clear_and_the_run_goes_on(tmp_path: Path, proj: Path,
                                                          command: str, says: str) -> None:
    cfg = write_config(tmp_path, proj, hook("PreToolUse", command, "Bash", timeout=1))
    m = model(tmp_path, bash_call("echo ran-anyway"), {"text": "done"})
    start = time.monotonic()
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert time.monotonic() - start < 20
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done"
    assert says in r.stderr
    assert len(r.stderr) < 4000  # a clear line, not 10 MB
    events = ledger(tmp_path)
    consistent(events)
    [res] = of(events, "tool/result")
    assert res["status"] == "ok" and "ran-anyway" in res["output"]
    if "JSON" not in says:  # non-blocking errors are recorded with the result
        assert "not applied" in res["output"]


def test_hook_does_not_hold_the_run_after_timeout_with_children(tmp_path: Path,
                                                                proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("Stop", "sleep 30 & sleep 30", timeout=1))
    start = time.monotonic()
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 0 and time.monotonic() - start < 15
    assert "timed out after 1s" in r.stderr


# ------------------------------------------------------------------ environment


def test_hook_environment_has_no_secrets(tmp_path: Path, proj: Path) -> None:
    """The hook's own environment: the allowlist plus the project variables (any user)."""
    cfg = write_config(tmp_path, proj, hook("UserPromptSubmit", script(proj, "env_probe.py")))
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi",
            env={"DSH_TEST_DATABASE_URL": f"postgres://u:{SECRET}@h/db"})
    assert r.returncode == 0, r.stderr
    found = json.loads((proj / "env.json").read_text())
    assert found["env"]["CLAUDE_PROJECT_DIR"] == str(proj)
    assert found["env"]["DSH_PROJECT_DIR"] == str(proj)
    assert "OPENAI_API_KEY" not in found["env"]
    assert "DSH_TEST_DATABASE_URL" not in found["env"]
    assert SECRET not in json.dumps(found["env"])


def test_hook_as_a_normal_user_cannot_read_dshs_environment() -> None:
    """/proc/<dsh>/environ is closed to a hook running as the same (non-root) user: dsh is
    non-dumpable. As root (CI), the whole run is dropped to user nobody with setpriv; root
    itself may read any process's memory (docs/security.md)."""
    uid = None
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is not installed: cannot drop to user nobody")
        uid = 65534
    base = Path(tempfile.mkdtemp(prefix="dsh-hooks-env-"))
    try:
        base.chmod(0o755)
        proj = base / "proj"
        (proj / ".claude" / "hooks").mkdir(parents=True)
        probe = proj / ".claude" / "hooks" / "env_probe.py"
        probe.write_text(ENV_PROBE)
        probe.chmod(0o755)
        (base / "sessions").mkdir()
        cfg = write_config(base, proj, hook("UserPromptSubmit", script(proj, "env_probe.py")))
        if uid is not None:
            for p in (proj, proj / ".claude", proj / ".claude" / "hooks", probe,
                      base / "sessions", cfg):
                os.chown(p, uid, uid)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base),
               "LANG": "C.UTF-8", "OPENAI_API_KEY": SECRET,
               "DSH_TEST_DATABASE_URL": f"postgres://u:{SECRET}@h/db"}
        cmd = [sys.executable, "-m", "dsh", "--config", str(cfg), "run", "-m", "echo", "hi"]
        if uid is not None:
            cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
        r = subprocess.run(cmd, env=env, cwd=proj, capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL, start_new_session=True)
        assert r.returncode == 0, r.stderr
        found = json.loads((proj / "env.json").read_text())
        assert SECRET not in json.dumps(found)
        dsh_environ = [v for k, v in found["proc"].items() if k.endswith("environ")][0]
        assert dsh_environ.startswith("refused"), dsh_environ  # really tried, and refused
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ config sources, per agent


def test_claude_settings_files_are_read_when_opted_in(tmp_path: Path, proj: Path) -> None:
    (proj / ".claude" / "settings.json").write_text(json.dumps(
        {"hooks": {**hook("PreToolUse", script(proj, "rm_blocker.py"), "Bash"),
                   **hook("Notification", "notify-send hi")}}))
    (proj / ".claude" / "settings.local.json").write_text(json.dumps(
        {"hooks": hook("Stop", "true")}))
    home = tmp_path / "home" / ".claude"
    home.mkdir(parents=True)
    (home / "settings.json").write_text(json.dumps({"hooks": hook("SessionEnd", "true")}))
    cfg = write_config(tmp_path, proj, claude_settings=["project", "local", "user"])
    r = dsh(tmp_path, proj, cfg, "hooks", "list")  # not trusted yet: listed, never asked
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert [x[3].endswith("(ignored: not trusted: dsh trust approve "
                          f"{proj / '.claude' / name})") for x, name in
            zip(rows[::2], ["settings.json", "settings.local.json"], strict=True)] == [True] * 2
    assert rows[3][3] == str(home / "settings.json")  # the user's own: trusted
    approve(proj / ".claude" / "settings.json")
    approve(proj / ".claude" / "settings.local.json")
    r = dsh(tmp_path, proj, cfg, "hooks", "list")
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert [(x[0], x[1]) for x in rows] == [("PreToolUse", "Bash"), ("Notification", "*"),
                                            ("Stop", "*"), ("SessionEnd", "*")]
    assert rows[0][3] == str(proj / ".claude" / "settings.json")
    assert "ignored: event Notification is not supported" in rows[1][3]
    assert rows[2][3] == str(proj / ".claude" / "settings.local.json")
    assert rows[3][3] == str(home / "settings.json")
    # Not opted in: nothing is read.
    cfg = write_config(tmp_path, proj)
    r = dsh(tmp_path, proj, cfg, "hooks", "list")
    assert r.stdout == "" and "no hooks configured" in r.stderr


def test_hooks_test_command_prints_decisions(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("PreToolUse", script(proj, "rm_blocker.py"), "Bash"))
    r = dsh(tmp_path, proj, cfg, "hooks", "test", "PreToolUse", "--tool", "run_command",
            "--input", '{"command": "rm -rf /"}')
    assert r.returncode == 2, r.stderr
    assert r.stdout.startswith("block\tPreToolUse hook")
    assert "rm -rf is not allowed" in r.stdout
    r = dsh(tmp_path, proj, cfg, "hooks", "test", "PreToolUse", "--tool", "Bash",
            "--input", '{"command": "ls"}')
    assert r.returncode == 0 and r.stdout.startswith("ok\t")


def test_per_agent_settings(tmp_path: Path, proj: Path) -> None:
    import tomli_w

    cfg = tmp_path / "dsh.toml"
    cfg.write_text(tomli_w.dumps({
        "sessions_dir": str(tmp_path / "sessions"),
        "plugins": {"shell": {"workspace": str(proj)}},
        "agents": {"guarded": {"plugin_settings": {"hooks": {"hooks": hook(
            "PreToolUse", script(proj, "rm_blocker.py"), "Bash")}}},
                   "free": {}},
    }))
    m = model(tmp_path, bash_call("rm -rf victim"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-a", "guarded", "-m", m, "go")
    assert r.returncode == 0 and (proj / "victim").exists()
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-a", "free", "-m", m, "go")
    assert r.returncode == 0 and not (proj / "victim").exists()


def test_config_errors_are_one_line(tmp_path: Path, proj: Path) -> None:
    from dsh.run.app import App

    with pytest.raises(ConfigError, match=r"unknown event 'PreToolUse2'; did you mean "
                                          r"'PreToolUse'\?"):
        App.from_config({"plugins": {"hooks": {"hooks": {"PreToolUse2": []}}}}).agent()
    (proj / ".claude" / "settings.json").write_text("{not json")
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 0, r.stderr  # not trusted: inert, whatever it holds
    assert "not trusted: not used" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    approve(proj / ".claude" / "settings.json")
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode != 0
    assert f"{proj / '.claude' / 'settings.json'}: not valid JSON" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ matchers, parallel, import


@pytest.mark.parametrize(("matcher", "name", "hit"), [
    ("", "Bash", True), ("*", "mcp__github__search", True), ("Bash", "Bash", True),
    ("Bash", "BashX", False), ("Edit|Write", "Write", True), ("Edit|Write", "Read", False),
    ("Notebook.*", "NotebookEdit", True), ("mcp__memory__.*", "mcp__memory__create", True),
    ("mcp__.*__write.*", "mcp__fs__write_file", True), ("mcp__.*__write.*", "Write", False),
])
def test_matchers(matcher: str, name: str, hit: bool) -> None:
    from dsh_hooks import config
    from dsh_hooks.engine import matches

    assert matches(matcher, name) is hit
    config.check({"hooks": hook("PreToolUse", "true", matcher)}, "plugins.hooks")


def test_matcher_that_is_no_regex_is_a_config_error() -> None:
    from dsh_hooks import config

    with pytest.raises(ConfigError, match=r"matcher: 'Bash\(' is not a valid regex"):
        config.check({"hooks": hook("PreToolUse", "true", "Bash(")}, "plugins.hooks")


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)


@given(name=names, others=st.lists(names, max_size=3))
def test_matchers_property(name: str, others: list[str]) -> None:
    """A name matches itself, any alternation containing it, its escaped regex and '*';
    an alternation without it matches only if one of its names is it."""
    import re

    from dsh_hooks.engine import matches

    assert matches(name, name) and matches("*", name) and matches("", name)
    assert matches("|".join([*others, name]), name)
    assert matches(f"^{re.escape(name)}$", name)
    if others:
        assert matches("|".join(others), name) is (name in others)


@given(path=st.lists(st.from_regex(r"[a-z0-9_.-]{1,8}", fullmatch=True)
                     .filter(lambda p: p not in (".", "..")), min_size=1, max_size=4),
       content=st.text(max_size=50))
def test_tool_input_round_trip(path: list[str], content: str) -> None:
    """dsh-shell's arguments shown in Claude Code's shape and mapped back are unchanged."""
    from dsh_hooks import config
    from dsh_hooks.engine import Engine

    ws = "/work/space"
    eng = Engine(config.HookSettings((), ws, dict(config.DEFAULT_TOOLS)), None, workspace=ws)
    args = {"path": "/".join(path), "content": content}
    name, shown_input = eng.present("write_file", args)
    assert name == "Write" and shown_input["file_path"] == os.path.join(ws, *path)
    assert shown_input["content"] == content
    assert eng.back("write_file", shown_input, {"path", "content"}) == args


def test_large_input_and_output_pass_through_the_pipes(tmp_path: Path) -> None:
    """Input larger than a pipe holds is written while the output is read (no deadlock)."""
    from dsh_hooks import runner

    data = b"x" * 300_000
    ran = runner.run("wc -c; cat >/dev/null; echo err >&2", data, timeout=10,
                     cwd=str(tmp_path), env=runner.child_env((), str(tmp_path)),
                     max_output=1 << 20)
    assert (ran.status, ran.code, ran.stdout.strip(), ran.stderr) == ("exit", 0, "300000",
                                                                      "err\n")


def test_hooks_of_one_event_run_in_parallel(tmp_path: Path) -> None:
    from dsh_hooks import config
    from dsh_hooks.engine import Engine

    raw = {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": f"sleep 1; echo {i}"}
                                         for i in range(4)]}]}}
    settings = config.load(raw, "plugins.hooks", str(tmp_path))
    eng = Engine(settings, None, workspace=str(tmp_path))
    start = time.monotonic()
    answers = eng.fire("Stop", {"stop_hook_active": False})
    assert time.monotonic() - start < 2.5  # four one-second hooks, not four seconds
    assert [a.text for a in answers] == ["0", "1", "2", "3"]  # configuration order


def test_plugin_costs_nothing_without_hooks(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        from dsh.run.app import App
        app = App.from_config({{"model": "echo", "sessions_dir": {str(tmp_path)!r}}})
        assert "hooks" in [r.name for r in app.plugins], [r.name for r in app.plugins]
        result = app.run("hi")
        assert result.outcome == "completed"
        print(sorted(m for m in sys.modules if m.startswith("dsh_hooks")))
    """)
    env = {k: v for k, v in os.environ.items() if k != "DSH_LOAD_PLUGINS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['dsh_hooks']"  # the engine, runner and config were never imported


# ------------------------------------------------------------------ PreCompact


@pytest.mark.parametrize("veto", [True, False])
def test_compact_context_pre_compact_veto(tmp_path: Path, proj: Path, veto: bool) -> None:
    (proj / "big.txt").write_text("lorem ipsum dolor sit amet " * 80)
    log = ('python3 -c \'import json,sys,os; d=json.load(sys.stdin); '
           'open(os.environ["DSH_PROJECT_DIR"]+"/pc.log","a").write(d["trigger"]+"\\n")\'')
    command = log + ("; echo 'keep the whole history' >&2; exit 2" if veto else "")
    cfg = write_config(tmp_path, proj, hook("PreCompact", command, "auto"))
    cfg.write_text('compaction = "mask"\ncontext_window = 6000\ncompact_at = 0.5\n'
                   + cfg.read_text())
    read = {"name": "read_file", "arguments": {"path": "big.txt"}}
    m = model(tmp_path, {"tool_calls": [read, read, read]}, {"text": "read it"},
              {"text": "second turn"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "read big.txt")
    assert r.returncode == 0, r.stderr
    sid = ledger(tmp_path)[0]["session"]
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "--session", sid, "and now?")
    assert r.returncode == 0, r.stderr
    assert (proj / "pc.log").read_text().split()[0] == "auto"
    compacted = of(ledger(tmp_path), "context/compacted")
    if veto:
        assert compacted == []
        assert "vetoed an automatic compaction (threshold): keep the whole history" in r.stderr
    else:
        assert compacted and compacted[0]["reason"] == "threshold"


def test_a_core_error_is_not_blamed_on_the_plugin(tmp_path: Path, proj: Path) -> None:
    """dsh names the plugin whose code is deepest in an error's traceback: dsh-hooks keeps
    no wrapper around the turn or the tool chain, so dsh's own errors stay its own."""
    cfg = write_config(tmp_path, proj, hook("Stop", "true"))
    m = model(tmp_path, {"error": "the provider is down", "status": 400})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "hi")
    assert r.returncode == 1 and "the provider is down" in r.stderr, r.stderr
    assert "plugin hooks" not in r.stderr


def test_subagent_stop_fires_for_a_child_run(tmp_path: Path, proj: Path) -> None:
    import tomli_w

    log = ("python3 -c 'import json,sys,os; d=json.load(sys.stdin); "
           "open(os.environ[\"DSH_PROJECT_DIR\"]+\"/stop.log\",\"a\")"
           ".write(d[\"hook_event_name\"]+\" \"+d[\"session_id\"]+\"\\n\")'")
    hooks = {**hook("Stop", log), **hook("SubagentStop", log)}
    m = model(tmp_path, {"tool_calls": [{"name": "ask_helper", "arguments": {"prompt": "hi"}}]},
              {"text": "done"})
    cfg = tmp_path / "dsh.toml"
    cfg.write_text(tomli_w.dumps({
        "sessions_dir": str(tmp_path / "sessions"), "agent": "lead",
        "plugins": {"hooks": {"hooks": hooks}},
        "agents": {"lead": {"model": m, "subagents": ["helper"]},
                   "helper": {"model": "echo", "description": "echoes"}},
    }))
    r = dsh(tmp_path, proj, cfg, "run", "go")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in (proj / "stop.log").read_text().splitlines()]
    assert [e for e, _ in rows] == ["SubagentStop", "Stop"]
    assert rows[0][1] != rows[1][1]  # the child's own session, then the lead's


def test_pre_execute_hook_decision_is_recorded_when_another_plugin_blocked_first(
        tmp_path: Path, proj: Path) -> None:
    """Every pre_execute implementation runs (docs/plugins.md): the warden example, loaded
    after dsh-hooks and so called first, blocks; the hook script still runs and its deny is
    recorded with who blocked first; the result names the warden, not the hook."""
    import tomli_w

    cfg = write_config(tmp_path, proj, hook("PreToolUse", script(proj, "rm_blocker.py"),
                                            "Bash"))
    data = __import__("tomllib").loads(cfg.read_text())
    data["load"] = ["dsh_warden"]
    data["plugins"]["dsh_warden"] = {"deny": ["run_command"]}
    cfg.write_text(tomli_w.dumps(data))
    m = model(tmp_path, bash_call("rm -rf victim"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-m", m, "go",
            env={"PYTHONPATH": os.pathsep.join([str(REPO / "docs" / "examples"), str(REPO)])})
    assert r.returncode == 0, r.stderr
    events = ledger(tmp_path)
    [res] = of(events, "tool/result")
    assert res["output"] == ("tool call blocked by dsh_warden: the warden denies run_command")
    [decision] = of(events, "x/dsh-hooks/decision")
    assert decision["data"]["decision"] == "deny"
    assert decision["data"]["already_blocked_by"] == "dsh_warden"
    assert "rm -rf is not allowed" in decision["data"]["reason"]
    assert len(of(events, "x/dsh_warden/refused")) == 1
    assert (proj / "victim" / "keep.txt").exists()
    consistent(events)
