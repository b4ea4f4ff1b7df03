"""Sessions form a tree: ``dsh sessions fork`` and ``dsh sessions rewind [--files]``.

Real ``dsh`` subprocesses; the byte-identity check against a real loopback HTTP server that
keeps each request's bytes as they arrived (tests/servers.py); the files rewound are written
by dsh-shell's real tools, driven by the scripted model."""

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

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "DSH_CONFIG")}
    e.update(OPENAI_API_KEY="sk-test-fork", PYTHONPATH=str(REPO))
    return e


def _dsh(cfg: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), *args],
                          capture_output=True, text=True, env=_env(), timeout=120,
                          stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ScriptedServer() as s:
        yield s


def _server_config(tmp: Path, server: ScriptedServer) -> Path:
    cfg = tmp / "dsh.toml"
    cfg.write_text(
        f'autoload = false\nmodel = "oa"\ncompaction = "off"\n'
        f'sessions_dir = "{tmp / "sessions"}"\n'
        f'[models.oa]\nadapter = "openai"\nmodel = "gpt-4o"\nbase_url = "{server.url}/v1"\n'
        'retries = 0\n')
    return cfg


def test_a_fork_at_turn_2_sends_the_parents_turn_3_request_byte_for_byte(
        tmp_path: Path, server: ScriptedServer) -> None:
    cfg = _server_config(tmp_path, server)
    server.script(*(Reply(body=openai_completion(f"answer {i}")) for i in range(1, 6)))
    first = _dsh(cfg, "run", "--json", "turn one")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session"]
    for text in ("turn two", "turn three", "turn four"):
        done = _dsh(cfg, "run", "-m", "oa", "--session", sid, text)
        assert done.returncode == 0, done.stderr
    parent_turn3 = server.received[2].raw

    forked = _dsh(cfg, "sessions", "fork", sid, "--at", "2")
    assert forked.returncode == 0, forked.stderr
    new = forked.stdout.strip()
    assert new != sid and f"forked {sid} at turn 2 as {new}" in forked.stderr
    lines = _lines(tmp_path / "sessions" / f"{new}.jsonl")
    assert lines[0]["type"] == "session/fork"
    assert (lines[0]["parent"], lines[0]["turn"]) == (sid, 2)
    assert [d["seq"] for d in lines] == list(range(len(lines)))
    assert {d["session"] for d in lines} == {new}
    assert max(d.get("turn", 0) for d in lines if d["type"] == "turn/start") == 2

    again = _dsh(cfg, "run", "-m", "oa", "--session", new, "turn three")
    assert again.returncode == 0, again.stderr
    assert server.received[4].raw == parent_turn3  # the same bytes on the wire
    # the parent is untouched, and the fork keeps going without it
    assert len(_lines(tmp_path / "sessions" / f"{sid}.jsonl")) > len(lines)
    assert _dsh(cfg, "sessions", "rm", sid).returncode == 0
    shown = _dsh(cfg, "sessions", "show", new)
    assert shown.returncode == 0, shown.stderr
    assert "turn three" in shown.stdout and "turn four" not in shown.stdout


def _echo_config(tmp: Path) -> Path:
    cfg = tmp / "echo.toml"
    cfg.write_text(f'autoload = false\nmodel = "echo"\nsessions_dir = "{tmp / "sessions"}"\n')
    return cfg


def _session(cfg: Path, turns: int) -> str:
    done = _dsh(cfg, "run", "--json", "message 1")
    assert done.returncode == 0, done.stderr
    sid = str(json.loads(done.stdout)["session"])
    for i in range(2, turns + 1):
        assert _dsh(cfg, "run", "--session", sid, f"message {i}").returncode == 0
    return sid


