"""Every failure is one clear line, and nothing is lost (issue 9, section 5).

Real ``python -m dsh`` subprocesses for what the command line does — FIFOs and directories in
the sessions folder, a ledger another user made, stdout on ``/dev/full``, a full file system,
``--events | head -1``, the sessions folder deleted during a run, invalid Unicode from the
model and from argv — and the ledger's loading rules (seq continuity, ids, nesting) on real
files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.core.errors import LedgerError
from dsh.core.errors import UsageError
from dsh.core.sanitize import StreamText
from dsh.core.sanitize import clean_text
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.store import JsonlStore
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion

DSH = [sys.executable, "-m", "dsh"]

TOOLS_PLUGIN = '''
import os, shutil
from dsh import hookimpl

@hookimpl
def register_tools(register):
    def wipe_sessions() -> str:
        """Delete the sessions folder (as `rm -rf` in another terminal would)."""
        shutil.rmtree(os.path.join(os.environ["DSH_HOME"], "sessions"))
        return "deleted"

    def shape(value: list) -> str:
        """Accept anything."""
        return "ok"

    register(wipe_sessions)
    register(shape)
'''


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "dshfail_tools.py").write_text(TOOLS_PLUGIN)
    config = tmp_path / "dsh.toml"
    config.write_text('autoload = false\nload = ["dshfail_tools"]\n')
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")}
    e.update(DSH_CONFIG=str(config), PYTHONPATH=str(plugins), DSH_HOME=str(tmp_path / "home"))
    return e


def sessions_dir(env: dict[str, str]) -> Path:
    return Path(env["DSH_HOME"]) / "sessions"


def run(env: dict[str, str], *args: str | bytes, stdout: Any = subprocess.PIPE,
        timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*DSH, *args], env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                          stderr=subprocess.PIPE, timeout=timeout)


def err_lines(proc: subprocess.CompletedProcess[bytes]) -> list[str]:
    text = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in text, text
    return [ln for ln in text.splitlines() if ln.strip()]


def one_error(proc: subprocess.CompletedProcess[bytes], code: int, *words: str) -> str:
    """The process failed with ``code`` and said so in one ``dsh: error:`` line."""
    lines = err_lines(proc)
    errors_ = [ln for ln in lines if ln.startswith("dsh: error:")]
    assert proc.returncode == code, (proc.returncode, lines)
    assert len(errors_) == 1, lines
    for word in words:
        assert word in errors_[0], errors_[0]
    return errors_[0]


def make_session(store: JsonlStore, sid: str, prompt: str = "hello", agent: str = "default"
                 ) -> Path:
    with store.create(sid) as ledger:
        ledger.append(TurnStarted, turn=1, agent=agent, model="echo")
        ledger.append(StepStarted, turn=1, step=0)
        ledger.append(UserMessage, text=prompt)
        ledger.append(AssistantMessage, text=prompt)
        ledger.append(StepEnded, turn=1, step=0)
        ledger.append(TurnEnded, turn=1, outcome="completed")
    return store.path(sid)


def ledger_types(path: Path) -> list[str]:
    return [json.loads(line)["type"] for line in path.read_bytes().splitlines()]


OLD = "20260101-000000.000-aaaaaa"
MID = "20260102-000000.000-bbbbbb"
NEW = "20990101-000000.000-ffffff"


# -- the sessions folder holds things that are not ledgers ---------------------------------


def _odd_entry(directory: Path, kind: str) -> Path:
    path = directory / f"{NEW}.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.touch()
    return path


@pytest.mark.parametrize("kind", ["fifo", "directory", "empty"])
def test_sessions_list_lists_every_readable_session_and_names_what_it_skipped(
        env: dict[str, str], kind: str) -> None:
    store = JsonlStore(sessions_dir(env))
    make_session(store, OLD, "older prompt")
    make_session(store, MID, "middle prompt")
    odd = _odd_entry(sessions_dir(env), kind)
    for args in (("sessions", "list"), ("sessions", "list", "--json")):
        proc = run(env, *args, timeout=15)  # a FIFO used to hang here, on open
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout.decode()
        assert OLD in out and MID in out and NEW not in out
        lines = err_lines(proc)
        assert len(lines) == 1 and lines[0].startswith("dsh: warning: skipped:"), lines
        assert str(odd) in lines[0]
        reason = {"fifo": "is a FIFO", "directory": "is a directory", "empty": "is empty"}[kind]
        assert reason in lines[0]


@pytest.mark.parametrize("kind", ["fifo", "directory"])
@pytest.mark.parametrize("command", [
    ("sessions", "show", NEW), ("sessions", "export", NEW), ("sessions", "rm", NEW),
    ("sessions", "path", NEW), ("run", "-m", "echo", "--session", NEW, "hi"),
])
def test_an_entry_that_is_not_a_ledger_is_one_clear_error(
        env: dict[str, str], kind: str, command: tuple[str, ...]) -> None:
    sessions_dir(env).mkdir(parents=True)
    odd = _odd_entry(sessions_dir(env), kind)
    proc = run(env, *command, timeout=15)
    one_error(proc, 1, str(odd), "not a session ledger file")
    assert odd.exists()  # rm refuses it: it is not dsh's to delete


def test_continue_passes_over_entries_that_are_not_sessions(env: dict[str, str]) -> None:
    store = JsonlStore(sessions_dir(env))
    make_session(store, OLD)
    for sid, kind in (("20990101-000000.000-111111", "fifo"),
                      ("20990101-000000.000-222222", "directory"),
                      ("20990101-000000.000-333333", "empty")):
        path = sessions_dir(env) / f"{sid}.jsonl"
        os.mkfifo(path) if kind == "fifo" else path.mkdir() if kind == "directory" \
            else path.touch()
    # (a session made by hand names no directory: -c --any-dir is what finds it)
    proc = run(env, "run", "-m", "echo", "--json", "-c", "--any-dir", "again", timeout=15)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["session"] == OLD
    proc = run(env, "sessions", "show", "latest")
    assert proc.returncode == 0 and b"again" in proc.stdout


# -- a ledger another user made (``sudo dsh``): permissions, as a normal user -----------------


def _as_nobody() -> list[str]:
    """A command prefix running Python as user nobody with this dsh importable, or a skip."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to user nobody (as root, chmod 000 stops no read)")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    site = sysconfig.get_paths()["purelib"]
    src = str(Path(dsh.__file__).resolve().parent.parent)
    for exe in (sys.executable, shutil.which(f"python3.{sys.version_info.minor}"),
                shutil.which("python3")):
        if not exe:
            continue
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", exe]
        probe = subprocess.run([*prefix, "-c", "import dsh.cli"], capture_output=True,
                               env={"PYTHONPATH": f"{src}:{site}", "PATH": os.environ["PATH"]})
        if probe.returncode == 0:
            return prefix
    pytest.skip("no Python that user nobody may run can import this dsh (the venv lives "
                "under a directory only root can enter)")


