"""Sessions that know their directory and their model, and ids by their random part: ``-c``
continues the latest session of the current directory (``--any-dir``: of any), a resumed
session keeps its recorded model unless ``-m`` (one note when it changes), and ``1a0a61`` or
its last 4+ characters name ``20261202-060357.140-1a0a61``. Real ``dsh`` subprocesses."""

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
from tests.servers import openai_completion


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The isolated environment (conftest's DSH_HOME…), with a config choosing no model."""
    config = tmp_path / "dsh.toml"
    config.write_text("autoload = false\n")
    e = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    e.update(DSH_CONFIG=str(config), NO_COLOR="1")
    return e


def dsh(env: dict[str, str], cwd: Path, *args: str,
        input: str = "") -> subprocess.CompletedProcess[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "dsh", *args], env=env, cwd=cwd, input=input,
                          capture_output=True, text=True, timeout=60)


def scripted(tmp_path: Path, *texts: str) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"responses": [{"text": t} for t in texts]}))
    return f"scripted:{path}"


def sessions_dir(env: dict[str, str]) -> Path:
    return Path(env["DSH_HOME"]) / "sessions"


def lines(env: dict[str, str], sid: str) -> list[dict[str, Any]]:
    path = sessions_dir(env) / f"{sid}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def starts(env: dict[str, str], sid: str) -> list[dict[str, Any]]:
    return [d for d in lines(env, sid) if d["type"] == "turn/start"]


