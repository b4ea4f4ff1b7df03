"""Two writers on one session: one is refused with a clear error, nothing is interleaved or lost.

The writing run holds an exclusive ``flock`` on the ledger for as long as the session is open
(docs/architecture.md, "The ledger"). These tests race real ``dsh run --session`` processes,
and library sessions in threads, against one session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dsh.config.loader import config_from_dict
from dsh.core.errors import SessionInUse
from dsh.run.app import App

DSH = [sys.executable, "-m", "dsh"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text("autoload = false\n")
    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS")}
    e["DSH_CONFIG"] = str(config)
    return e


def dsh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


def ledger_lines(env: dict[str, str], sid: str) -> list[dict[str, Any]]:
    path = Path(env["DSH_HOME"]) / "sessions" / f"{sid}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_well_formed(events: list[dict[str, Any]]) -> None:
    """Strictly increasing seq without gaps; turns never overlap; every turn closed."""
    assert [e["seq"] for e in events] == list(range(len(events)))
    open_turn = None
    for e in events:
        if e["type"] == "turn/start":
            assert open_turn is None, f"turn {e['turn']} started inside turn {open_turn}"
            open_turn = e["turn"]
        elif e["type"] == "turn/end":
            assert e["turn"] == open_turn
            open_turn = None
        else:
            assert open_turn is not None, f"{e['type']} outside a turn"
    assert open_turn is None


def test_second_dsh_run_on_a_session_in_use_is_refused(env: dict[str, str],
                                                       tmp_path: Path) -> None:
    first = dsh(env, "run", "-m", "echo", "--json", "hello")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session"]
    path = Path(json.loads(first.stdout)["path"])
    # The scripted position is the number of assistant messages so far: 1, so response 1.
    script = tmp_path / "slow.json"
    script.write_text(json.dumps({"responses": [{"text": "unused"},
                                                {"text": "slow answer", "delay": 8}]}))
    slow = subprocess.Popen([*DSH, "run", "--session", sid, "-m", f"scripted:{script}",
                             "--events", "slow turn"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert slow.stdout is not None
        head = json.loads(slow.stdout.readline())  # printed once the session is open and locked
        assert (head["type"], head["session"], head["resumed"]) == ("session", sid, True)
        size = path.stat().st_size
        started = time.monotonic()
        second = dsh(env, "run", "--session", sid, "-m", "echo", "intruder")
        assert slow.poll() is None, "the test needs the first run still going"
        assert time.monotonic() - started < 30  # refused at once, not after waiting for the lock
        assert second.returncode == 1
        assert second.stdout == ""
        assert second.stderr.startswith("dsh: error: ")
        assert "in use" in second.stderr and sid in second.stderr
        assert len(second.stderr.splitlines()) == 1 and "Traceback" not in second.stderr
        assert path.stat().st_size >= size  # nothing cut, nothing rewritten
        rest, err = slow.communicate(timeout=60)
    finally:
        if slow.poll() is None:
            slow.kill()
        for pipe in (slow.stdout, slow.stderr):  # closed whatever failed, no ResourceWarning
            if pipe is not None and not pipe.closed:
                slow.communicate()
                break
    assert slow.returncode == 0, err
    result = json.loads(rest.splitlines()[-1])
    assert (result["outcome"], result["output"]) == ("completed", "slow answer")
    events = ledger_lines(env, sid)
    assert_well_formed(events)
    assert [e["type"] for e in events].count("turn/start") == 2
    assert events[-1]["type"] == "turn/end" and events[-1]["outcome"] == "completed"
    texts = [e["text"] for e in events if e["type"] == "user/message"]
    assert texts == ["hello", "slow turn"]  # the refused run wrote nothing
    # --json and --events report the refusal in their result too, with the same exit code.
    for flag in ("--json", "--events"):
        holder = App(config_from_dict({"autoload": False,
                                       "sessions_dir": str(path.parent)})).session(
            session_id=sid, model="echo")
        with holder:
            refused = dsh(env, "run", "--session", sid, "-m", "echo", flag, "intruder")
        assert refused.returncode == 1
        last = json.loads(refused.stdout.splitlines()[-1])
        assert last["outcome"] == "error" and "in use" in last["reason"]
    assert [e["text"] for e in ledger_lines(env, sid) if e["type"] == "user/message"] == [
        "hello", "slow turn"]


def test_racing_processes_each_get_the_lock_or_a_clear_refusal(env: dict[str, str],
                                                               tmp_path: Path) -> None:
    first = dsh(env, "run", "-m", "echo", "--json", "start")
    sid = json.loads(first.stdout)["session"]
    procs = [subprocess.Popen([*DSH, "run", "--session", sid, "-m", "echo", f"racer {i}"],
                              env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(6)]
    outcomes = {}
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=60)
        outcomes[i] = (p.returncode, out, err)
    winners = [i for i, (code, _, _) in outcomes.items() if code == 0]
    for i, (code, out, err) in outcomes.items():
        if code == 0:
            assert (out, err) == (f"racer {i}\n", "")
        else:
            assert code == 1 and out == "", err
            assert err == (f"dsh: error: session {sid} is in use by another process "
                           f"(lock held on {Path(env['DSH_HOME']) / 'sessions' / sid}.jsonl)\n")
    assert winners  # whoever is refused, someone got through
    events = ledger_lines(env, sid)
    assert_well_formed(events)
    texts = [e["text"] for e in events if e["type"] == "user/message"]
    assert texts[0] == "start"
    assert sorted(texts[1:]) == sorted(f"racer {i}" for i in winners)  # none lost, none extra


def test_threads_racing_on_one_session(tmp_path: Path) -> None:
    """Library sessions in threads: flock is per open file, so threads exclude each other too."""
    app = App(config_from_dict({"autoload": False, "sessions_dir": str(tmp_path / "s")}))
    sid = app.run("start", model="echo").session_id
    done: list[str] = []
    refused: list[str] = []
    other: list[BaseException] = []
    lock = threading.Lock()
    go = threading.Barrier(8)

    def worker(n: int) -> None:
        go.wait()
        for k in range(15):
            text = f"t{n}-{k}"
            try:
                result = app.run(text, model="echo", session=sid)
            except SessionInUse as exc:
                assert "in use" in str(exc) and sid in str(exc)
                with lock:
                    refused.append(text)
                continue
            except BaseException as exc:  # noqa: BLE001 - reported below
                with lock:
                    other.append(exc)
                continue
            assert result.outcome == "completed" and result.output == text
            with lock:
                done.append(text)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not other, other
    assert len(done) + len(refused) == 8 * 15
    assert done and refused  # both really happened: the race was real
    events = [json.loads(line) for line in
              (tmp_path / "s" / f"{sid}.jsonl").read_text().splitlines()]
    assert_well_formed(events)
    texts = [e["text"] for e in events if e["type"] == "user/message"]
    assert sorted(texts[1:]) == sorted(done)
    answers = [e["text"] for e in events if e["type"] == "assistant/message"]
    assert answers == texts  # each turn's answer directly follows its own question
