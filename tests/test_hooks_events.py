"""plugins/dsh-hooks and issue 11: what a hook decided is in the ledger as plugin events
(``x/dsh-hooks/hook``, ``x/dsh-hooks/decision``), and a hook's wait ends with the run's
abort (``--timeout``, SIGTERM) — its process group killed at once, the ledger consistent
and resumable. Real ``dsh run`` subprocesses, real hook processes (tests/test_hooks_plugin.py
has the helpers and the protocol's example scripts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dsh.run.app import App
from tests import test_hooks_plugin as hp
from tests.test_hooks_plugin import SECRET
from tests.test_hooks_plugin import _require_installed  # noqa: F401 - autouse fixture
from tests.test_hooks_plugin import bash_call
from tests.test_hooks_plugin import consistent
from tests.test_hooks_plugin import dsh
from tests.test_hooks_plugin import hook
from tests.test_hooks_plugin import ledger
from tests.test_hooks_plugin import model
from tests.test_hooks_plugin import needs_jq
from tests.test_hooks_plugin import of
from tests.test_hooks_plugin import script
from tests.test_hooks_plugin import write_config


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    """The project with the protocol's example scripts (as tests/test_hooks_plugin.py's)."""
    root = tmp_path / "proj"
    (root / ".claude" / "hooks").mkdir(parents=True)
    for name, text in {"rm_blocker.py": hp.RM_BLOCKER, "rewrite.py": hp.REWRITE,
                       "prompt.py": hp.PROMPT_HOOK, "stop_once.sh": hp.STOP_ONCE}.items():
        path = root / ".claude" / "hooks" / name
        path.write_text(text)
        path.chmod(0o755)
    (root / "victim").mkdir()
    (root / "victim" / "keep.txt").write_text("keep me\n")
    return root


def hooks_events(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e["data"] for e in of(events, f"x/dsh-hooks/{name}")]


# ------------------------------------------------------------------ decisions as plugin events


def test_pre_tool_use_deny_is_recorded_as_plugin_events(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("PreToolUse", script(proj, "rm_blocker.py"), "Bash"))
    m = model(tmp_path, bash_call("rm -rf victim"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-m", m, "clean up")
    assert r.returncode == 0, r.stderr
    events = ledger(tmp_path)
    consistent(events)
    [call] = of(events, "tool/call")
    [ran] = hooks_events(events, "hook")
    assert ran["event"] == "PreToolUse" and ran["tool_name"] == "Bash"
    assert ran["tool_use_id"] == call["call_id"]
    assert (ran["status"], ran["exit"], ran["answer"]) == ("exit", 2, "block")
    assert "rm -rf is not allowed" in ran["reason"] and "rm_blocker.py" in ran["command"]
    [decision] = hooks_events(events, "decision")
    assert decision["decision"] == "deny" and decision["tool_use_id"] == call["call_id"]
    # recorded where it happened: after the tool call, before its result
    types = [e["type"] for e in events]
    assert (types.index("tool/call") < types.index("x/dsh-hooks/decision")
            < types.index("tool/result"))
    shown = dsh(tmp_path, proj, cfg, "sessions", "show", events[0]["session"])
    assert shown.returncode == 0, shown.stderr
    assert "x/dsh-hooks/decision" in shown.stdout and '"decision":"deny"' in shown.stdout
    assert "not installed" not in shown.stdout


def test_allow_and_rewrite_decisions_are_recorded(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("PreToolUse", script(proj, "rewrite.py"), "Bash"))
    m = model(tmp_path, bash_call("echo original"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    decisions = hooks_events(ledger(tmp_path), "decision")
    assert [d["decision"] for d in decisions] == ["rewrite", "allow"]
    assert decisions[0]["arguments"] == {"command": "echo rewritten"}
    assert decisions[1]["reason"] == "rewritten to a safe echo"
    assert decisions[1]["approval"] == "skipped"
    [ran] = hooks_events(ledger(tmp_path), "hook")
    assert ran["json"]["hookSpecificOutput"]["permissionDecision"] == "allow"


@needs_jq
def test_a_stop_hook_verdict_is_recorded(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("Stop", script(proj, "stop_once.sh")))
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "finish")
    assert r.returncode == 0, r.stderr
    events = ledger(tmp_path)
    ran = hooks_events(events, "hook")
    assert [(h["event"], h["answer"]) for h in ran] == [("Stop", "ok"), ("Stop", "ok")]
    assert ran[0]["json"] == {"decision": "block", "reason": "Run the tests before stopping"}
    assert "json" not in ran[1]  # the second time it let the turn stop
    [decision] = hooks_events(events, "decision")
    assert decision == {"event": "Stop", "decision": "continue",
                        "reason": "Run the tests before stopping",
                        "command": decision["command"], "source": decision["source"],
                        "stop_hook_active": False}


def test_a_timeout_and_a_prompt_block_are_recorded(tmp_path: Path, proj: Path) -> None:
    hooks = {**hook("PreToolUse", "sleep 30", "Bash", timeout=1),
             **hook("UserPromptSubmit", script(proj, "prompt.py"))}
    cfg = write_config(tmp_path, proj, hooks)
    m = model(tmp_path, bash_call("echo ran-anyway"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    ran = hooks_events(ledger(tmp_path), "hook")
    timed = [h for h in ran if h["event"] == "PreToolUse"]
    assert [(h["status"], h["answer"], h["exit"]) for h in timed] == [("timeout", "error", None)]
    assert timed[0]["reason"] == "timed out after 1s (killed)"
    assert 900 < timed[0]["duration_ms"] < 10_000
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "my password is hunter2")
    assert r.returncode == 4, r.stderr  # rejected
    files = sorted((tmp_path / "sessions").glob("*.jsonl"), key=os.path.getmtime)
    events = [json.loads(x) for x in files[-1].read_text().splitlines()]
    [decision] = hooks_events(events, "decision")
    assert decision["event"] == "UserPromptSubmit" and decision["decision"] == "block"
    assert "Security policy violation" in decision["reason"]


def test_hook_output_is_redacted_in_events(tmp_path: Path, proj: Path) -> None:
    """A secret a hook prints (here read from a file) is redacted in every event."""
    (proj / "leak.txt").write_text(SECRET)
    leak = ('k=$(cat "$DSH_PROJECT_DIR/leak.txt"); '
            'echo "{\\"decision\\": \\"block\\", \\"reason\\": \\"key $k\\"}"; '
            'echo "stderr $k" >&2')
    cfg = write_config(tmp_path, proj, hook("Stop", leak))
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 0, r.stderr
    [path] = (tmp_path / "sessions").glob("*.jsonl")
    text = path.read_text()
    assert SECRET not in text and "[redacted]" in text
    assert hooks_events(ledger(tmp_path), "decision")


def test_pre_compact_veto_is_recorded(tmp_path: Path, proj: Path) -> None:
    (proj / "big.txt").write_text("lorem ipsum dolor sit amet " * 80)
    cfg = write_config(tmp_path, proj, hook("PreCompact", "echo 'keep it all' >&2; exit 2",
                                            "auto"))
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
    events = ledger(tmp_path)
    assert of(events, "context/compacted") == []
    vetoes = [d for d in hooks_events(events, "decision") if d["decision"] == "veto"]
    assert vetoes and vetoes[0]["reason"] == "keep it all" and vetoes[0]["trigger"] == "auto"


# ------------------------------------------------------------------ the run's abort


SLEEPER = ('sleep 60 & echo $! >> "$DSH_PROJECT_DIR/pids"; echo $$ >> "$DSH_PROJECT_DIR/pids"; '
           "wait")


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (reaped by nobody in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def _pids(proj: Path, deadline: float) -> list[int]:
    while time.monotonic() < deadline:
        path = proj / "pids"
        if path.exists():
            pids = [int(x) for x in path.read_text().split()]
            if len(pids) == 2:
                return pids
        time.sleep(0.02)
    raise AssertionError("the hook never started")


def _resumes(tmp: Path, proj: Path, cfg: Path) -> None:
    """The ledger loads and the session resumes, in a new process and in-process."""
    events = ledger(tmp)
    consistent(events)
    sid = events[0]["session"]
    cfg = write_config(tmp, proj)  # the same sessions, no hook this time
    r = dsh(tmp, proj, cfg, "run", "-m", "echo", "--session", sid, "again")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "again"
    app = App.from_config(str(cfg))
    with app.session(session_id=sid) as s:
        assert s.send("once more").outcome == "completed"


@pytest.mark.parametrize("event", ["UserPromptSubmit", "PreToolUse"])
def test_run_timeout_kills_a_waiting_hook_at_once(tmp_path: Path, proj: Path,
                                                  event: str) -> None:
    cfg = write_config(tmp_path, proj, hook(event, SLEEPER, "Bash" if event == "PreToolUse"
                                            else None, timeout=120))
    m = model(tmp_path, bash_call("echo never"), {"text": "done"})
    start = time.monotonic()
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "--timeout", "2", "-m", m, "go")
    took = time.monotonic() - start
    assert took < 12, f"the run waited {took:.1f}s for its hook"
    assert r.returncode != 0 and "time limit reached (2s)" in r.stderr, r.stderr
    pids = [int(x) for x in (proj / "pids").read_text().split()]
    assert len(pids) == 2 and all(_gone(p) for p in pids)
    events = ledger(tmp_path)
    [ran] = [h for h in hooks_events(events, "hook") if h["event"] == event]
    assert ran["status"] == "aborted" and "time limit reached (2s)" in ran["reason"]
    assert of(events, "turn/end")[-1]["outcome"] == "aborted"
    assert not (proj / "never").exists()
    _resumes(tmp_path, proj, cfg)


def test_sigterm_kills_a_waiting_hook_promptly(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("PreToolUse", SLEEPER, "Bash", timeout=120))
    m = model(tmp_path, bash_call("echo never > never"), {"text": "done"})
    full = {**os.environ, "HOME": str(tmp_path / "home")}
    full.pop("DSH_LOAD_PLUGINS", None)
    (tmp_path / "home").mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "run", "--yes",
                             "-m", m, "go"], cwd=proj, env=full, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        pids = _pids(proj, time.monotonic() + 60)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert took < 5, f"dsh took {took:.1f}s to end after SIGTERM"
    assert proc.returncode != 0, err
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), "the hook's processes outlived the run"
    assert not (proj / "never").exists()
    events = ledger(tmp_path)
    assert [h["status"] for h in hooks_events(events, "hook")] == ["aborted"]
    [res] = of(events, "tool/result")
    assert res["status"] == "interrupted"
    _resumes(tmp_path, proj, cfg)


def test_the_hooks_own_timeout_still_holds_under_a_longer_run_timeout(tmp_path: Path,
                                                                      proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("UserPromptSubmit", SLEEPER, timeout=1))
    start = time.monotonic()
    r = dsh(tmp_path, proj, cfg, "run", "--timeout", "60", "-m", "echo", "go")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - start < 15
    assert r.stdout.strip() == "go"
    [ran] = hooks_events(ledger(tmp_path), "hook")
    assert ran["status"] == "timeout"


def test_events_are_recorded_when_the_plugin_is_loaded_by_module(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``load = ["dsh_hooks"]`` (no entry point, registered as ``dsh_hooks``): still
    ``x/dsh-hooks/…``, and no warning per hook."""
    import types

    from dsh.config.loader import config_from_dict
    from dsh.hookspecs import hookimpl

    def noop(x: int) -> int:
        """Do nothing."""
        return x

    @hookimpl
    def register_tools(register: Any) -> None:
        register(noop)

    mod = types.ModuleType("dsh_hooks_events_tools")
    mod.register_tools = register_tools  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod
    try:
        hooks = {"PreToolUse": [{"matcher": "noop", "hooks": [{"type": "command",
                                                               "command": "cat > /dev/null"}]}]}
        app = App(config_from_dict({
            "autoload": False, "load": [mod.__name__, "dsh_hooks"],
            "sessions_dir": str(tmp_path / "s"), "plugins": {"hooks": {"hooks": hooks}},
            "model": model(tmp_path, {"tool_calls": [{"name": "noop", "arguments": {"x": 1}}]},
                           {"text": "done"})}))
        result = app.run("go")
    finally:
        del sys.modules[mod.__name__]
    assert result.outcome == "completed", result.reason
    events = [json.loads(x) for x in result.path.read_text().splitlines()]
    assert [h["answer"] for h in hooks_events(events, "hook")] == ["ok"]
    assert "cannot record" not in capfd.readouterr().err