def run_json(env: dict[str, str], cwd: Path, *args: str) -> dict[str, Any]:
    proc = dsh(env, cwd, "run", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# -- the working directory --------------------------------------------------------------------


def test_the_working_directory_is_recorded_when_it_changes_and_resumes(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    sid = run_json(env, a, "-m", "echo", "one")["session"]
    run_json(env, a, "--session", sid, "two")  # a new process: the projection knows a
    run_json(env, b, "--session", sid, "three")
    cwds = [d.get("cwd") for d in starts(env, sid)]
    assert cwds == [os.path.realpath(a), None, os.path.realpath(b)]
    listed = json.loads(dsh(env, b, "sessions", "list", "--json").stdout)
    assert [(s["id"], s["cwd"]) for s in listed] == [(sid, os.path.realpath(a))]
    shown = dsh(env, b, "sessions", "show", sid)
    assert shown.stdout.splitlines()[0] == f"session {sid} · cwd {os.path.realpath(a)}"


def test_the_working_directory_never_reaches_the_model(env, tmp_path):
    here = tmp_path / "a-very-distinctive-directory-name"
    with ScriptedServer() as server:
        server.script(Reply(body=openai_completion("hello")))
        config = Path(env["DSH_CONFIG"])
        config.write_text(f'autoload = false\n[models."openai:gpt-4o-mini"]\n'
                          f'base_url = "{server.url}/v1"\nretries = 0\n')
        sid = run_json({**env, "OPENAI_API_KEY": "sk-test-0123456789"}, here, "-m",
                       "openai:gpt-4o-mini", "hi")["session"]
    (received,) = server.received
    assert b"a-very-distinctive-directory-name" not in received.raw
    assert starts(env, sid)[0]["cwd"] == os.path.realpath(here)  # recorded, not sent


def test_continue_picks_the_latest_session_of_this_directory(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    in_a = run_json(env, a, "-m", "echo", "in a")["session"]
    in_b = run_json(env, b, "-m", "echo", "in b")["session"]  # newer, elsewhere
    assert run_json(env, a, "-c", "again")["session"] == in_a
    assert run_json(env, b, "-c", "again")["session"] == in_b
    proc = dsh(env, tmp_path / "c", "run", "-c", "--json", "fresh")
    assert proc.returncode == 0, proc.stderr
    fresh = json.loads(proc.stdout)["session"]
    assert fresh not in (in_a, in_b)
    assert "no session of agent default in" in proc.stderr and "--any-dir" in proc.stderr
    # --any-dir and `latest`: the latest of any directory (the one just made in c)
    proc = dsh(env, a, "sessions", "path", "latest")
    assert proc.stdout.strip().endswith(f"{fresh}.jsonl")
    assert run_json(env, a, "-c", "--any-dir", "any")["session"] == fresh


def test_a_session_without_a_recorded_directory_is_found_only_with_any_dir(env, tmp_path):
    a = tmp_path / "a"
    sid = run_json(env, a, "-m", "echo", "old")["session"]
    path = sessions_dir(env) / f"{sid}.jsonl"
    old = [{k: v for k, v in d.items() if k != "cwd"} for d in lines(env, sid)]
    path.write_text("".join(json.dumps(d, separators=(",", ":")) + "\n"
                            for d in old))  # as an older dsh wrote it
    for index in (sessions_dir(env) / ".index").glob("*"):
        index.unlink()
    proc = dsh(env, a, "run", "-c", "--json", "new")
    new = json.loads(proc.stdout)["session"]
    assert new != sid and "no session of agent default in" in proc.stderr
    (sessions_dir(env) / f"{new}.jsonl").unlink()
    assert run_json(env, a, "-c", "--any-dir", "resumed")["session"] == sid
    assert [d.get("cwd") for d in starts(env, sid)] == [None, os.path.realpath(a)]
    listed = {s["id"]: s["cwd"] for s in json.loads(dsh(env, a, "sessions", "list",
                                                        "--json").stdout)}
    assert listed == {sid: os.path.realpath(a)}  # the first turn that names one
    assert run_json(env, a, "-c", "now found")["session"] == sid


def test_chat_continues_the_session_of_this_directory(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    in_a = run_json(env, a, "-m", "echo", "in a")["session"]
    run_json(env, b, "-m", "echo", "in b")
    proc = dsh(env, a, "chat", "-c", input="hello\n")
    assert proc.returncode == 0, proc.stderr
    assert len(starts(env, in_a)) == 2


def test_any_dir_needs_continue(env, tmp_path):
    for command in ("run", "chat"):
        proc = dsh(env, tmp_path, command, "--any-dir", *(["hi"] if command == "run" else []))
        assert proc.returncode == 2
        assert "--any-dir applies to -c/--continue" in proc.stderr


def test_store_latest_filters_on_the_directory(make_app, tmp_path, monkeypatch):
    app = make_app()
    made = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        made[name] = app.run("hi", model="echo").session_id
    assert app.store.latest(cwd=str(tmp_path / "a")) == made["a"]
    assert app.store.latest(cwd=str(tmp_path / "b")) == made["b"]
    assert app.store.latest(cwd=str(tmp_path / "nowhere")) is None
    assert app.store.latest() == made["b"]
    assert app.store.info(made["a"]).cwd == str(tmp_path / "a")


# -- the model of a resumed session -----------------------------------------------------------


def test_a_resumed_session_keeps_its_model(env, tmp_path):
    a = tmp_path / "a"
    model = scripted(tmp_path, "I am scripted", "still scripted", "scripted again")
    first = run_json(env, a, "-m", model, "My name is Zed")
    proc = dsh(env, a, "run", "-c", "--json", "What is my name?")
    assert proc.returncode == 0, proc.stderr
    second = json.loads(proc.stdout)
    assert (second["session"], second["model"], second["output"]) == (
        first["session"], model, "still scripted")
    assert "no model configured" not in proc.stderr  # the session's model answered
    third = run_json(env, a, "--session", first["session"], "again")
    assert third["output"] == "scripted again"
    assert [d.get("model") for d in starts(env, first["session"])] == [model, None, None]


def test_m_switches_a_resumed_session_with_one_note(env, tmp_path):
    a = tmp_path / "a"
    model = scripted(tmp_path, "scripted")
    sid = run_json(env, a, "-m", model, "hi")["session"]
    proc = dsh(env, a, "run", "-c", "-m", "echo", "switch")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "switch\n"
    notes = [line for line in proc.stderr.splitlines() if "continues on" in line]
    assert notes == [f"dsh: note: session {sid} continues on echo (was {model})"]
    # from now on the session runs on echo
    proc = dsh(env, a, "run", "-c", "echo again")
    assert (proc.stdout, "continues on" in proc.stderr) == ("echo again\n", False)


def test_a_recorded_model_that_cannot_be_built_asks_for_m(env, tmp_path):
    a = tmp_path / "a"
    sid = run_json(env, a, "-m", "echo", "hi")["session"]
    path = sessions_dir(env) / f"{sid}.jsonl"
    text = path.read_text().replace('"model":"echo"', '"model":"nosuch:model"')
    text = text.replace('"model": "echo"', '"model": "nosuch:model"')
    path.write_text(text)
    proc = dsh(env, a, "run", "--session", sid, "hi")
    assert proc.returncode == 2
    assert "nosuch:model" in proc.stderr and "-m MODEL" in proc.stderr
    proc = dsh(env, a, "run", "--session", sid, "-m", "echo", "hi")
    assert proc.returncode == 0, proc.stderr


# -- the short form of an id ------------------------------------------------------------------


def _copy_as(env: dict[str, str], sid: str, new: str) -> None:
    """A copy of session ``sid``'s ledger under id ``new``."""
    out = [{**d, "session": new} for d in lines(env, sid)]
    (sessions_dir(env) / f"{new}.jsonl").write_text(
        "".join(json.dumps(d, separators=(",", ":")) + "\n" for d in out))


def test_the_random_part_of_an_id_and_its_last_characters_resolve(env, tmp_path):
    sid = run_json(env, tmp_path, "-m", "echo", "hello")["session"]
    short = sid.rpartition("-")[2]
    for text in (short, short[-5:], short[-4:]):
        proc = dsh(env, tmp_path, "sessions", "path", text)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().endswith(f"{sid}.jsonl")
    assert run_json(env, tmp_path, "--session", short, "again")["session"] == sid
    proc = dsh(env, tmp_path, "sessions", "show", short[-4:])
    assert proc.returncode == 0 and "hello" in proc.stdout
    proc = dsh(env, tmp_path, "sessions", "path", short[-3:])  # too short to be one
    assert proc.returncode == 2


def test_an_ambiguous_short_form_names_the_candidates(env, tmp_path):
    sid = run_json(env, tmp_path, "-m", "echo", "hello")["session"]
    other = "20200101-000000.000-ff" + sid[-4:]
    _copy_as(env, sid, other)
    proc = dsh(env, tmp_path, "sessions", "path", sid[-4:])
    assert proc.returncode == 2
    assert "ambiguous" in proc.stderr and sid in proc.stderr and other in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # the longer form tells them apart
    proc = dsh(env, tmp_path, "sessions", "path", sid.rpartition("-")[2])
    assert proc.returncode == 0 and sid in proc.stdout


def test_both_ways_of_folding_a_ledger_keep_the_directory():
    """Resuming folds lines straight from their JSON (``apply_raw``), reading folds events:
    both know the directory last recorded, so an unchanged one is not written again."""
    from dsh.ledger.events import TurnStarted
    from dsh.ledger.history import Projection
    from dsh.ledger.serialize import default_codec
    from dsh.ledger.serialize import dump_event

    events = [TurnStarted(seq=0, ts="t", session="s", turn=1, agent="a", model="echo",
                          cwd="/home/me/app"),
              TurnStarted(seq=1, ts="t", session="s", turn=2, agent="a")]
    folded, raw = Projection(), Projection()
    for event in events:
        line = dump_event(event)
        assert ('"cwd"' in line) == (event.cwd is not None)  # absent when unchanged
        folded.apply(default_codec().load(line.encode()))
        raw.apply_raw(json.loads(line))
    assert folded.cwd == raw.cwd == "/home/me/app"
    from dsh.ledger.serialize import InvalidLine

    with pytest.raises(InvalidLine):  # a directory that is not text is a bad line
        Projection().apply_raw({**json.loads(dump_event(events[0])), "cwd": 5})
