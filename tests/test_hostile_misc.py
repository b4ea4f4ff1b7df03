"""Issue 23's defects outside MCP and the C3 redesign (the hostile review and the audit):
hooks, batch, attachments, keys, bounded reads of user-named files, NaN in configuration,
HTTP retries against ``-L requests``, one-line errors, and ``sessions show``.

Each test was checked to fail on the code before its fix; real subprocesses, real files, a
real loopback server where HTTP is involved (docs/security.md names the classes).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.errors import ConfigError

DSH = [sys.executable, "-m", "dsh"]


def clean_env(tmp: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS") and not k.endswith("_API_KEY")}
    (tmp / "home").mkdir(exist_ok=True)
    env.update(HOME=str(tmp / "home"), XDG_CONFIG_HOME=str(tmp / "xdg"),
               XDG_DATA_HOME=str(tmp / "data"), DSH_HOME=str(tmp / "dshhome"), **more)
    return env


def run(env: dict[str, str], *args: str, cwd: Path | None = None, stdin: str = "",
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, input=stdin, capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, start_new_session=True)


def script_model(tmp: Path, *responses: dict[str, Any], name: str = "script") -> str:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"responses": list(responses)}))
    return f"scripted:{path}"


def one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# -- hooks: a too-deep answer blocks (fail closed) ------------------------------------------------
#
# Defect: a hook answering JSON nested 100,000 levels deep (200 kB, under the 1 MiB cap) made
# json.loads raise RecursionError: alone, it ended the run in a traceback; with a second hook
# of the same event, its thread died, its answer (a deny) was dropped and the call ran.

DEEP_DENY = """\
import json, sys
sys.stdin.read()
deny = {"hookEventName": "PreToolUse", "permissionDecision": "deny",
        "permissionDecisionReason": "never"}
sys.stdout.write('{"hookSpecificOutput": ' + json.dumps(deny) + ', "x": '
                 + "[" * 100000 + "]" * 100000 + "}")
