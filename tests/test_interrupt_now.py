"""Ctrl-C stops at once, and ``--timeout`` keeps what was streamed (docs/cli.md, "Ctrl-C").

The real ``dsh`` in subprocesses — on a pseudo-terminal (pexpect) for Ctrl-C during a
streamed answer — against a loopback OpenAI-compatible server that streams one chunk every
0.3 s for 30 s. The bounds are generous (the run must end long before the stream would);
nothing depends on the machine's speed.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_chunks
from tests.servers import openai_completion
from tests.servers import reconstruct

pexpect = pytest.importorskip("pexpect",
                              reason="pexpect is in the test extra: pip install -e '.[test]'")

WORDS = [f"word{i} " for i in range(100)]  # 100 chunks, 0.3 s apart: a 30 s answer
SLOW = 0.3


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


def _config(tmp: Path, server: ScriptedServer) -> Path:
    cfg = tmp / "dsh.toml"
    cfg.write_text(
        f'autoload = false\nmodel = "oa"\ncompaction = "off"\n'
        f'sessions_dir = "{tmp / "sessions"}"\n'
        f'[models.oa]\nadapter = "openai"\nmodel = "gpt-4o"\nbase_url = "{server.url}/v1"\n'
        'retries = 0\n')
    return cfg


def _env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("DSH_LOAD_PLUGINS", "DSH_CONFIG")}
    e.update(OPENAI_API_KEY="sk-test-interrupt", NO_COLOR="1")
    return e


def _slow_stream() -> Reply:
    return Reply(chunks=openai_chunks(text=WORDS), chunk_delay=SLOW)


def _ledger(tmp: Path) -> tuple[Path, list[dict[str, Any]]]:
    [path] = (tmp / "sessions").glob("*.jsonl")
    return path, [json.loads(line) for line in path.read_text().splitlines()]


def _dsh(cfg: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), *args],
                          capture_output=True, text=True, env=_env(), timeout=120,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def _spawn(cfg: Path, *args: str, cwd: Path) -> Any:
    # A person at a terminal: Ctrl-C is not ignored, even when the tests were started in the
    # background by a non-interactive shell (SIGINT ignored, and inherited).
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return pexpect.spawn(sys.executable, ["-m", "dsh", "--config", str(cfg), *args],
                             env=_env(), cwd=str(cwd), encoding="utf-8", timeout=60,
                             dimensions=(40, 200))
    finally:
        if before == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_one_ctrl_c_ends_a_streaming_answer_now_and_keeps_it(
        tmp_path: Path, server: ScriptedServer) -> None:
    cfg = _config(tmp_path, server)
    server.script(_slow_stream(), Reply(body=openai_completion("resumed fine")))
    child = _spawn(cfg, "run", "go", cwd=tmp_path)  # stdout is a terminal: it streams
    child.logfile_read = transcript = io.StringIO()
    child.expect("word3 ")
    pressed = time.monotonic()
    child.sendintr()
    child.expect("dsh: interrupted: stopping now")
    shown = transcript.getvalue()
    child.expect(pexpect.EOF, timeout=30)
    took = time.monotonic() - pressed
    child.close()
    assert child.exitstatus == 130, child.before
    assert took < 10, f"the run went on for {took:.1f}s after Ctrl-C (a 30 s stream)"
    # the answer so far is on the terminal, its line ended before the notice
    assert "word0 word1 word2 word3 " in shown
    assert shown.endswith("\r\n"), repr(shown[-80:])
    assert "word99" not in shown + child.before

    path, events = _ledger(tmp_path)
    answers = [e for e in events if e["type"] == "assistant/message"]
    assert len(answers) == 1
    kept = answers[0]["text"]
    assert answers[0]["stop_reason"] == "interrupted"
    assert kept.startswith("word0 word1 word2 word3 ") and "word99" not in kept
    assert kept.strip() in shown.replace("\r\n", "\n")  # recorded = shown, nothing more
    end = events[-1]
    assert (end["type"], end["outcome"]) == ("turn/end", "aborted")
    assert "interrupted" in end["reason"]

    shown_session = _dsh(cfg, "sessions", "show", path.stem, cwd=tmp_path)
    assert shown_session.returncode == 0, shown_session.stderr
    assert "word3" in shown_session.stdout

    again = _dsh(cfg, "run", "-c", "go on", cwd=tmp_path)
    assert (again.returncode, again.stdout) == (0, "resumed fine\n"), again.stderr
    sent = server.received[1].body["messages"]
    assert {"role": "assistant", "content": kept} in sent
    assert sent[-1] == {"role": "user", "content": "go on"}
    # what was sent is what the ledger rebuilds (C3)
    assert reconstruct(path)[1]["messages"] == sent


def test_ctrl_c_during_a_command_kills_its_process_group(tmp_path: Path) -> None:
    pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
    ws = tmp_path / "ws"
    ws.mkdir()
    naptime = f"31.{os.getpid() % 10}"  # marks the test's own sleep in /proc
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": f"sleep {naptime}"}}]},
        {"text": "never"}]}))
    sessions = tmp_path / "sessions"
    cfg = tmp_path / "dsh.toml"
    cfg.write_text(f'sessions_dir = {json.dumps(str(sessions))}\n'
                   f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\n'
                   'allow = ["sleep"]\n')
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "run", "--yes",
                             "--json", "-m", f"scripted:{script}", "go"], env=_env(), cwd=ws,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (sleeping := _processes(["sleep", naptime])):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        groups = {_pgid(pid) for pid in sleeping} - {None}
        pressed = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - pressed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert took < 10, f"dsh waited {took:.1f}s for the command after Ctrl-C"
    assert "Traceback" not in err
    assert _processes(["sleep", naptime]) == []
    assert groups and all(_group(g) == [] for g in groups)  # the whole group is gone
    result = json.loads(out)
    assert result["outcome"] == "aborted"
    [path] = sessions.glob("*.jsonl")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    [res] = [e for e in events if e["type"] == "tool/result"]
    assert res["status"] == "interrupted"
    assert events[-1]["type"] == "turn/end" and events[-1]["outcome"] == "aborted"


def _processes(argv: list[str]) -> list[int]:
    want = "\0".join(argv).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().rstrip(b"\0")
            state = _stat(entry)[0]
        except OSError:
            continue
        if cmdline == want and state != "Z":
            found.append(int(entry))
    return found


def _stat(pid: str) -> list[str]:
    """The fields of /proc/PID/stat after the command's name: state, ppid, pgrp, …"""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _group(pgid: int) -> list[int]:
    """The live processes of a process group (a zombie, dead and waiting for init to reap
    it, is not counted)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            fields = _stat(entry) if entry.isdigit() else None
        except OSError:
            continue
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_timeout_keeps_the_text_streamed_so_far(tmp_path: Path, server: ScriptedServer) -> None:
    cfg = _config(tmp_path, server)
    server.script(_slow_stream())
    started = time.monotonic()
    r = _dsh(cfg, "run", "--timeout", "1.5", "go", cwd=tmp_path)  # stdout a pipe
    assert time.monotonic() - started < 25
    assert r.returncode == 3, r.stderr
    assert r.stdout.startswith("word0 word1 ") and r.stdout.endswith("\n"), repr(r.stdout)
    assert "word99" not in r.stdout
    assert "time limit reached (1.5s)" in r.stderr
    _, events = _ledger(tmp_path)
    [answer] = [e for e in events if e["type"] == "assistant/message"]
    assert answer["stop_reason"] == "interrupted"
    assert answer["text"] == r.stdout[:-1]


def test_timeout_json_output_holds_the_partial_text(tmp_path: Path,
                                                    server: ScriptedServer) -> None:
    cfg = _config(tmp_path, server)
    server.script(_slow_stream())
    r = _dsh(cfg, "run", "--timeout", "1.5", "--json", "go", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    result = json.loads(r.stdout)  # stdout is the JSON object alone
    assert result["output"].startswith("word0 word1 ")
    assert "time limit reached (1.5s)" in result["reason"]
    _, events = _ledger(tmp_path)
    [answer] = [e for e in events if e["type"] == "assistant/message"]
    assert answer["text"] == result["output"]


def test_a_quick_second_ctrl_c_still_exits_130_and_the_session_loads(
        tmp_path: Path, server: ScriptedServer) -> None:
    """The first press may end the run before the second comes: the second is taken as part
    of the same interrupt (no KeyboardInterrupt while dsh closes), or aborts what still runs."""
    cfg = _config(tmp_path, server)
    server.script(_slow_stream())
    child = _spawn(cfg, "run", "go", cwd=tmp_path)
    child.expect("word2 ")
    child.sendintr()
    time.sleep(0.2)
    child.sendintr()
    child.expect(pexpect.EOF, timeout=30)
    child.close()
    assert child.exitstatus == 130 and child.signalstatus is None, child.before
    assert "Traceback" not in child.before
    path, events = _ledger(tmp_path)
    assert events[-1]["type"] == "turn/end" and events[-1]["outcome"] == "aborted"
    shown = _dsh(cfg, "sessions", "show", path.stem, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