@pytest.fixture
def open_tmp() -> Any:
    """A temporary directory every user can enter (pytest's tmp_path is root's alone)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="dsh-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_ledger_of_another_user_is_one_clear_error_and_the_others_are_listed(
        open_tmp: Path) -> None:
    prefix = _as_nobody()
    home = open_tmp / "nobody"
    sessions = home / "dsh" / "sessions"
    store = JsonlStore(sessions)
    make_session(store, OLD, "readable")
    make_session(store, MID, "read-only")
    make_session(store, NEW, "unreadable")
    for path in home.rglob("*"):
        os.chown(path, 65534, 65534)
    os.chown(home, 65534, 65534)
    # Made by `sudo dsh`: owned by root, read-only (0444) or unreadable (0000).
    for sid, mode in ((MID, 0o444), (NEW, 0o000)):
        os.chown(store.path(sid), 0, 0)
        store.path(sid).chmod(mode)
    store.path(OLD).chmod(0o600)
    site = sysconfig.get_paths()["purelib"]
    src = str(Path(dsh.__file__).resolve().parent.parent)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_DATA_HOME": str(home),
           "XDG_CONFIG_HOME": str(home / "config"), "PYTHONPATH": f"{src}:{site}",
           "DSH_LOAD_PLUGINS": ""}

    def nobody(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*prefix, "-m", "dsh", *args], env=env, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=30)

    listed = nobody("sessions", "list")
    assert listed.returncode == 0, listed.stderr
    assert OLD in listed.stdout.decode() and MID in listed.stdout.decode()
    (skip,) = err_lines(listed)
    assert skip.startswith("dsh: warning: skipped:") and NEW in skip
    assert "permission denied" in skip

    one_error(nobody("sessions", "show", NEW), 1, NEW, "permission denied")
    one_error(nobody("run", "-m", "echo", "--session", MID, "more"), 1, MID,
              "for writing: permission denied", "sudo dsh")
    one_error(nobody("run", "-m", "echo", "--session", NEW, "more"), 1, NEW,
              "permission denied")
    assert ledger_types(store.path(MID))[-1] == "turn/end"  # untouched
    shown = nobody("sessions", "show", MID)  # reading a read-only ledger is fine
    assert shown.returncode == 0 and b"read-only" in shown.stdout
    ok = nobody("run", "-m", "echo", "--session", OLD, "more")
    assert ok.returncode == 0 and ok.stdout == b"more\n", ok.stderr


# -- stdout and --output that cannot be written --------------------------------------------


needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")


@needs_dev_full
@pytest.mark.parametrize("args", [
    ("sessions", "list"), ("sessions", "show", "latest"), ("sessions", "export", "latest"),
    ("sessions", "list", "--json"), ("tools",), ("models",),
])
def test_stdout_on_a_full_device_is_one_clear_error(env: dict[str, str],
                                                    args: tuple[str, ...]) -> None:
    make_session(JsonlStore(sessions_dir(env)), OLD)
    with open("/dev/full", "wb") as full:
        proc = run(env, *args, stdout=full)
    one_error(proc, 1, "cannot write to standard output: no space left on device")


@needs_dev_full
@pytest.mark.parametrize("mode", [(), ("--json",), ("--events",), ("--stream",)])
def test_run_with_stdout_on_a_full_device_records_the_turn_and_says_so(
        env: dict[str, str], mode: tuple[str, ...]) -> None:
    with open("/dev/full", "wb") as full:
        proc = run(env, "run", "-m", "echo", *mode, "keep me", stdout=full)
    line = one_error(proc, 1, "cannot write to standard output: no space left on device")
    (path,) = sessions_dir(env).glob("*.jsonl")
    assert path.stem in line  # where the answer is
    events = JsonlStore(sessions_dir(env)).read(path.stem)
    assert [e.text for e in events if e.type == "user/message"] == ["keep me"]
    assert events[-1].type == "turn/end"


def test_export_to_a_path_that_cannot_be_written_is_one_clear_error(
        env: dict[str, str], tmp_path: Path) -> None:
    make_session(JsonlStore(sessions_dir(env)), OLD)
    one_error(run(env, "sessions", "export", OLD, "--output", "/nonexistent/x"), 1,
              "cannot write /nonexistent/x: no such file or directory")
    if os.path.exists("/dev/full"):
        one_error(run(env, "sessions", "export", OLD, "--output", "/dev/full"), 1,
                  "cannot write /dev/full: no space left on device")


# -- invalid Unicode: sanitised at the edges, recorded -------------------------------------


def test_clean_text_joins_pairs_then_replaces_what_is_lone() -> None:
    assert clean_text("plain") == ("plain", 0)
    assert clean_text("a\ud83d\ude00b") == ("a😀b", 0)
    assert clean_text("\ud800x\udcff") == ("\ufffdx\ufffd", 2)
    assert clean_text("\ude00\ud83d") == ("\ufffd\ufffd", 2)  # wrong order: two lone ones
    stream = StreamText()
    pieces = [stream.feed(d) for d in ("a\ud83d", "\ude00b", "\ud800", "c\ud83d")]
    pieces.append(stream.flush())
    assert "".join(pieces) == "a😀b\ufffdc\ufffd"
    assert all(p.encode() is not None for p in pieces)


def _openai_env(env: dict[str, str], server: ScriptedServer) -> dict[str, str]:
    return {**env, "OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": "sk-test-key-123"}


def _raw_sse(obj: Any, event: str | None = None) -> bytes:
    """An SSE event whose JSON keeps ``\\uXXXX`` escapes (a lone surrogate stays escaped)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj)}\n\n".encode()