"""

QUIET = "import sys\nsys.stdin.read()\n"


def hooks_config(tmp: Path, proj: Path, commands: list[str], **extra: Any) -> Path:
    hooks = {"PreToolUse": [{"matcher": "*", "hooks": [
        {"type": "command", "command": c} for c in commands]}]}
    cfg = {"sessions_dir": str(tmp / "sessions"),
           "plugins": {"hooks": {"hooks": hooks, **extra},
                       "shell": {"workspace": str(proj), "tty": str(tmp / "no-tty")}}}
    path = tmp / "dsh.toml"
    path.write_text(tomli_w.dumps(cfg))
    return path


@pytest.mark.parametrize("with_second", [False, True])
def test_a_too_deep_hook_answer_blocks_the_call(tmp_path: Path, with_second: bool) -> None:
    pytest.importorskip("dsh_hooks")
    proj = tmp_path / "proj"
    proj.mkdir()
    (tmp_path / "deep.py").write_text(DEEP_DENY)
    (tmp_path / "quiet.py").write_text(QUIET)
    commands = [f"{sys.executable} {tmp_path / 'deep.py'}"]
    if with_second:
        commands.append(f"{sys.executable} {tmp_path / 'quiet.py'}")
    cfg = hooks_config(tmp_path, proj, commands)
    m = script_model(tmp_path, {"tool_calls": [{"name": "run_command",
                                                "arguments": {"command": "touch ran.txt"}}]},
                     {"text": "done"})
    r = run(clean_env(tmp_path), "--config", str(cfg), "run", "--yes", "-m", m, "go",
            cwd=proj)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr
    assert not (proj / "ran.txt").exists()  # the call did not run: fail closed
    named = [x for x in r.stderr.splitlines() if "deep.py" in x]
    assert len(named) == 1 and "nested more than" in named[0], r.stderr
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    events = [json.loads(x) for x in ledger.read_text().splitlines()]
    [result] = [e for e in events if e["type"] == "tool/result"]
    assert result["status"] == "error" and "nested more than" in result["output"]


# -- NaN and infinities in configuration ---------------------------------------------------------
#
# Defect: `timeout = nan` / `max_output = nan` passed the `<= 0` checks (every comparison
# with NaN is false) and crashed later; the same held for numbers of other plugins.

NUMERIC_SETTINGS = [
    ("plugins.hooks", "timeout"), ("plugins.hooks", "max_output"),
    ("plugins.shell", "timeout"), ("plugins.mcp", "timeout"), ("plugins.mcp", "startup_timeout"),
    ("plugins.dsh-ray", "task_cpus"), ("limits", "cost"), ("limits", "seconds"),
    ("models.\"openai/gpt-4o\".price", "input"),
    ("models.\"openai/gpt-4o\".options", "temperature"),
]


@settings(max_examples=60, deadline=None)
@given(where=st.sampled_from(NUMERIC_SETTINGS),
       value=st.sampled_from([math.nan, math.inf, -math.inf]),
       spelled=st.sampled_from(["{}", "[{}]", "{{ x = {} }}"]))
def test_no_setting_takes_nan_or_infinity(where: tuple[str, str], value: float,
                                         spelled: str) -> None:
    """A property over the settings: NaN or an infinity anywhere in the config file — a
    number of dsh, of a first-party plugin, inside an array or a table — is one
    ConfigError naming the file, the line and the dotted key."""
    import tempfile

    from dsh.config.loader import load_config

    table, key = where
    toml_value = {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan")
    text = f"autoload = false\n\n[{table}]\n{key} = {spelled.format(toml_value)}\n"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "dsh.toml"
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_config(path)
    msg = str(info.value)
    assert re.match(rf"{re.escape(str(path))}(:[34])?: key ", msg) and key in msg, msg
    if table.startswith("plugins.") and spelled == "{}":
        assert f"got float {value!r}" in msg, msg


@pytest.mark.parametrize("check", ["hooks", "shell", "mcp", "http"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_plugin_number_checks_refuse_nan_themselves(check: str, value: float) -> None:
    """The same rule where a plugin checks its own table (settings given from Python, and
    hook timeouts from a Claude Code settings.json, where `NaN` is valid JSON to Python)."""
    if check == "hooks":
        from dsh_hooks.config import check as hooks_check
        from dsh_hooks.config import parse_hooks

        with pytest.raises(ConfigError, match="timeout"):
            hooks_check({"timeout": value}, "plugins.hooks")
        with pytest.raises(ConfigError, match="max_output"):
            hooks_check({"max_output": value}, "plugins.hooks")
        group = {"PreToolUse": [{"hooks": [{"command": "x", "timeout": value}]}]}
        with pytest.raises(ConfigError, match=r"settings.json.PreToolUse\[0\].hooks\[0\].timeout"):
            parse_hooks(group, "settings.json", strict=False, default_timeout=60.0)
    elif check == "shell":
        from dsh_shell.settings import parse_settings as shell_settings

        with pytest.raises(ConfigError, match="timeout"):
            shell_settings({"timeout": value}, "plugins.shell")
    elif check == "mcp":
        from dsh_mcp.settings import parse_settings as mcp_settings

        with pytest.raises(ConfigError, match="timeout"):
            mcp_settings({"timeout": value}, "plugins.mcp")
    else:
        from dsh.llm.http.settings import HTTPSettings

        with pytest.raises(ConfigError, match="timeout"):
            HTTPSettings.from_settings({"timeout": value}, "models.x")


# -- batch: damaged lines, path aliases, journal fields ------------------------------------------


@pytest.fixture
def benv(tmp_path: Path) -> dict[str, Any]:
    config = tmp_path / "config.toml"
    config.write_text(f'sessions_dir = "{tmp_path / "sessions"}"\nautoload = false\n')
    env = clean_env(tmp_path, DSH_CONFIG=str(config))
    m = script_model(tmp_path, {"text": "ok"})
    (tmp_path / "tasks.jsonl").write_text("".join(
        json.dumps({"id": f"t{i}", "prompt": f"task {i}"}) + "\n" for i in range(4)))
    return {"dir": tmp_path, "env": env, "model": m}


def batch(b: dict[str, Any], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run(b["env"], "batch", "tasks.jsonl", "-m", b["model"], *args, cwd=b["dir"],
               timeout=timeout)


def sessions_count(b: dict[str, Any]) -> int:
    return len(list((b["dir"] / "sessions").glob("*.jsonl")))


@pytest.mark.parametrize("damage", [b"{not json", b"[1, 2]", b'{"id": ' + b"[" * 5000
                                    + b"]" * 5000 + b"}", b"\xff\xfe"])
def test_a_damaged_middle_results_line_deletes_nothing(benv: dict[str, Any],
                                                       damage: bytes) -> None:
    """Defect: the rerun truncated the results file at the first line it could not read,
    deleting every completed result after it (and paying for those tasks again)."""
    assert batch(benv, "--results", "r.jsonl").returncode == 0
    results = benv["dir"] / "r.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    damaged = lines[0] + damage + b"\n" + b"".join(lines[2:])
    results.write_bytes(damaged)
    before = sessions_count(benv)
    r = batch(benv, "--results", "r.jsonl")
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert "r.jsonl:2: " in line and "damaged" in line, line
    assert results.read_bytes() == damaged  # every good line kept
    assert sessions_count(benv) == before  # nothing ran again


def test_a_torn_last_line_is_still_cut(benv: dict[str, Any]) -> None:
    assert batch(benv, "--results", "r.jsonl").returncode == 0
    results = benv["dir"] / "r.jsonl"
    results.write_bytes(results.read_bytes()[:-15])
    r = batch(benv, "--results", "r.jsonl")
    assert r.returncode == 0, r.stderr
    assert len(results.read_text().splitlines()) == 4
    assert all(json.loads(x) for x in results.read_text().splitlines())


@pytest.mark.parametrize(("line", "why"), [
    ({"task": "t0", "attempt": 1, "session": "s", "turn": "x"}, "'turn'"),
    ({"task": "t0", "attempt": "1", "outcome": "completed"}, "'attempt'"),
    ({"task": ["t0"], "attempt": 1, "session": "s"}, "'task'"),
    ({"task": "t0", "attempt": 1, "session": "s", "turn": [[[[[]]]]] * 3}, "'turn'"),
])
def test_a_bad_journal_line_is_one_error_naming_its_line(benv: dict[str, Any],
                                                        line: dict[str, Any], why: str) -> None:
    """Defect: `"turn": "x"` in the journal ended in a ValueError traceback."""
    journal = benv["dir"] / "r.jsonl.journal"
    journal.write_text(json.dumps({"task": "t9", "attempt": 1, "session": "s9", "turn": 1})
                       + "\n" + json.dumps(line) + "\n")
    r = batch(benv, "--results", "r.jsonl")
    assert r.returncode == 2
    msg = one_error_line(r.stderr)
    assert f"{journal}:2: " in msg and why in msg, msg


def test_a_deeply_nested_journal_line_is_one_error(benv: dict[str, Any]) -> None:
    journal = benv["dir"] / "r.jsonl.journal"
    journal.write_text("[" * 100000 + "]" * 100000 + "\n")
    r = batch(benv, "--results", "r.jsonl")
    assert r.returncode == 2
    assert f"{journal}:1: " in one_error_line(r.stderr)


@pytest.mark.parametrize("alias", ["symlink", "hardlink", "dir-symlink"])
def test_a_second_batch_through_a_path_alias_is_refused(benv: dict[str, Any],
                                                        alias: str) -> None:
    """Defect: the lock was on the journal's *name*: `--results link.jsonl` (a symbolic link
    to the results of a running batch) was not refused, two batches wrote one file."""
    slow = script_model(benv["dir"], {"text": "slow", "delay": 30}, name="slow")
    d = benv["dir"]
    (d / "out").mkdir()
    results = d / "out" / "r.jsonl"
    results.write_text("")
    if alias == "symlink":
        (d / "link.jsonl").symlink_to(results)
        other = "link.jsonl"
    elif alias == "hardlink":
        os.link(results, d / "hard.jsonl")
        other = "hard.jsonl"
    else:
        (d / "outlink").symlink_to(d / "out")
        other = "outlink/r.jsonl"
    proc = subprocess.Popen([*DSH, "batch", "tasks.jsonl", "-m", slow, "--results",
                             "out/r.jsonl"], env=benv["env"], cwd=d, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        journal = d / "out" / "r.jsonl.journal"
        import time

        for _ in range(600):  # until the first attempt is journalled (the lock is held)
            if journal.exists() and journal.read_text().strip():
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        r = run(benv["env"], "batch", "tasks.jsonl", "-m", slow, "--results", other,
                cwd=d)
        assert r.returncode == 2, r.stderr
        assert "another dsh batch is using" in one_error_line(r.stderr)
    finally:
        proc.kill()
        proc.communicate()


def test_a_results_symlink_stays_a_symlink_when_lines_are_dropped(benv: dict[str, Any]) -> None:
    """Retrying a failed task rewrites the results file: through a link, the link's target."""
    d = benv["dir"]
    failing = script_model(d, {"error": "boom"}, name="failing")
    (d / "real.jsonl").write_text("")
    (d / "link.jsonl").symlink_to(d / "real.jsonl")
    run(benv["env"], "batch", "tasks.jsonl", "-m", failing, "--results", "link.jsonl", cwd=d)
    assert len((d / "real.jsonl").read_text().splitlines()) == 4
    r = batch(benv, "--results", "link.jsonl", "--retries", "1")
    assert r.returncode == 0, r.stderr
    assert (d / "link.jsonl").is_symlink()
    assert len((d / "real.jsonl").read_text().splitlines()) == 4