def test_forks_at_zero_past_the_end_of_forks_and_of_a_torn_parent(tmp_path: Path) -> None:
    cfg = _echo_config(tmp_path)
    sid = _session(cfg, 3)
    sessions = tmp_path / "sessions"

    zero = _dsh(cfg, "sessions", "fork", sid, "--at", "0")
    assert zero.returncode == 0, zero.stderr
    assert [d["type"] for d in _lines(sessions / f"{zero.stdout.strip()}.jsonl")] == [
        "session/fork"]
    resumed = _dsh(cfg, "run", "--session", zero.stdout.strip(), "fresh start")
    assert resumed.returncode == 0 and resumed.stdout.strip() == "fresh start", resumed.stderr

    past = _dsh(cfg, "sessions", "fork", sid, "--at", "4")
    assert past.returncode == 2
    assert "has 3 turns: there is no turn 4" in past.stderr and not past.stdout
    assert sorted(p.name for p in sessions.iterdir() if p.name.endswith(".tmp")) == []

    # a fork of a fork: its parent is the first fork
    one = _dsh(cfg, "sessions", "fork", sid, "--at", "2").stdout.strip()
    two = _dsh(cfg, "sessions", "fork", one, "--at", "1")
    assert two.returncode == 0, two.stderr
    head = _lines(sessions / f"{two.stdout.strip()}.jsonl")
    assert (head[0]["parent"], head[0]["turn"]) == (one, 1)
    assert [d["text"] for d in head if d["type"] == "user/message"] == ["message 1"]

    # a torn last line (a crash mid-write) is left out of the fork; the parent is not touched
    path = sessions / f"{sid}.jsonl"
    with path.open("ab") as f:
        f.write(b'{"v":1,"type":"turn/start","seq":99,')
    size = path.stat().st_size
    torn = _dsh(cfg, "sessions", "fork", sid)
    assert torn.returncode == 0, torn.stderr
    copied = _lines(sessions / f"{torn.stdout.strip()}.jsonl")
    assert len(copied) == len(path.read_bytes().splitlines())  # the fork line + every whole one
    assert path.stat().st_size == size


def test_a_session_being_written_forks_from_the_lines_written_so_far(
        tmp_path: Path, server: ScriptedServer) -> None:
    cfg = _server_config(tmp_path, server)
    server.script(Reply(body=openai_completion("first")),
                  Reply(body=openai_completion("late"), delay=60))
    done = _dsh(cfg, "run", "--json", "one")
    sid = json.loads(done.stdout)["session"]
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "run",
                             "--session", sid, "two"], env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(server.received) < 2:  # turn 2 is waiting for its answer: the lock is held
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        forked = _dsh(cfg, "sessions", "fork", sid, "--at", "1")
        assert forked.returncode == 0, forked.stderr
        whole = _dsh(cfg, "sessions", "fork", sid)  # the open turn 2 is copied as it stands
        assert whole.returncode == 0, whole.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    server.script(Reply(body=openai_completion("resumed")))
    new = whole.stdout.strip()
    resumed = _dsh(cfg, "run", "-m", "oa", "--session", new, "three")
    assert resumed.returncode == 0, resumed.stderr
    types = [d["type"] for d in _lines(tmp_path / "sessions" / f"{new}.jsonl")]
    assert types.count("turn/end") == 3  # the open turn closed (aborted) on resume, then turn 3