def test_a_lone_surrogate_from_the_model_is_replaced_and_recorded(env: dict[str, str]) -> None:
    body = json.dumps(openai_completion("ok \ud800 end")).encode()  # ASCII: "\ud800" escaped
    with ScriptedServer() as server:
        server.script(Reply(body=body, headers={"content-type": "application/json"}))
        proc = run(_openai_env(env, server), "run", "-m", "openai:gpt-4o-mini", "--no-stream",
                   "say it")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == "ok \ufffd end\n"
    (path,) = sessions_dir(env).glob("*.jsonl")
    lines = [json.loads(x) for x in path.read_bytes().splitlines()]
    (answer,) = [d for d in lines if d["type"] == "assistant/message"]
    assert answer["text"] == "ok \ufffd end" and answer["sanitized"] == 1
    assert all("sanitized" not in d for d in lines if d is not answer)
    events = JsonlStore(sessions_dir(env)).read(path.stem)  # and it reads back
    assert events[-1].type == "turn/end" and events[-1].outcome == "completed"


def _split_pair_stream(adapter: str) -> list[bytes]:
    deltas = ["a", "\ud83d", "\ude00", "b \ud800"]
    if adapter == "openai":
        base = {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o-mini"}
        chunks = [_raw_sse({**base, "choices": [{"index": 0, "delta": {"content": d},
                                                 "finish_reason": None}]}) for d in deltas]
        chunks.append(_raw_sse({**base, "choices": [{"index": 0, "delta": {},
                                                     "finish_reason": "stop"}]}))
        return [*chunks, b"data: [DONE]\n\n"]
    out = [_raw_sse({"type": "message_start", "message": {"model": "claude-x", "usage": {
        "input_tokens": 3, "output_tokens": 1}}}, "message_start"),
        _raw_sse({"type": "content_block_start", "index": 0,
                  "content_block": {"type": "text", "text": ""}}, "content_block_start")]
    out += [_raw_sse({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "text_delta", "text": d}}, "content_block_delta")
            for d in deltas]
    out.append(_raw_sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                         "usage": {"output_tokens": 4}}, "message_delta"))
    return [*out, _raw_sse({"type": "message_stop"}, "message_stop")]