# -- attachments: the overall deadline bounds every read ------------------------------------------


class Trickler:
    """A loopback server that sends its status line and headers one byte at a time, a byte
    every ``gap`` seconds; ``sent`` counts the bytes sent so far."""

    HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nX-Padding: "
            + b"x" * 120 + b"\r\nContent-Length: 8\r\n\r\n\x89PNG\r\n\x1a\n")

    def __init__(self, gap: float) -> None:
        self.gap = gap
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sent = 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        try:
            conn.recv(65536)
            for i in range(len(self.HEAD)):
                if self.stop.wait(self.gap):
                    break
                conn.sendall(self.HEAD[i:i + 1])
                self.sent = i + 1
        except OSError:
            pass
        finally:
            conn.close()
            self.sock.close()


def test_a_trickling_server_cannot_stretch_the_attach_deadline() -> None:
    """Defect: httpx's timeouts are per read, so a server sending one header byte a second
    kept `--attach URL` waiting past the documented overall limit; the deadline was checked
    only between body chunks. Now every socket read waits at most until the deadline."""
    from dsh.llm import attachments as att
    from dsh.llm.attachments import AttachmentError

    server = Trickler(gap=0.05)  # 180 bytes: 9 s for all the headers, each read far quicker
    try:
        with pytest.raises(AttachmentError) as info:
            att.fetch(f"http://127.0.0.1:{server.port}/photo.png", timeout=1.0)
        sent = server.sent
    finally:
        server.stop.set()
    assert "not downloaded within 1s" in str(info.value)
    headers_end = Trickler.HEAD.index(b"\r\n\r\n") + 4
    assert 0 < sent < headers_end  # dsh gave up while the headers were still coming