def test_a_fork_killed_half_way_leaves_no_half_a_session(tmp_path: Path) -> None:
    cfg = _echo_config(tmp_path)
    sid = _session(cfg, 1)
    sessions = tmp_path / "sessions"
    path = sessions / f"{sid}.jsonl"
    # a long parent (a plugin's events), so that the kill lands while the fork is written
    lines = path.read_text().splitlines()
    seq = len(lines)
    with path.open("a") as f:
        for i in range(40000):
            f.write(json.dumps({"v": 1, "type": "x/test/note", "seq": seq + i,
                                "ts": "2026-12-03T00:00:00.000Z", "session": sid,
                                "data": {"n": i}}, separators=(",", ":")) + "\n")
    before = set(os.listdir(sessions))
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "sessions",
                             "fork", sid], env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while (proc.poll() is None and time.monotonic() < deadline
           and not any(n.endswith(".tmp") for n in os.listdir(sessions))):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    made = {n for n in set(os.listdir(sessions)) - before if n.endswith(".jsonl")}
    if proc.returncode == -signal.SIGKILL:
        assert made == set()  # killed while writing: no session appeared
    for name in made:  # it finished before the kill landed: then the fork is whole
        assert len(_lines(sessions / name)) == seq + 40000 + 1
    listed = _dsh(cfg, "sessions", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {s["id"] for s in json.loads(listed.stdout)} == {sid} | {n[:-6] for n in made}


# -- rewind --files --------------------------------------------------------------------------


def _shell_config(tmp: Path, ws: Path) -> Path:
    cfg = tmp / "shell.toml"
    cfg.write_text(f'sessions_dir = "{tmp / "sessions"}"\n'
                   f'[plugins.shell]\nworkspace = "{ws}"\n')
    return cfg


def _edits(tmp: Path, ws: Path) -> tuple[Path, str]:
    """A 3-turn session: turn 1 creates notes.txt, turn 2 edits it and creates extra.txt,
    turn 3 edits notes.txt again and moves extra.txt to moved.txt."""
    script = tmp / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "write_file",
                         "arguments": {"path": "notes.txt", "content": "one\n"}}]},
        {"text": "created"},
        {"tool_calls": [{"name": "edit_file",
                         "arguments": {"path": "notes.txt", "old": "one", "new": "two"}},
                        {"name": "write_file",
                         "arguments": {"path": "extra.txt", "content": "extra\n"}}]},
        {"text": "edited"},
        {"tool_calls": [{"name": "edit_file",
                         "arguments": {"path": "notes.txt", "old": "two", "new": "three"}},
                        {"name": "apply_patch", "arguments": {"patch": "\n".join((
                            "*** Begin Patch", "*** Update File: extra.txt",
                            "*** Move to: moved.txt", "@@", "-extra", "+moved",
                            "*** End Patch"))}}]},
        {"text": "again"},
    ]}))
    cfg = _shell_config(tmp, ws)
    model = f"scripted:{script}"
    first = _dsh(cfg, "run", "-m", model, "--mode", "auto-edit", "--json", "make notes",
                 cwd=ws)
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session"]
    for text in ("edit them", "edit again"):
        done = _dsh(cfg, "run", "-m", model, "--mode", "auto-edit", "--session", sid, text,
                    cwd=ws)
        assert done.returncode == 0, done.stderr
    assert (ws / "notes.txt").read_text() == "three\n"
    assert (ws / "moved.txt").read_text() == "moved\n" and not (ws / "extra.txt").exists()
    return cfg, sid


def test_rewind_files_puts_back_what_the_later_turns_changed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg, sid = _edits(tmp_path, ws)

    dry = _dsh(cfg, "sessions", "rewind", sid, "--to", "1", "--files", "--dry-run", cwd=ws)
    assert dry.returncode == 0, dry.stderr
    assert "would be restored: notes.txt" in dry.stderr and not dry.stdout
    assert (ws / "notes.txt").read_text() == "three\n"

    done = _dsh(cfg, "sessions", "rewind", sid, "--to", "1", "--files", cwd=ws)
    assert done.returncode == 0, done.stderr
    assert (ws / "notes.txt").read_text() == "one\n"
    assert not (ws / "extra.txt").exists() and not (ws / "moved.txt").exists()
    assert "removed: moved.txt" in done.stderr
    new = done.stdout.strip()
    head = _lines(tmp_path / "sessions" / f"{new}.jsonl")[0]
    assert (head["type"], head["parent"], head["turn"], head["reason"]) == (
        "session/fork", sid, 1, "rewind")

    # the files are at turn 1 now, not what turn 3 left: rewinding turn 3 again is refused
    again = _dsh(cfg, "sessions", "rewind", sid, "--to", "2", "--files", cwd=ws)
    assert again.returncode == 2
    assert ("cannot rewind moved.txt (changed in turn 3): it is not there any more; "
            "nothing was restored") in again.stderr
    assert (ws / "notes.txt").read_text() == "one\n"