@pytest.mark.parametrize("adapter", ["openai", "anthropic"])
@pytest.mark.parametrize("mode", ["--stream", "--events"])
def test_a_surrogate_pair_split_across_deltas_is_joined_not_broken(
        env: dict[str, str], adapter: str, mode: str) -> None:
    with ScriptedServer() as server:
        server.script(Reply(chunks=_split_pair_stream(adapter),
                            headers={"content-type": "text/event-stream"}))
        e = {**env, "OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": "sk-test-key-1",
             "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-ant-test-key-1"}
        model = "openai:gpt-4o-mini" if adapter == "openai" else "anthropic:claude-x"
        proc = run(e, "run", "-m", model, mode, "emoji please")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode("utf-8")  # strict: every byte written is valid UTF-8
    if mode == "--stream":
        assert out == "a😀b \ufffd\n"
    else:
        lines = [json.loads(x) for x in out.splitlines()]
        deltas = "".join(d["delta"] for d in lines if d["type"] == "llm/stream")
        assert deltas == "a😀b \ufffd"
        assert lines[-1]["output"] == "a😀b \ufffd"
    (path,) = sessions_dir(env).glob("*.jsonl")
    lines = [json.loads(x) for x in path.read_bytes().splitlines()]
    (answer,) = [d for d in lines if d["type"] == "assistant/message"]
    assert answer["text"] == "a😀b \ufffd" and answer["sanitized"] == 1