# -- keys: a deep keys.json, a 10 MB key -------------------------------------------------------


def test_a_deeply_nested_keys_file_is_one_clear_error(tmp_path: Path) -> None:
    env = clean_env(tmp_path, DSH_KEYS_BACKEND="file")
    keys = tmp_path / "xdg" / "dsh" / "keys"
    keys.mkdir(parents=True, mode=0o700)
    (keys / "keys.json").write_text('{"keys": ' + "[" * 100000 + "]" * 100000 + "}")
    (keys / "keys.json").chmod(0o600)
    r = run(env, "keys", "list")
    assert r.returncode != 0 and r.stdout == ""
    assert "keys.json: the keys file is damaged" in one_error_line(r.stderr)


@pytest.mark.parametrize("size", [8193, 10_000_000])
def test_a_huge_key_is_refused(tmp_path: Path, size: int) -> None:
    from dsh.config.keys import MAX_KEY_BYTES

    env = clean_env(tmp_path, DSH_KEYS_BACKEND="file")
    r = run(env, "keys", "set", "big", stdin="k" * size)
    assert r.returncode == 2
    assert f"longer than {MAX_KEY_BYTES} bytes" in one_error_line(r.stderr)
    assert "kkkk" not in r.stderr
    assert run(env, "keys", "list").stdout == ""
    ok = run(env, "keys", "set", "fits", stdin="k" * MAX_KEY_BYTES + "\n")
    assert ok.returncode == 0, ok.stderr
    assert run(env, "keys", "list").stdout == "fits\n"