@pytest.mark.parametrize("meddle", ["edit", "delete", "rename"])
def test_rewind_files_refuses_a_file_changed_outside_dsh(tmp_path: Path, meddle: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg, sid = _edits(tmp_path, ws)
    if meddle == "edit":
        (ws / "notes.txt").write_text("three\nmine\n")
    elif meddle == "delete":
        (ws / "notes.txt").unlink()
    else:
        (ws / "notes.txt").rename(ws / "renamed.txt")
    before = {p.name: p.read_bytes() for p in ws.iterdir()}
    sessions = set(os.listdir(tmp_path / "sessions"))
    done = _dsh(cfg, "sessions", "rewind", sid, "--to", "0", "--files", cwd=ws)
    assert done.returncode == 2
    assert "cannot rewind notes.txt" in done.stderr and "nothing was restored" in done.stderr
    assert {p.name: p.read_bytes() for p in ws.iterdir()} == before  # nothing written
    assert set(os.listdir(tmp_path / "sessions")) == sessions  # and no fork made
    # without --files the conversation still rewinds, the files are left as they are
    plain = _dsh(cfg, "sessions", "rewind", sid, "--to", "0", cwd=ws)
    assert plain.returncode == 0, plain.stderr
    assert {p.name: p.read_bytes() for p in ws.iterdir()} == before


def test_rewind_files_never_writes_outside_the_workspace(tmp_path: Path) -> None:
    """A ledger line naming ``../x`` (a hostile plugin's change record) is refused by the one
    file API, not followed."""
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg, sid = _edits(tmp_path, ws)
    path = tmp_path / "sessions" / f"{sid}.jsonl"
    text = path.read_text().replace('"path":"moved.txt"', '"path":"../escaped.txt"').replace(
        '"moved_to":"moved.txt"', '"moved_to":"../escaped.txt"')
    path.write_text(text)
    (tmp_path / "escaped.txt").write_text("moved\n")
    done = _dsh(cfg, "sessions", "rewind", sid, "--to", "2", "--files", cwd=ws)
    assert done.returncode != 0
    assert (tmp_path / "escaped.txt").read_text() == "moved\n"
    assert not (tmp_path / "extra.txt").exists()


def test_a_fork_keeps_a_compaction_before_its_point_and_rewinds_past_one(
        tmp_path: Path, server: ScriptedServer) -> None:
    cfg = _server_config(tmp_path, server)
    long = "word " * 400
    server.script(*(Reply(body=openai_completion(f"{long} answer {i}")) for i in range(1, 6)))
    first = _dsh(cfg, "run", "--json", f"{long} one")
    sid = json.loads(first.stdout)["session"]
    assert _dsh(cfg, "run", "-m", "oa", "--session", sid, f"{long} two").returncode == 0
    compacted = _dsh(cfg, "sessions", "compact", sid, "--strategy", "truncate")
    assert compacted.returncode == 0 and "compacted" in compacted.stderr, compacted.stderr
    assert _dsh(cfg, "run", "-m", "oa", "--session", sid, "three").returncode == 0
    parent_turn3 = server.received[2].raw

    at2 = _dsh(cfg, "sessions", "fork", sid, "--at", "2").stdout.strip()
    types = [d["type"] for d in _lines(tmp_path / "sessions" / f"{at2}.jsonl")]
    assert "context/compacted" in types  # made between turns 2 and 3: before the fork point
    assert _dsh(cfg, "run", "-m", "oa", "--session", at2, "three").returncode == 0
    assert server.received[3].raw == parent_turn3

    at1 = _dsh(cfg, "sessions", "rewind", sid, "--to", "1")
    assert at1.returncode == 0, at1.stderr
    types = [d["type"] for d in _lines(tmp_path / "sessions" / f"{at1.stdout.strip()}.jsonl")]
    assert "context/compacted" not in types  # rewound past it: the whole history again
    assert _dsh(cfg, "run", "-m", "oa", "--session", at1.stdout.strip(), f"{long} two"
                ).returncode == 0
    assert server.received[4].raw == server.received[1].raw  # the parent's turn-2 request


def test_a_fork_killed_mid_turn_resumes_with_its_fork_line(
        tmp_path: Path, server: ScriptedServer) -> None:
    cfg = _server_config(tmp_path, server)
    server.script(Reply(body=openai_completion("first")),
                  Reply(body=openai_completion("late"), delay=60),
                  Reply(body=openai_completion("after")))
    sid = json.loads(_dsh(cfg, "run", "--json", "one").stdout)["session"]
    new = _dsh(cfg, "sessions", "fork", sid).stdout.strip()
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "run",
                             "-m", "oa", "--session", new, "two"], env=_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(server.received) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    again = _dsh(cfg, "run", "-m", "oa", "--session", new, "three")
    assert again.returncode == 0 and again.stdout.strip() == "after", again.stderr
    lines = _lines(tmp_path / "sessions" / f"{new}.jsonl")
    assert lines[0]["type"] == "session/fork" and lines[0]["parent"] == sid
    assert [d["seq"] for d in lines] == list(range(len(lines)))
    assert [d["outcome"] for d in lines if d["type"] == "turn/end"] == [
        "completed", "aborted", "completed"]


