"""``dsh chat`` (issue 15): under a real pseudo-terminal (pexpect), and in pipelines.

Scripted models and a slow tool loaded from a module on PYTHONPATH; every check of what
happened reads the session's ledger.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import tomli_w

pexpect = pytest.importorskip("pexpect",
                              reason="pexpect is in the test extra: pip install -e '.[test]'")

# The tool waits for the test to release it (a file appears), never for a time: under load a
# timed wait let the tool end before the input meant for "while it runs" arrived (issue 21).
SLOW_TOOL = textwrap.dedent('''
    import os
    import time
    from pathlib import Path
    from dsh.hookspecs import hookimpl

    @hookimpl
    def register_tools(register):
        def slow(seconds: float) -> str:
            """Wait until released (at most a minute).

            :param seconds: what the result says
            """
            release = Path(os.environ["SLOW_GATE"]) / "release"
            deadline = time.monotonic() + 60
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            release.unlink(missing_ok=True)  # one release per call
            return f"waited {seconds}"
        register(slow)

    @hookimpl
    def register_chat_commands(register):
        register("shout", lambda chat, arg: arg.upper() + "!", help="shout it")
''')


#: The prompts as prompt_toolkit draws them (it moves the cursor over the trailing space).
PROMPT = "›"
MORE = "…"
#: A prompt drawn on a line of its own: the next one, not the last drawing of the one before.
NEW_PROMPT = "\n[^\n›]*›"


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        (tmp_path / "slowtool.py").write_text(SLOW_TOOL)
        self.sessions = tmp_path / "sessions"
        self.home = tmp_path / "home"
        self.config = tmp_path / "config.toml"
        self.env = {**os.environ, "DSH_CONFIG": str(self.config), "PYTHONPATH": str(tmp_path),
                    "DSH_HOME": str(self.home), "NO_COLOR": "1", "SLOW_GATE": str(tmp_path),
                    # a terminal that prompt_toolkit drives fully; pexpect does not answer
                    # cursor position requests
                    "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1"}

    def release(self) -> None:
        """Let the running ``slow`` tool return."""
        (self.tmp / "release").touch()

    def configure(self, *responses: dict[str, Any], **extra: Any) -> None:
        script = self.tmp / f"script{len(list(self.tmp.glob('script*')))}.json"
        script.write_text(json.dumps({"responses": list(responses)}))
        self.config.write_text(tomli_w.dumps({
            "model": f"scripted:{script}", "autoload": False, "load": ["slowtool"],
            "sessions_dir": str(self.sessions), **extra}))

    def spawn(self, *args: str) -> Any:
        # A person at a terminal: Ctrl-C is not ignored. A test run started in the background
        # by a non-interactive shell inherits SIGINT ignored, and a child would keep it so.
        import signal

        before = signal.getsignal(signal.SIGINT)
        if before == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            child = pexpect.spawn(sys.executable, ["-m", "dsh", "chat", *args], env=self.env,
                                  encoding="utf-8", timeout=60, dimensions=(40, 200))
        finally:
            if before == signal.SIG_IGN:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        child.expect(PROMPT)
        return child

    def run(self, *args: str, input: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsh", *args], env=self.env, input=input,
                              capture_output=True, text=True, timeout=60)

    def ledger(self) -> list[dict[str, Any]]:
        (path,) = [p for p in self.sessions.glob("*.jsonl")
                   if '"parent"' not in p.read_text().split("\n")[0] or True][:1]
        return [json.loads(x) for x in path.read_text().splitlines()]

    def session_ids(self) -> list[str]:
        return sorted(p.stem for p in self.sessions.glob("*.jsonl"))


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def _kinds(lines: list[dict[str, Any]]) -> list[str]:
    return [d["type"] + (f":{d.get('text') or d.get('output') or ''}"
                         if d["type"] in ("user/message", "tool/result") else "")
            for d in lines]


# -- under a terminal ------------------------------------------------------------------------


def test_typing_while_a_tool_runs_steers_the_same_turn(env: Env) -> None:
    env.configure({"text": "hello there"},
                  {"tool_calls": [{"name": "slow", "arguments": {"seconds": 2.5}}]},
                  {"text": "after steering"})
    child = env.spawn()
    child.sendline("hi")
    child.expect("hello there")
    child.expect(PROMPT)
    child.sendline("wait please")
    child.expect("→ slow")  # the call is shown as it happens; the tool waits for release()
    child.sendline("change of plan")
    child.expect("queued: the agent takes it after the current step")
    env.release()
    child.expect("← slow: ok")
    child.expect("after steering")
    child.expect(PROMPT)
    child.sendeof()
    child.expect("session ")
    child.expect(pexpect.EOF)
    kinds = _kinds(env.ledger())
    second = kinds[kinds.index("user/message:wait please"):]
    assert second[:8] == ["user/message:wait please", "assistant/message", "tool/call",
                          "tool/result:waited 2.5", "step/end", "step/start",
                          "user/message:change of plan", "assistant/message"]
    assert kinds.count("turn/start") == 2  # the steering message did not start a turn


def test_a_follow_up_waits_for_the_end_of_the_turn(env: Env) -> None:
    env.configure({"tool_calls": [{"name": "slow", "arguments": {"seconds": 2}}]},
                  {"text": "first done"}, {"text": "follow-up answered"})
    child = env.spawn()
    child.sendline("go")
    child.expect("→ slow")
    child.sendline("> and then this")
    child.expect("queued for after this turn")
    env.release()
    child.expect("first done")
    child.expect("follow-up answered")
    child.expect(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    lines = env.ledger()
    turns = [d for d in lines if d["type"] == "turn/start"]
    assert len(turns) == 2
    msgs = [d["text"] for d in lines if d["type"] == "user/message"]
    assert msgs == ["go", "and then this"]


def test_ctrl_c_once_aborts_the_step_twice_aborts_at_once(env: Env) -> None:
    env.configure({"tool_calls": [{"name": "slow", "arguments": {"seconds": 2}}]},
                  {"tool_calls": [{"name": "slow", "arguments": {"seconds": 30}}]},
                  {"text": "still alive"})
    child = env.spawn()
    child.sendline("one")
    child.expect("→ slow")  # the tool runs now (it does not poll the cancel: waited for)
    child.sendintr()
    child.expect("interrupted: stopping now")
    env.release()
    child.expect(PROMPT)
    child.sendline("two")
    child.expect("→ slow")
    child.sendintr()
    child.expect("interrupted: stopping now")
    child.sendintr()
    child.expect("aborted")
    child.expect(PROMPT)
    child.sendline("three")
    child.expect("still alive")
    child.expect(PROMPT)
    child.sendintr()  # at the prompt: clears the line, stays
    child.expect(NEW_PROMPT)  # the next prompt (the cleared one is drawn once more first)
    child.sendeof()
    child.expect(pexpect.EOF)
    ends = [d["outcome"] for d in env.ledger() if d["type"] == "turn/end"]
    assert ends == ["aborted", "aborted", "completed"]


def test_commands_inject_model_session_and_a_plugins_command(env: Env) -> None:
    env.configure({"text": "a1"}, {"text": "a2"})
    child = env.spawn()
    child.sendline("/shout hey")
    child.expect("HEY!")
    child.sendline("/inject the sky is green")
    child.expect("context queued")
    child.sendline("/model echo")
    child.expect("model: echo")
    child.sendline("what colour")
    child.expect("what colour\r\n")  # echo answers with the message (the typed line ends
    # with the prompt's cursor moves, not a newline)
    child.expect(PROMPT)
    child.sendline("/session")
    child.expect(r"session (\d\S+)")
    sid = child.match.group(1).strip()
    child.sendline("/nope")
    child.expect("unknown command '/nope'")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    lines = env.ledger()
    assert sid in env.session_ids()
    starts = [d for d in lines if d["type"] == "turn/start"]
    assert starts[0]["model"] == "echo"  # recorded on the turn's start
    kinds = _kinds(lines)
    assert kinds.index("user/message:what colour") > kinds.index("context/injected")
    injected = next(d for d in lines if d["type"] == "context/injected")
    assert injected["text"] == "the sky is green" and injected["source"] == "chat"


def test_multi_line_input_and_history_file_is_private(env: Env) -> None:
    env.configure({"text": "ok"}, {"text": "ok2"})
    child = env.spawn()
    child.sendline("line one \\")
    child.expect(MORE)
    child.sendline("line two")
    child.expect("ok")
    child.expect(PROMPT)
    child.sendline('"""')
    child.sendline("block a")
    child.sendline("block b")
    child.sendline('"""')
    child.expect("ok2")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    msgs = [d["text"] for d in env.ledger() if d["type"] == "user/message"]
    assert msgs == ["line one \nline two", "block a\nblock b"]
    history = env.home / "chat_history"
    assert history.exists()
    assert stat.S_IMODE(history.stat().st_mode) == 0o600