@pytest.mark.parametrize("where", ["prompt", "system", "option"])
def test_bytes_that_are_not_utf8_on_the_command_line_are_replaced_and_recorded(
        env: dict[str, str], where: str) -> None:
    args: list[str | bytes] = ["run", "-m", "echo", "--json"]
    if where == "prompt":
        args.append(b"caf\xe9 \xff")
    elif where == "system":
        args += [b"-s", b"be \xff brief", "hi"]
    else:
        args += [b"-o", b"stop=\xff", "hi"]
    proc = run(env, *args)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["outcome"] == "completed"
    (path,) = sessions_dir(env).glob("*.jsonl")
    lines = [json.loads(x) for x in path.read_bytes().splitlines()]
    marked = [d for d in lines if "sanitized" in d]
    if where == "prompt":
        assert result["output"] == "caf\ufffd \ufffd"
        (user,) = marked
        assert user["type"] == "user/message" and user["text"] == "caf\ufffd \ufffd"
        assert user["sanitized"] == 2
    else:
        # -s and -o are cleaned where they are parsed (the turn/start record and the request
        # the transport checks against it must agree), and that is said on stderr.
        assert marked == []
        (turn,) = [d for d in lines if d["type"] == "turn/start"]
        if where == "system":
            assert turn["system"] == "be \ufffd brief"
        else:
            assert turn["options"]["stop"] == "\ufffd"
        (warning,) = err_lines(proc)
        option = "-s" if where == "system" else "-o"
        assert warning == (f"dsh: warning: {option}: replaced 1 byte(s) that are not UTF-8 "
                           "with U+FFFD")
    assert JsonlStore(sessions_dir(env)).read(path.stem)[-1].type == "turn/end"


# -- nesting and surrogates in what dsh reads ----------------------------------------------

DEEP = "[" * 1000 + "]" * 1000


def _ledger_lines(env: dict[str, str]) -> tuple[JsonlStore, Path, list[bytes]]:
    store = JsonlStore(sessions_dir(env))
    path = make_session(store, OLD, "first")
    return store, path, path.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("bad", ["surrogate", "deep"])
def test_a_bad_ledger_line_is_named_by_its_number_and_a_bad_last_line_is_cut(
        env: dict[str, str], bad: str) -> None:
    store, path, lines = _ledger_lines(env)
    d = json.loads(lines[2])
    if bad == "surrogate":
        d["text"] = "x\ud800y"
        line = json.dumps(d).encode() + b"\n"  # escaped, as a hand edit would have it
    else:
        line = json.dumps(d)[:-1].encode() + b', "deep": ' + DEEP.encode() + b"}\n"
    path.write_bytes(b"".join([*lines[:2], line, *lines[3:]]))
    what = "lone surrogate" if bad == "surrogate" else "nested too deeply"
    for command in (("sessions", "show", OLD), ("run", "-m", "echo", "--session", OLD, "x")):
        one_error(run(env, *command), 1, f"{path}:3:", what)
    listed = run(env, "sessions", "list")  # the summary reads the first lines: no traceback
    assert listed.returncode == 0 and OLD in listed.stdout.decode()
    err_lines(listed)
    # As the last line, it is a torn tail: cut, reported, and the session goes on.
    path.write_bytes(b"".join([*lines[:3], line]))
    proc = run(env, "run", "-m", "echo", "--session", OLD, "again")
    assert proc.returncode == 0, proc.stderr
    assert any("cut a torn last line" in ln for ln in err_lines(proc))
    assert [e.type for e in store.read(OLD)][:3] == ledger_types(path)[:3]