def test_chat_fork_and_rewind_go_on_in_a_fork_and_show_names_the_tree(tmp_path: Path) -> None:
    cfg = _echo_config(tmp_path)
    chat = subprocess.run(
        [sys.executable, "-m", "dsh", "--config", str(cfg), "chat"],
        input="one\ntwo\nthree\n/rewind 1\nfour\n/fork\nfive\n/rewind x\n/fork 99\n",
        capture_output=True, text=True, env=_env(), timeout=120, start_new_session=True)
    assert chat.returncode == 0, chat.stderr
    out = chat.stdout + chat.stderr
    assert "usage: /rewind N [--files]" in out and "there is no turn 99" in out
    sessions = tmp_path / "sessions"
    by_first: dict[str, list[dict[str, Any]]] = {}
    for path in sessions.glob("*.jsonl"):
        by_first[path.stem] = _lines(path)
    assert len(by_first) == 3
    (original,) = [s for s, lines in by_first.items() if lines[0]["type"] != "session/fork"]
    (rewound,) = [s for s, lines in by_first.items() if lines[0].get("parent") == original]
    (forked,) = [s for s, lines in by_first.items() if lines[0].get("parent") == rewound]

    def texts(sid: str) -> list[str]:
        return [d["text"] for d in by_first[sid] if d["type"] == "user/message"]

    assert texts(original) == ["one", "two", "three"]  # the original is never written again
    assert texts(rewound) == ["one", "four"]
    assert texts(forked) == ["one", "four", "five"]
    assert by_first[rewound][0]["reason"] == "rewind"

    shown = _dsh(cfg, "sessions", "show", rewound)
    assert shown.returncode == 0, shown.stderr
    assert f"rewound from {original} at turn 1" in shown.stdout
    assert f"forks: {forked}" in shown.stdout
    tree = _dsh(cfg, "sessions", "list", "--tree", "--json")
    depth = {d["id"]: d["depth"] for d in json.loads(tree.stdout)}
    assert (depth[original], depth[rewound], depth[forked]) == (0, 1, 2)


def test_run_fork_continues_in_a_new_fork(tmp_path: Path) -> None:
    cfg = _echo_config(tmp_path)
    sid = _session(cfg, 2)
    done = _dsh(cfg, "run", "--json", "--fork", sid[-6:], "three")
    assert done.returncode == 0, done.stderr
    new = json.loads(done.stdout)["session"]
    assert new != sid and f"forked {sid} as {new}" in done.stderr
    lines = _lines(tmp_path / "sessions" / f"{new}.jsonl")
    assert [d["text"] for d in lines if d["type"] == "user/message"] == [
        "message 1", "message 2", "three"]
    assert len([d for d in _lines(tmp_path / "sessions" / f"{sid}.jsonl")
                if d["type"] == "user/message"]) == 2
    for bad in (("-c",), ("--session", sid), ("--no-save",)):
        refused = _dsh(cfg, "run", "--fork", sid, *bad, "x")
        assert refused.returncode == 2, refused.stderr
        assert "--fork" in refused.stderr or "--no-save cannot" in refused.stderr
    assert len(list((tmp_path / "sessions").glob("*.jsonl"))) == 2  # no fork made for those


def test_rewind_files_with_root_restores_a_configured_workspace(tmp_path: Path) -> None:
    """The tools worked on ``[plugins.shell] workspace``; dsh ran elsewhere: ``--root``
    names the folder the recorded paths are relative to."""
    ws = tmp_path / "ws"
    ws.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "write_file",
                         "arguments": {"path": "notes.txt", "content": "one\n"}}]},
        {"text": "created"}]}))
    cfg = _shell_config(tmp_path, ws)
    done = _dsh(cfg, "run", "-m", f"scripted:{script}", "--mode", "auto-edit", "--json",
                "make notes", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    sid = json.loads(done.stdout)["session"]
    assert (ws / "notes.txt").read_text() == "one\n"
    (elsewhere / "notes.txt").write_text("not dsh's\n")  # the recorded cwd holds another file
    refused = _dsh(cfg, "sessions", "rewind", sid, "--to", "0", "--files", cwd=elsewhere)
    assert refused.returncode == 2 and "notes.txt" in refused.stderr
    assert (elsewhere / "notes.txt").read_text() == "not dsh's\n"
    back = _dsh(cfg, "sessions", "rewind", sid, "--to", "0", "--files", "--root", str(ws))
    assert back.returncode == 0, back.stderr
    assert not (ws / "notes.txt").exists() and (elsewhere / "notes.txt").exists()
    assert _dsh(cfg, "sessions", "rewind", sid, "--to", "0", "--root", str(ws)).returncode == 2