def test_continue_a_chat_with_dsh_run_and_the_other_way_round(env: Env) -> None:
    env.configure({"text": "from chat"}, {"text": "from run"}, {"text": "chat again"})
    child = env.spawn()
    child.sendline("hello")
    child.expect("from chat")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    done = env.run("run", "-c", "and now")
    assert done.returncode == 0 and done.stdout == "from run\n"
    child = env.spawn("-c")
    child.sendline("back")
    child.expect("chat again")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    assert len(env.session_ids()) == 1
    ends = [d for d in env.ledger() if d["type"] == "turn/end"]
    assert len(ends) == 3


# -- without a terminal ----------------------------------------------------------------------


def test_piped_chat_answers_one_message_per_line(env: Env) -> None:
    env.configure({"text": "one"}, {"text": "two"})
    done = env.run("chat", input="first\n\n/session\nsecond\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "one" and out[1].startswith("session ") and out[-1] == "two"
    assert "continue it with" in done.stderr
    msgs = [d["text"] for d in env.ledger() if d["type"] == "user/message"]
    assert msgs == ["first", "second"]


def test_piped_chat_reports_a_failed_turn_in_its_exit_code(env: Env) -> None:
    env.configure({"text": "fine"}, {"error": "model exploded", "status": 500})
    done = env.run("chat", input="a\nb\n")
    assert done.returncode == 1
    assert "model exploded" in done.stderr
    assert done.stdout == "fine\n"


def test_chat_help_lists_every_command(env: Env) -> None:
    env.configure({"text": "x"})
    done = env.run("chat", input="/help\n")
    assert done.returncode == 0
    for name in ("help", "tools", "model", "system", "session", "inject", "stop", "exit",
                 "shout"):
        assert f"/{name}" in done.stdout


def test_the_approval_question_is_answered_at_the_chat_prompt(env: Env) -> None:
    """dsh-shell asks on the terminal in the middle of a turn; the chat's reader of typed
    lines steps aside, so the answer goes to the question, not into the session."""
    pytest.importorskip("dsh_shell", reason="dsh-shell is installed by .ci/run")
    work = env.tmp / "work"
    work.mkdir()
    env.configure(
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch approved"}}]},
        {"text": "made it"},
        load=["slowtool", "dsh_shell"],
        plugins={"shell": {"workspace": str(work), "allow": ["ls"]}})
    child = env.spawn()
    child.sendline("make the file")
    child.expect(r"run `touch approved` in .*\[r\] no, and say why: ")
    child.sendline("y")
    child.expect("made it")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    assert (work / "approved").exists()
    kinds = _kinds(env.ledger())
    assert "user/message:y" not in kinds  # the answer did not become a message


def test_the_question_takes_the_terminal_from_the_prompt_and_gives_it_back(env: Env) -> None:
    """Text typed at the prompt while a tool runs is put aside while dsh-shell asks (the
    prompt lets go of the terminal before the question is written) and is back at the prompt
    afterwards, unsent; the answer goes to the question."""
    pytest.importorskip("dsh_shell", reason="dsh-shell is installed by .ci/run")
    work = env.tmp / "work"
    work.mkdir()
    env.configure(
        {"tool_calls": [{"name": "slow", "arguments": {"seconds": 1}}]},
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch approved"}}]},
        {"text": "made it"}, {"text": "kept it"},
        load=["slowtool", "dsh_shell"],
        plugins={"shell": {"workspace": str(work), "allow": ["ls"]}})
    child = env.spawn()
    child.sendline("go")
    child.expect("→ slow")
    child.expect("↳")  # the prompt while the agent works
    for ch in "zzkeep":  # typed, not sent
        child.send(ch)
        child.expect_exact(ch)
    env.release()
    child.expect(r"run `touch approved` in .*\[r\] no, and say why: ")
    child.send("y\r")
    child.expect("made it")
    child.expect(PROMPT)
    child.expect("zzkeep")  # back at the prompt between turns
    child.send(" now\r")
    child.expect("kept it")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    assert (work / "approved").exists()
    msgs = [d["text"] for d in env.ledger() if d["type"] == "user/message"]
    assert msgs == ["go", "zzkeep now"]


def test_a_write_shows_its_recorded_diff_in_the_chat(env: Env) -> None:
    """The diff under the tool line is the ledger's (what was recorded with the result), with
    the file's escape sequences made visible."""
    pytest.importorskip("dsh_shell", reason="dsh-shell is installed by .ci/run")
    work = env.tmp / "work"
    work.mkdir()
    (work / "app.cfg").write_text("name = demo\nport = 80\n")
    env.configure(
        {"tool_calls": [{"name": "edit_file", "arguments": {
            "path": "app.cfg", "old": "port = 80\n", "new": "port = 8080 \x1b[2J\n"}}]},
        {"text": "edited"},
        load=["slowtool", "dsh_shell"],
        plugins={"shell": {"workspace": str(work)}})
    child = env.spawn("--mode", "auto-edit")
    child.sendline("change the port")
    child.expect(r"± update app\.cfg \(\+1 -1\)")
    child.expect(r"-port = 80")
    child.expect(r"\+port = 8080 \\x1b\[2J")  # shown, never sent as a control
    child.expect("edited")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    assert (work / "app.cfg").read_text() == "name = demo\nport = 8080 \x1b[2J\n"


# -- the default model, as a newcomer meets it ---------------------------------------------


@pytest.mark.parametrize(("env_vars", "expected", "note"), [
    ({}, "echo", True),
    ({"OPENAI_API_KEY": "sk-test-abcdefghijkl"}, "openai:gpt-4o-mini", False),
    ({"ANTHROPIC_API_KEY": "sk-ant-test-abcdefgh"}, "anthropic:claude-haiku-4-5", False),
    ({"OPENAI_API_KEY": "  ", "ANTHROPIC_API_KEY": "sk-ant-test-abcdefgh"},
     "anthropic:claude-haiku-4-5", False),
])
def test_the_default_model_follows_the_environment(tmp_path: Path, env_vars: dict[str, str],
                                                   expected: str, note: bool) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "DSH_CONFIG")}
    env.update(env_vars, DSH_HOME=str(tmp_path / "home"),
               XDG_CONFIG_HOME=str(tmp_path / "xdg"), DSH_LOAD_PLUGINS="")
    models = subprocess.run([sys.executable, "-m", "dsh", "models", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    data = json.loads(models.stdout)
    assert data["default"] == expected
    assert ("no model configured" in data["default_why"]) is True
    if expected == "echo":
        done = subprocess.run([sys.executable, "-m", "dsh", "run", "what is 2+2"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout == "what is 2+2\n"
        assert "no model configured" in done.stderr and "dsh config set model" in done.stderr
        quiet = subprocess.run([sys.executable, "-m", "dsh", "run", "-m", "echo", "x"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert "no model configured" not in quiet.stderr  # chosen on purpose: no note


def test_a_configured_model_wins_over_keys(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('model = "echo"\n')
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-abcdefghijkl", "DSH_CONFIG": str(config),
           "DSH_HOME": str(tmp_path / "home")}
    models = subprocess.run([sys.executable, "-m", "dsh", "models", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    data = json.loads(models.stdout)
    assert data["default"] == "echo" and data["default_why"].startswith("set in ")


def test_a_plugin_can_offer_the_default(make_app: Any, plugin_module: Any) -> None:
    from dsh.hookspecs import hookimpl

    @hookimpl
    def default_model():  # type: ignore[no-untyped-def]
        return "scripted:/nonexistent.json", "the test plugin offers it"

    app = make_app(load=[plugin_module(default_model=default_model)])
    assert app.default_model.id == "scripted:/nonexistent.json"
    assert "the test plugin offers it" in app.default_model.why
    assert not app.default_model.fallback


def test_dsh_llama_offers_the_local_model_only_when_it_can_run() -> None:
    import importlib.util

    dsh_llama = pytest.importorskip("dsh_llama")
    offered = dsh_llama.default_model()
    runnable = importlib.util.find_spec("llama_cpp") is not None and (
        importlib.import_module("dsh_llama.settings").bundled_gguf() is not None)
    assert (offered is not None) == runnable
    if offered:
        assert offered[0] == "local"


def test_stop_and_inject_typed_during_a_turn(env: Env) -> None:
    env.configure({"tool_calls": [{"name": "slow", "arguments": {"seconds": 2}}]},
                  {"text": "next answer"})
    child = env.spawn()
    child.sendline("go")
    child.expect("→ slow")
    child.sendline("/inject remember the milk")
    child.expect("context queued")
    child.sendline("/model echo")
    child.expect("waits for the turn to end")
    child.sendline("/stop")
    child.expect("stopping after the current step")
    env.release()
    child.expect(PROMPT)
    child.sendline("and now")
    child.expect("next answer")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    lines = env.ledger()
    assert [d["outcome"] for d in lines if d["type"] == "turn/end"] == ["stopped", "completed"]
    kinds = _kinds(lines)
    assert kinds.index("context/injected") < kinds.index("user/message:and now")