def test_tool_arguments_nested_too_deeply_become_an_error_the_model_reads(
        env: dict[str, str]) -> None:
    deep_args = '{"value": ' + DEEP + "}"
    first = openai_completion(None, calls=[("call_1", "shape", deep_args)])
    second = openai_completion("recovered")
    with ScriptedServer() as server:
        server.script(Reply(body=first), Reply(body=second))
        proc = run(_openai_env(env, server), "run", "-m", "openai:gpt-4o-mini", "--no-stream",
                   "go")
        bodies = server.bodies
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"recovered\n"
    (path,) = sessions_dir(env).glob("*.jsonl")
    events = JsonlStore(sessions_dir(env)).read(path.stem)
    (result,) = [e for e in events if e.type == "tool/result"]
    assert result.status == "error"
    tool_msgs = [m for m in bodies[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs and "__invalid_json__" in tool_msgs[0]["content"]


def test_a_response_nested_too_deeply_is_a_provider_error(env: dict[str, str]) -> None:
    body = ('{"content": [{"type": "tool_use", "id": "t1", "name": "shape", "input": {"v": '
            + DEEP + '}}], "model": "claude-x", "stop_reason": "tool_use", '
            '"usage": {"input_tokens": 1, "output_tokens": 1}}').encode()
    with ScriptedServer() as server:
        server.script(Reply(body=body, headers={"content-type": "application/json"}))
        e = {**env, "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-ant-test-key-1"}
        proc = run(e, "run", "-m", "anthropic:claude-x", "--no-stream", "go")
    one_error(proc, 1, "nested too deeply")


@pytest.mark.parametrize("shape", ["file", "arguments"])
def test_a_scripted_file_nested_too_deeply_is_a_config_error_naming_it(
        env: dict[str, str], tmp_path: Path, shape: str) -> None:
    path = tmp_path / "deep.json"
    if shape == "file":
        path.write_text('{"responses": ' + DEEP + "}")
    else:
        args = {"v": json.loads("[" * 80 + "]" * 80)}
        path.write_text(json.dumps({"responses": [
            {"tool_calls": [{"name": "shape", "arguments": args}]}]}))
    proc = run(env, "run", "-m", f"scripted:{path}", "go")
    one_error(proc, 2, str(path), "nested")
    assert not sessions_dir(env).exists() or not list(sessions_dir(env).iterdir())


# -- a failure before the first event leaves no session ----------------------------------


def test_an_option_json_cannot_carry_is_refused_before_any_session_exists(
        env: dict[str, str]) -> None:
    proc = run(env, "run", "-m", "echo", "-o", "when=1979-05-27", "hi")
    assert proc.returncode == 2
    text = proc.stderr.decode()
    assert "when" in text and "JSON" in text and "Traceback" not in text
    assert not sessions_dir(env).exists() or not list(sessions_dir(env).iterdir())


def _full_filesystem(tmp_path: Path) -> tuple[Path, Callable[[], None]]:
    """A 64 KiB tmpfs filled to the last byte, or a skip where mounting is not allowed."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=64,mode=0755",
                           "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}); "
                    "the RLIMIT_FSIZE variant covers a failing first write")
    def unmount() -> None:
        subprocess.run(["umount", "-l", str(mnt)], check=False)

    try:
        (mnt / "sessions").mkdir()
        with open(mnt / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
    except BaseException:
        unmount()
        raise
    return mnt, unmount


def test_no_space_at_the_first_write_leaves_no_empty_session(env: dict[str, str],
                                                             tmp_path: Path) -> None:
    mnt, unmount = _full_filesystem(tmp_path)
    try:
        e = {**env, "DSH_HOME": str(mnt)}
        proc = run(e, "run", "-m", "echo", "hi")
        one_error(proc, 1, "cannot write session ledger", "no space left on device")
        assert list((mnt / "sessions").iterdir()) == []
        listed = run(e, "sessions", "list")
        assert listed.returncode == 0 and listed.stdout == b""
    finally:
        unmount()


def test_a_file_size_limit_at_the_first_write_leaves_no_empty_session(
        env: dict[str, str]) -> None:
    # RLIMIT_FSIZE 0 with SIGXFSZ ignored: every write to a file fails with EFBIG, as the
    # first ledger write on a full disk fails with ENOSPC.
    limited = [sys.executable, "-c",
               "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN);"
               "resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0));"
               "os.execv(sys.executable, [sys.executable, '-m', 'dsh', *sys.argv[1:]])"]
    proc = subprocess.run([*limited, "run", "-m", "echo", "hi"], env=env, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=30)
    one_error(proc, 1, "cannot write session ledger", "file too large")
    assert list(sessions_dir(env).iterdir()) == []


def test_the_sub_agent_depth_limit_leaves_no_empty_session(make_app: Any, script: Any,
                                                            tmp_path: Path) -> None:
    model = script({"tool_calls": [{"name": "ask_deep", "arguments": {"prompt": "go"}}]},
                   {"text": "done"})
    app = make_app(model=model, agents={"deep": {"subagents": ["deep"]}}, agent="deep")
    result = app.run("start")
    assert result.outcome == "completed", result.reason
    files = list(app.store.directory.glob("*.jsonl"))
    assert files and all(f.stat().st_size > 0 for f in files)
    children = [e.child_session for f in files for e in app.store.read(f.stem)
                if e.type == "tool/call"]
    missing = [c for c in children if not app.store.path(c).exists()]
    assert len(missing) == 1  # the child refused by the depth limit never became a file
    assert app.store.latest() is not None and app.store.info(app.store.latest()).turns >= 1


def test_latest_skips_an_empty_file(env: dict[str, str]) -> None:
    store = JsonlStore(sessions_dir(env))
    make_session(store, OLD)
    (sessions_dir(env) / f"{NEW}.jsonl").touch()
    assert store.latest() == OLD
    proc = run(env, "sessions", "path", "latest")
    assert proc.stdout.decode().strip() == str(store.path(OLD))


# -- the sessions folder deleted during a run ---------------------------------------------


def test_a_sessions_folder_deleted_during_the_run_fails_loudly(env: dict[str, str],
                                                                script: Any) -> None:
    model = script({"tool_calls": [{"name": "wipe_sessions", "arguments": {}}]},
                   {"text": "all fine?"})
    proc = run(env, "run", "-m", model, "--json", "go")
    result = json.loads(proc.stdout)
    assert result["outcome"] == "error", result
    assert "deleted during the run" in result["reason"]
    one_error(proc, 1, "deleted during the run")
    assert not sessions_dir(env).exists()


# -- the reader of --events goes away -----------------------------------------------------


@pytest.mark.parametrize("reader", ["head -1", "true", "head -c 10"])
def test_a_closed_stdout_still_records_the_prompt_and_closes_the_turn(
        env: dict[str, str], reader: str) -> None:
    import shlex

    proc = subprocess.run(
        ["bash", "-c", f"{shlex.join(DSH)} run --events -m echo 'remember me' | {reader}; "
                       "echo rc=${PIPESTATUS[0]} >&2"],
        env=env, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    assert b"rc=0" in proc.stderr, proc.stderr
    assert b"Traceback" not in proc.stderr
    (path,) = sessions_dir(env).glob("*.jsonl")
    events = JsonlStore(sessions_dir(env)).read(path.stem)
    assert [e.text for e in events if e.type == "user/message"] == ["remember me"]
    assert events[-1].type == "turn/end" and events[-1].outcome in ("completed", "stopped")


# -- the ledger's loading rules on real files (what mutation testing asked for) ------------


def _rewrite(path: Path, index: int, change: Callable[[dict[str, Any]], None]) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    d = json.loads(lines[index])
    change(d)
    lines[index] = json.dumps(d, ensure_ascii=False).encode() + b"\n"
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize("change,what", [
    (lambda d: d.update(seq=d["seq"] - 1), "'seq' is 1 where 2 was expected"),
    (lambda d: d.update(seq=d["seq"] + 1), "'seq' is 3 where 2 was expected"),
    (lambda d: d.pop("seq"), "no 'seq'"),
    (lambda d: d.update(seq="2"), "no 'seq'"),
    (lambda d: d.pop("ts"), "no 'ts'"),
    (lambda d: d.pop("session"), "no 'session'"),
])
def test_seq_continuity_and_required_fields_are_checked_on_load(
        tmp_path: Path, change: Callable[[dict[str, Any]], None], what: str) -> None:
    store = JsonlStore(tmp_path)
    path = make_session(store, OLD)
    _rewrite(path, 2, change)
    for load in (lambda: store.read(OLD), lambda: store.open(OLD)):
        with pytest.raises(LedgerError, match=f"{path}:3: ") as caught:
            load()
        assert what in str(caught.value)
    # The same defect on the last line is a torn tail: cut on open, the rest kept.
    path = make_session(store, MID)
    _rewrite(path, 5, change)
    with store.open(MID) as ledger:
        assert any("cut a torn last line" in n for n in ledger.notes)
        assert ledger.projection.seq == 5  # 0-4 kept, then turn/end (seq 5) closes the turn
    assert [e.seq for e in store.read(MID)] == list(range(6))


def test_a_first_line_must_start_at_seq_zero(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    path = make_session(store, OLD)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[1:]))  # the first line lost
    with pytest.raises(LedgerError, match=r":1: 'seq' is 1 where 0 was expected"):
        store.read(OLD)


@pytest.mark.parametrize("bad", ["", "a/b", ".x", "..", ".", "a\0b", "a\nb", "x" * 201,
                                 "../etc/passwd", "/abs"])
def test_the_session_id_guard(tmp_path: Path, bad: str) -> None:
    store = JsonlStore(tmp_path)
    for op in (store.path, store.create, store.open, store.remove, store.info):
        if op == store.create and bad == "":
            continue  # create() without an id makes a new one
        with pytest.raises(UsageError, match="invalid session id"):
            op(bad)
    assert list(tmp_path.iterdir()) == []


def test_ids_that_are_fine(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    for sid in ("x", "a.b", "x" * 200, "café-ü"):
        assert store.path(sid) == tmp_path / f"{sid}.jsonl"


def test_create_never_overwrites_an_existing_session(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    path = make_session(store, OLD, "precious")
    before = path.read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        store.create(OLD)
    assert path.read_bytes() == before


def test_a_ledger_closed_before_its_first_event_leaves_no_file(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    ledger = store.create(OLD)
    assert store.path(OLD).exists()
    ledger.close()
    assert not store.path(OLD).exists()
    with store.create(MID) as ledger:  # one event: kept
        ledger.append(TurnStarted, turn=1, agent="a")
    assert store.path(MID).stat().st_size > 0


def test_one_corrupt_file_hides_no_other_session(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    ids = [f"2026010{i}-000000.000-aaaaaa" for i in range(1, 6)]
    for sid in ids:
        make_session(store, sid, f"prompt {sid}")
    store.path(ids[3]).write_bytes(b"\xff\xfe garbage\n")  # listed, with nothing known
    store.path(ids[2]).unlink()
    os.mkfifo(store.path(ids[2]))  # cannot be listed: skipped and reported
    skipped: list[str] = []
    listed = [s.id for s in store.sessions(on_skip=lambda p, why: skipped.append(why))]
    assert listed == [ids[4], ids[3], ids[1], ids[0]]
    assert len(skipped) == 1 and "FIFO" in skipped[0]
    assert store.latest() == ids[4]


@pytest.mark.parametrize("policy,expected", [("event", 3), ("step", 1), ("never", 0)])
def test_fsync_policy_holds_after_reopening(tmp_path: Path, policy: str, expected: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    make_session(JsonlStore(tmp_path), OLD)
    store = JsonlStore(tmp_path, fsync=policy)
    ledger = store.open(OLD)
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    ledger.append(TurnStarted, turn=2, agent="a")
    ledger.append(UserMessage, text="b")
    ledger.step_boundary()
    monkeypatch.undo()
    ledger.close()
    assert len(calls) == expected


def test_a_ledger_deleted_under_a_library_run_is_noticed_at_the_step_boundary(
        tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    ledger = store.create(OLD)
    ledger.append(TurnStarted, turn=1, agent="a")
    ledger.step_boundary()
    store.path(OLD).unlink()
    with pytest.raises(LedgerError, match="deleted during the run"):
        ledger.step_boundary()
    assert ledger.lost is not None
    ledger.step_boundary()  # said once; closing does not raise again
    ledger.close()


def test_the_ledger_sanitises_every_field_of_an_event_and_counts_replacements(
        tmp_path: Path) -> None:
    from dsh.core.messages import ToolCall
    from dsh.ledger.events import ToolCalled

    store = JsonlStore(tmp_path)
    call = ToolCall(id="c\ud800", name="t",
                    arguments={"a\udcff": ["x\ud800", {"k": "\ud83d\ude00"}]})
    with store.create(OLD) as ledger:
        answer = ledger.append(AssistantMessage, text="hi\ud800", tool_calls=(call,))
        ledger.append(ToolCalled, call_id="c", name="t", arguments=call.arguments)
        ledger.append(UserMessage, text="a pair alone \ud83d\ude00")
        ledger.append(UserMessage, text="clean")
    assert answer.text == "hi\ufffd" and answer.tool_calls[0].id == "c\ufffd"
    lines = [json.loads(x) for x in store.path(OLD).read_bytes().splitlines()]
    assert [d.get("sanitized") for d in lines] == [4, 2, None, None]
    assert lines[0]["tool_calls"][0]["arguments"] == {"a\ufffd": ["x\ufffd", {"k": "😀"}]}
    assert lines[2]["text"] == "a pair alone 😀"
    events = store.read(OLD)
    assert events[0].extra == {"sanitized": 4}  # read back, and written back unchanged
    from dsh.ledger.serialize import dump_event

    assert [dump_event(e).encode() + b"\n" for e in events] == \
        store.path(OLD).read_bytes().splitlines(keepends=True)