def test_keys_set_from_an_endless_stdin_ends(tmp_path: Path) -> None:
    env = clean_env(tmp_path, DSH_KEYS_BACKEND="file")
    with open("/dev/zero", "rb") as zero:
        r = subprocess.run([*DSH, "keys", "set", "z"], env=env, stdin=zero,
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "longer than" in r.stderr


# -- bounded reads of user-named files: FIFOs, /dev/zero -----------------------------------------


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_mcp_json_that_is_not_a_regular_file_is_refused(tmp_path: Path, target: str) -> None:
    """Defect: a FIFO as `mcp_json` blocked `dsh run` forever; `/dev/zero` was read until
    the process was killed."""
    pytest.importorskip("dsh_mcp")
    path = _fifo(tmp_path / "mcp.json") if target == "fifo" else Path(target)
    cfg = tmp_path / "dsh.toml"
    cfg.write_text(tomli_w.dumps({"sessions_dir": str(tmp_path / "s"),
                                  "plugins": {"mcp": {"mcp_json": str(path)}}}))
    r = run(clean_env(tmp_path), "--config", str(cfg), "run", "-m", "echo", "hi",
            cwd=tmp_path, timeout=30)
    assert r.returncode != 0 and r.stdout == ""
    msg = one_error_line(r.stderr)
    assert str(path) in msg and ("not a regular file" in msg), msg


def test_claude_settings_fifo_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("dsh_hooks")
    proj = tmp_path / "proj"
    _fifo(proj / ".claude" / "settings.json")
    cfg = tmp_path / "dsh.toml"
    cfg.write_text(tomli_w.dumps({"sessions_dir": str(tmp_path / "s"), "plugins": {
        "hooks": {"claude_settings": ["project"]}, "shell": {"workspace": str(proj)}}}))
    r = run(clean_env(tmp_path), "--config", str(cfg), "run", "-m", "echo", "hi",
            cwd=proj, timeout=30)
    assert r.returncode != 0
    msg = one_error_line(r.stderr)
    assert "settings.json: cannot read hook settings: it is a FIFO" in msg, msg


@pytest.mark.parametrize("what", ["config", "script"])
def test_dsh_own_user_named_files_refuse_a_fifo(tmp_path: Path, what: str) -> None:
    fifo = _fifo(tmp_path / "named")
    env = clean_env(tmp_path)
    if what == "config":
        r = run(env, "--config", str(fifo), "run", "-m", "echo", "hi", timeout=30)
        expect = "cannot read config file: it is a FIFO"
    else:
        cfg = tmp_path / "dsh.toml"
        cfg.write_text(f'sessions_dir = "{tmp_path / "s"}"\nautoload = false\n')
        r = run(env, "--config", str(cfg), "run", "-m", f"scripted:{fifo}", "hi", timeout=30)
        expect = "is a FIFO, not a regular file"
    assert r.returncode != 0
    assert expect in one_error_line(r.stderr)


# -- one `dsh: error:` line, whatever a plugin's error text holds --------------------------------

BAD_PLUGIN = """\
import dsh

@dsh.hookimpl
def pre_step(step):
    raise RuntimeError(MESSAGE)
"""


@pytest.mark.parametrize("message", ["first\ndsh: error: forged", "a\r\nb\rc", "x\u2028y\x85z",
                                     "trailing\n"])
def test_a_plugin_error_with_line_breaks_is_one_error_line(tmp_path: Path, message: str) -> None:
    """Defect (audit): a plugin error with a newline printed more than one `dsh: error:`
    line (a plugin could forge dsh's own messages)."""
    (tmp_path / "badplug.py").write_text(BAD_PLUGIN.replace("MESSAGE", repr(message)))
    cfg = tmp_path / "dsh.toml"
    cfg.write_text(f'autoload = false\nload = ["badplug"]\nsessions_dir = "{tmp_path / "s"}"\n')
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    r = run(clean_env(tmp_path, PYTHONPATH=path), "--config", str(cfg), "run", "-m", "echo",
            "hi")
    assert r.returncode == 1 and r.stdout == ""
    line = one_error_line(r.stderr)  # exactly one line
    assert line.startswith("dsh: error: plugin badplug raised in hook pre_step")
    assert line.count("dsh: error:") == 1 or "\\ndsh: error: forged" in line


@given(st.text())
def test_one_line_has_no_line_break_and_keeps_the_text(text: str) -> None:
    from dsh.core.sanitize import one_line

    out = one_line(text)
    assert len(out.splitlines()) <= 1
    # each line break became the two characters \n (a text may hold those two itself)
    assert out == "\\n".join(text.strip().splitlines())


# -- HTTP retries count against `-L requests` ----------------------------------------------------


@pytest.mark.parametrize(("limit", "posts", "code"), [(None, 4, 1), ("1", 1, 3), ("2", 2, 3)])
def test_every_request_that_leaves_counts_against_the_request_limit(
        tmp_path: Path, limit: str | None, posts: int, code: int) -> None:
    """Defect (audit): under `-L requests=1` a provider's 503s were retried three times: four
    POSTs reached the server. Each retry is a request that leaves: it reserves its place in
    the run's budget first, and one refused is not sent (outcome budget, exit 3)."""
    from tests.servers import Reply
    from tests.servers import ScriptedServer

    with ScriptedServer() as server:
        server.script(*[Reply(status=503, body={"error": {"message": "busy"}},
                              headers={"Retry-After": "0"})] * 4)
        cfg = tmp_path / "dsh.toml"
        cfg.write_text(tomli_w.dumps({
            "autoload": False, "sessions_dir": str(tmp_path / "s"),
            "models": {"openai:flaky": {"base_url": server.url + "/v1", "retries": 3,
                                        "retry_base": 0.01, "retry_cap": 0.02}}}))
        env = clean_env(tmp_path, OPENAI_API_KEY="sk-test-retries-0123456789")
        args = ["--config", str(cfg), "run", "-m", "openai:flaky"]
        if limit is not None:
            args += ["-L", f"requests={limit}"]
        r = run(env, *args, "hi")
        received = len(server.received)
    assert received == posts, r.stderr
    assert r.returncode == code, r.stderr
    if limit is not None:
        assert f"model requests limit reached ({limit}/{limit})" in r.stderr
    [ledger] = (tmp_path / "s").glob("*.jsonl")
    assert ledger.read_text().splitlines()  # the session still loads


# -- `sessions show` and `run --session` read a ledger alike -------------------------------------

VALUES = st.sampled_from([None, True, 0, -1, 1.5, "x", "", [], {}, [1], {"a": 1}])


@pytest.fixture(scope="module")
def sample_ledger(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real session with a compaction in the middle: two turns of a scripted model, then
    `dsh sessions compact`, then a third turn."""
    tmp = tmp_path_factory.mktemp("ledger")
    cfg = tmp / "dsh.toml"
    cfg.write_text(f'autoload = false\nsessions_dir = "{tmp / "s"}"\n')
    env = clean_env(tmp, DSH_CONFIG=str(cfg))
    first = run(env, "run", "-m", "echo", "one")
    assert first.returncode == 0, first.stderr
    [path] = (tmp / "s").glob("*.jsonl")
    sid = path.stem
    for text in ("three", "four"):
        assert run(env, "run", "--session", sid, "-m", "echo", text).returncode == 0
    from dsh.core.messages import Message
    from dsh.ledger.events import ContextCompacted
    from dsh.ledger.store import JsonlStore

    with JsonlStore(tmp / "s").open(sid) as ledger:  # as a compaction strategy records one
        ledger.append(ContextCompacted, start=0, end=2,
                      messages=(Message(role="user", content="summary"),),
                      strategy="summarize", plugin="dsh", reason="manual",
                      tokens_before=40, tokens_after=10)
    assert run(env, "run", "--session", sid, "-m", "echo", "five").returncode == 0
    data = path.read_bytes()
    assert b'"context/compacted"' in data
    return data


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_resume_and_show_accept_the_same_lines(sample_ledger: bytes, data: st.DataObject) -> None:
    """Defect: a `context/compacted` line with `"strategy": null` (or a bad `tokens_before`,
    `plugin`, `summary_session`) was refused by `dsh sessions show` and accepted by `dsh run
    --session`, whose fast path reads only the fields it projects. A property over every line
    and field of a real session: resuming (raw path) refuses a damaged middle line exactly when
    reading it does."""
    import tempfile

    from dsh.core.errors import DshError
    from dsh.ledger.store import JsonlStore

    lines = sample_ledger.decode().splitlines()
    i = data.draw(st.integers(0, len(lines) - 2), label="line")  # not the last (torn tail)
    d = json.loads(lines[i])
    keys = sorted(k for k in d if k not in ("seq", "ts", "session", "v"))
    if d["type"] == "context/compacted":
        keys = [k for k in keys if k not in ("start", "end")] or keys
    key = data.draw(st.sampled_from(keys or ["type"]), label="key")
    d[key] = data.draw(VALUES, label="value")
    lines[i] = json.dumps(d)
    with tempfile.TemporaryDirectory() as tmp:
        store = JsonlStore(Path(tmp))
        sid = json.loads(lines[0])["session"]
        store.path(sid).write_text("\n".join(lines) + "\n")
        try:
            store.read(sid)
            shown = None
        except DshError as exc:
            shown = type(exc).__name__
        try:
            store.open(sid).close()
            resumed = None
        except DshError as exc:
            resumed = type(exc).__name__
    assert (shown is None) == (resumed is None), (key, d[key], shown, resumed)


def test_show_and_resume_refuse_a_bad_compaction_field_alike(sample_ledger: bytes,
                                                             tmp_path: Path) -> None:
    lines = sample_ledger.decode().splitlines()
    i = next(n for n, x in enumerate(lines) if '"context/compacted"' in x)
    d = json.loads(lines[i])
    d["strategy"] = None
    lines[i] = json.dumps(d)
    sid = d["session"]
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / f"{sid}.jsonl").write_text("\n".join(lines) + "\n")
    cfg = tmp_path / "dsh.toml"
    cfg.write_text(f'autoload = false\nsessions_dir = "{tmp_path / "s"}"\n')
    env = clean_env(tmp_path, DSH_CONFIG=str(cfg))
    show = run(env, "sessions", "show", sid)
    resume = run(env, "run", "--session", sid, "-m", "echo", "again")
    assert show.returncode == resume.returncode == 1
    assert one_error_line(show.stderr) == one_error_line(resume.stderr)
    assert f":{i + 1}: invalid 'context/compacted' event" in show.stderr
