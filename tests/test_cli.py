"""The command line through click's CliRunner: every command, exit codes, config errors.

Real pipelines (stdin, ``| head -1``, SIGINT) are in test_cli_pipes.py.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from click.testing import Result

from dsh import hookimpl
from dsh.cli.root import cli
from dsh.host.runcontext import context


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Path]:
    """``cfg(text)``: write the config file DSH_CONFIG points at (autoload off by default)."""
    path = tmp_path / "dsh.toml"
    monkeypatch.setenv("DSH_CONFIG", str(path))

    def write(text: str = "", autoload: bool = False) -> Path:
        path.write_text(("autoload = false\n" if not autoload else "") + text)
        return path

    write()
    return write


@pytest.fixture
def dsh(cfg: Callable[..., Path]) -> Callable[..., Result]:
    """``dsh(*args, input=None)``: invoke the CLI, with stdout and stderr kept apart."""
    runner = CliRunner()

    def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None
               ) -> Result:
        return runner.invoke(cli, list(args), input=input, env=env, catch_exceptions=False)

    return invoke


def sessions_dir() -> Path:
    return Path(os.environ["DSH_HOME"]) / "sessions"


def ledger(session: str) -> list[dict[str, Any]]:
    path = sessions_dir() / f"{session}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def tools_plugin(plugin_module: Callable[..., str]) -> str:
    """A plugin with an ``add`` tool and an ``approved`` tool reporting ``approve_all``."""

    @hookimpl
    def register_tools(register: Any) -> None:
        def add(a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

        def approved() -> str:
            """Whether tool calls are approved without asking."""
            return str(context().approve_all)

        register(add)
        register(approved)

    return plugin_module(register_tools=register_tools)


# --------------------------------------------------------------------------------------------
# dsh run: prompt, output modes
# --------------------------------------------------------------------------------------------


def test_run_prints_only_the_answer(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", "hello there")
    assert r.exit_code == 0
    assert r.stdout == "hello there\n"
    assert r.stderr == ""


def test_run_stdin_becomes_a_block_after_the_argument(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", "summarise:", input="line 1\nline 2\n")
    assert r.exit_code == 0
    assert r.stdout == "summarise:\n\n<stdin>\nline 1\nline 2\n</stdin>\n"


def test_run_stdin_alone_is_the_prompt(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", input="only stdin\n")
    assert (r.exit_code, r.stdout) == (0, "only stdin\n")


def test_run_without_prompt_is_a_usage_error(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", input="  \n")
    assert r.exit_code == 2
    assert "no prompt" in r.stderr
    assert r.stdout == ""


def test_run_json_object(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", "--json", "hi")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["output"] == "hi"
    assert data["outcome"] == "completed"
    assert data["steps"] == 1
    assert set(data["usage"]) == {"input_tokens", "output_tokens"}
    assert Path(data["path"]) == sessions_dir() / f"{data['session']}.jsonl"
    assert [e["type"] for e in ledger(data["session"])][-1] == "turn/end"


def test_run_events_lines_match_the_ledger(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", "--events", "hello big world")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    first, last = json.loads(lines[0]), json.loads(lines[-1])
    assert first["type"] == "session" and first["model"] == "echo"
    assert last["type"] == "result" and last["outcome"] == "completed"
    assert last["session"] == first["session"]
    # Persistent events are the ledger's lines, byte for byte, in order.
    path = sessions_dir() / f"{first['session']}.jsonl"
    persistent = [line for line in lines[1:-1] if '"seq":' in line]
    assert persistent == path.read_text().splitlines()
    deltas = [json.loads(x)["delta"] for x in lines if '"llm/stream"' in x]
    assert "".join(deltas) == "hello big world" and len(deltas) == 3


def test_run_events_end_with_a_result_line_on_error(dsh: Callable[..., Result],
                                                     script: Callable[..., str]) -> None:
    r = dsh("run", "-m", script({"error": "boom"}), "--events", "hi")
    assert r.exit_code == 1
    last = json.loads(r.stdout.splitlines()[-1])
    assert last["type"] == "result" and last["outcome"] == "error"
    assert "boom" in last["reason"]


def test_run_stream_prints_every_steps_text(dsh: Callable[..., Result],
                                            script: Callable[..., str],
                                            cfg: Callable[..., Path],
                                            plugin_module: Callable[..., str]) -> None:
    cfg(f'load = ["{tools_plugin(plugin_module)}"]\n')
    model = script({"text": "let me add", "tool_calls": [{"name": "add",
                                                          "arguments": {"a": 1, "b": 2}}]},
                   {"text": "it is 3"})
    streamed = dsh("run", "-m", model, "--stream", "add")
    assert (streamed.exit_code, streamed.stdout) == (0, "let me add\nit is 3\n")
    plain = dsh("run", "-m", model, "--no-stream", "add")
    assert (plain.exit_code, plain.stdout) == (0, "it is 3\n")


@pytest.mark.parametrize("args", [["--json", "--events"], ["--stream", "--json"],
                                  ["-c", "--session", "x"], ["--no-save", "-c"]])
def test_run_conflicting_options(dsh: Callable[..., Result], args: list[str]) -> None:
    r = dsh("run", "-m", "echo", *args, "hi")
    assert r.exit_code == 2
    assert "cannot" in r.stderr


# --------------------------------------------------------------------------------------------
# dsh run: exit codes
# --------------------------------------------------------------------------------------------


def test_run_provider_error_exits_1(dsh: Callable[..., Result],
                                    script: Callable[..., str]) -> None:
    r = dsh("run", "-m", script({"error": "boom"}), "hi")
    assert r.exit_code == 1
    assert r.stdout == ""
    assert r.stderr == "dsh: error: scripted: boom\n"


def test_run_step_limit_exits_3_with_partial_output(
        dsh: Callable[..., Result], script: Callable[..., str], cfg: Callable[..., Path],
        plugin_module: Callable[..., str]) -> None:
    cfg(f'load = ["{tools_plugin(plugin_module)}"]\n')
    loop = {"text": "partial", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]}
    r = dsh("run", "-m", script(loop, loop), "--max-steps", "1", "go")
    assert r.exit_code == 3
    assert r.stdout == "partial\n"
    assert "step limit reached" in r.stderr


def test_run_rejected_by_plugin_exits_4(dsh: Callable[..., Result], cfg: Callable[..., Path],
                                        plugin_module: Callable[..., str]) -> None:
    @hookimpl
    def pre_step(step: Any) -> None:
        step.reject("no")

    cfg(f'load = ["{plugin_module(pre_step=pre_step)}"]\n')
    r = dsh("run", "-m", "echo", "--json", "hi")
    assert r.exit_code == 4
    data = json.loads(r.stdout)
    assert (data["outcome"], data["reason"]) == ("rejected", "no")
    assert "step/rejected" in [e["type"] for e in ledger(data["session"])]


def test_run_unknown_model_exits_2_with_a_json_result(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "nope:x", "--json", "hi")
    assert r.exit_code == 2
    assert json.loads(r.stdout)["outcome"] == "error"
    assert r.stderr.startswith("dsh: error: unknown model 'nope:x'")
    assert "Traceback" not in r.stderr


def test_run_unknown_agent_exits_2(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-a", "ghost", "-m", "echo", "hi")
    assert r.exit_code == 2
    assert "unknown agent 'ghost'" in r.stderr


def test_run_bad_toml_exits_2_naming_the_file(dsh: Callable[..., Result],
                                              cfg: Callable[..., Path]) -> None:
    path = cfg("model = \n")
    r = dsh("run", "-m", "echo", "hi")
    assert r.exit_code == 2
    assert r.stderr.startswith(f"dsh: error: {path}: invalid TOML")
    assert "line 2" in r.stderr


# --------------------------------------------------------------------------------------------
# dsh run: sessions and agent overrides
# --------------------------------------------------------------------------------------------


def _json(r: Result) -> dict[str, Any]:
    assert r.exit_code == 0, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def test_run_continue_and_session_resume(dsh: Callable[..., Result]) -> None:
    first = _json(dsh("run", "-m", "echo", "--json", "one"))
    second = _json(dsh("run", "-m", "echo", "--json", "-c", "two"))
    assert second["session"] == first["session"]
    third = _json(dsh("run", "-m", "echo", "--json", "--session", first["session"][:17],
                      "three"))
    assert third["session"] == first["session"]
    turns = [e for e in ledger(first["session"]) if e["type"] == "turn/end"]
    assert len(turns) == 3


def test_run_continue_picks_the_newest_of_the_same_second(dsh: Callable[..., Result]) -> None:
    # Session ids sort by creation to the second; the newest must win within a second too.
    for _ in range(3):
        older = _json(dsh("run", "-m", "echo", "--json", "older"))["session"]
        newer = _json(dsh("run", "-m", "echo", "--json", "newer"))["session"]
        cont = _json(dsh("run", "-m", "echo", "--json", "-c", "again"))["session"]
        assert cont == newer != older


def test_run_continue_without_a_session_starts_one(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", "-c", "hi")
    assert (r.exit_code, r.stdout) == (0, "hi\n")
    assert "starting a new one" in r.stderr


def test_run_no_save_writes_nothing(dsh: Callable[..., Result]) -> None:
    data = _json(dsh("run", "-m", "echo", "--no-save", "--json", "hi"))
    assert data["path"] is None and data["output"] == "hi"
    assert not sessions_dir().exists() or not list(sessions_dir().iterdir())


def test_run_overrides_reach_the_ledger(dsh: Callable[..., Result], cfg: Callable[..., Path],
                                        plugin_module: Callable[..., str]) -> None:
    cfg(f'load = ["{tools_plugin(plugin_module)}"]\n')
    data = _json(dsh("run", "-m", "echo", "--json", "-s", "be brief", "-T", "add",
                     "-o", "temperature=0.2", "-o", "style=terse", "hi"))
    start = ledger(data["session"])[0]
    assert start["system"] == "be brief"
    assert [t["name"] for t in start["tools"]] == ["add"]
    assert start["options"] == {"temperature": 0.2, "style": "terse"}


def test_run_unknown_tool_is_a_usage_error(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", "-T", "nope", "hi")
    assert r.exit_code == 2
    assert "--tool: unknown tool 'nope' (available: " in r.stderr


def test_run_bad_option_pair(dsh: Callable[..., Result]) -> None:
    r = dsh("run", "-m", "echo", "-o", "temperature", "hi")
    assert r.exit_code == 2
    assert "KEY=VALUE" in r.stderr


def test_run_yes_approves_tool_calls(dsh: Callable[..., Result], script: Callable[..., str],
                                     cfg: Callable[..., Path],
                                     plugin_module: Callable[..., str]) -> None:
    cfg(f'load = ["{tools_plugin(plugin_module)}"]\n')
    model = script({"tool_calls": [{"name": "approved"}]}, {"text": "ok"})
    outputs = []
    for extra in ([], ["--yes"]):
        data = _json(dsh("run", "-m", model, "--json", *extra, "go"))
        outputs += [e["output"] for e in ledger(data["session"]) if e["type"] == "tool/result"]
    assert outputs == ["False", "True"]


# --------------------------------------------------------------------------------------------
# dsh sessions
# --------------------------------------------------------------------------------------------


@pytest.fixture
def two_sessions(dsh: Callable[..., Result], script: Callable[..., str],
                 cfg: Callable[..., Path], plugin_module: Callable[..., str]) -> list[str]:
    cfg(f'load = ["{tools_plugin(plugin_module)}"]\n[agents.coder]\nmodel = "echo"\n')
    model = script({"text": "adding", "tool_calls": [{"name": "add",
                                                      "arguments": {"a": 2, "b": 3}}]},
                   {"text": "five"})
    a = _json(dsh("run", "-m", model, "--json", "what is 2+3?"))["session"]
    b = _json(dsh("run", "-a", "coder", "--json", "second session"))["session"]
    return [a, b]


def test_sessions_list_newest_first(dsh: Callable[..., Result], two_sessions: list[str]) -> None:
    r = dsh("sessions", "list")
    assert r.exit_code == 0
    header, *rows = r.stdout.splitlines()
    assert header.split()[:5] == ["ID", "AGENT", "MODEL", "STARTED", "TURNS"]
    assert [row.split()[0] for row in rows] == two_sessions[::-1]
    assert rows[0].split()[1:3] == ["coder", "echo"]
    assert rows[1].endswith("what is 2+3?")


def test_sessions_list_json_filter_and_limit(dsh: Callable[..., Result],
                                             two_sessions: list[str]) -> None:
    data = json.loads(dsh("sessions", "list", "--json").stdout)
    assert [d["id"] for d in data] == two_sessions[::-1]
    assert data[1]["first_prompt"] == "what is 2+3?" and data[1]["turns"] == 1
    only = json.loads(dsh("sessions", "list", "--json", "-a", "default").stdout)
    assert [d["id"] for d in only] == two_sessions[:1]
    assert len(json.loads(dsh("sessions", "list", "--json", "-n", "1").stdout)) == 1


def test_sessions_show_trajectory(dsh: Callable[..., Result], two_sessions: list[str]) -> None:
    r = dsh("sessions", "show", two_sessions[0])
    assert r.exit_code == 0
    out = r.stdout
    order = [out.index(x) for x in ("USER", "what is 2+3?", "ASSISTANT", "adding",
                                    '→ add {"a": 2, "b": 3}', "TOOL add", "five",
                                    "turn 1 completed")]
    assert order == sorted(order)
    assert "\x1b[" not in out  # not a terminal: no colour


def test_sessions_show_latest_and_unknown(dsh: Callable[..., Result],
                                          two_sessions: list[str]) -> None:
    assert "second session" in dsh("sessions", "show", "latest").stdout
    r = dsh("sessions", "show", "19990101")
    assert r.exit_code == 2
    assert "no session '19990101'" in r.stderr


def test_sessions_export(dsh: Callable[..., Result], two_sessions: list[str],
                         tmp_path: Path) -> None:
    sid = two_sessions[0]
    jsonl = dsh("sessions", "export", sid, "--format", "jsonl")
    assert jsonl.stdout == (sessions_dir() / f"{sid}.jsonl").read_text()
    md = dsh("sessions", "export", sid, "--format", "markdown").stdout
    assert md.startswith(f"# Session {sid}\n")
    assert "**Tool call** `add`" in md and "## Turn 1" in md
    out = tmp_path / "x.md"
    r = dsh("sessions", "export", sid, "--output", str(out))
    assert r.stdout == "" and out.read_text() == md


def test_sessions_path_and_rm(dsh: Callable[..., Result], two_sessions: list[str]) -> None:
    sid = two_sessions[0]
    path = Path(dsh("sessions", "path", sid).stdout.strip())
    assert path == sessions_dir() / f"{sid}.jsonl" and path.exists()
    r = dsh("sessions", "rm", sid)
    assert r.exit_code == 0 and not path.exists()
    assert dsh("sessions", "rm", sid).exit_code == 2


# --------------------------------------------------------------------------------------------
# dsh plugins / tools / models / agents
# --------------------------------------------------------------------------------------------


@hookimpl
def register_hello(cli: click.Group) -> None:
    """A plugin's ``register_commands``: adds ``dsh hello``."""

    @cli.command()
    def hello() -> None:
        """Say hello."""
        click.echo("hello from a plugin")


def test_plugins_lists_hooks_agents_commands_and_errors(
        dsh: Callable[..., Result], cfg: Callable[..., Path],
        plugin_module: Callable[..., str]) -> None:
    tools = tools_plugin(plugin_module)
    cmds = plugin_module(register_commands=register_hello)
    cfg(f'load = ["{tools}", "{cmds}", "dsh_no_such_module"]\n'
        f'[agents.coder]\nplugins = ["{cmds}"]\n')
    r = dsh("plugins", "--json")
    assert r.exit_code == 0
    rows = {p["name"]: p for p in json.loads(r.stdout)}
    assert rows[tools]["hooks"] == ["register_tools"]
    assert rows[tools]["agents"] == ["default"]
    assert rows[cmds]["agents"] == ["default", "coder"]
    assert rows[cmds]["commands"] == ["hello"]
    assert "ModuleNotFoundError" in rows["dsh_no_such_module"]["error"]
    assert "dsh.loop" not in rows
    text = dsh("plugins", "--all").stdout
    assert "dsh.loop  built-in" in text and "  commands: hello" in text


def test_plugin_command_runs_but_is_not_in_help(dsh: Callable[..., Result],
                                                cfg: Callable[..., Path],
                                                plugin_module: Callable[..., str]) -> None:
    cfg(f'load = ["{plugin_module(register_commands=register_hello)}"]\n')
    assert dsh("hello").stdout == "hello from a plugin\n"
    assert "hello" not in dsh("--help").stdout
    assert "Say hello." in dsh("--help", env={"DSH_HELP_PLUGINS": "1"}).stdout
    r = dsh("nosuch")
    assert r.exit_code == 2 and "No such command" in r.stderr


@hookimpl
def register_impostors(cli: click.Group) -> None:
    """A hostile plugin's ``register_commands``: commands named like built-in ones."""
    from dsh.cli.root import LAZY_COMMANDS

    for name in ("run", *LAZY_COMMANDS):
        cli.command(name, help="Impostor.")(lambda: click.echo("impostor"))


def test_a_plugin_cannot_replace_a_built_in_command(dsh: Callable[..., Result],
                                                    cfg: Callable[..., Path],
                                                    plugin_module: Callable[..., str]) -> None:
    """Built-in commands win over a plugin's of the same name, whether they are defined in
    dsh/cli/root.py (run) or imported lazily from dsh/cli/commands/ (sessions, config, chat, …)."""
    name = plugin_module(register_commands=register_impostors)
    cfg(f'load = ["{name}"]\n')
    assert dsh("config", "path").stdout == f"{os.environ['DSH_CONFIG']}\n"
    assert dsh("run", "-m", "echo", "hi").stdout == "hi\n"
    assert "impostor" not in dsh("sessions", "list").output
    assert "Talk with an agent" in dsh("chat", "--help").stdout
    rows = {p["name"]: p for p in json.loads(dsh("plugins", "--json").stdout)}
    assert rows[name]["commands"] == []
    helped = dsh("--help", env={"DSH_HELP_PLUGINS": "1"}).stdout
    assert "Impostor." not in helped
    assert re.search(r"\n  sessions +List, show", helped), helped


def test_tools_lists_an_agents_tools(dsh: Callable[..., Result], cfg: Callable[..., Path],
                                     plugin_module: Callable[..., str]) -> None:
    name = tools_plugin(plugin_module)
    cfg(f'load = ["{name}"]\n[agents.calc]\ntools = ["add"]\n')
    r = dsh("tools", "-a", "calc")
    assert r.stdout == f"add(a: integer, b: integer)  [{name}]\n  Add two numbers.\n"
    everything = json.loads(dsh("tools", "--json").stdout)
    assert [t["name"] for t in everything] == ["add", "approved"]


def test_models_lists_adapters_and_configured(dsh: Callable[..., Result],
                                              cfg: Callable[..., Path]) -> None:
    cfg('model = "local"\n[models.local]\nadapter = "openai"\nmodel = "llama3"\n')
    data = json.loads(dsh("models", "--json").stdout)
    assert {"echo", "scripted", "openai", "anthropic"} <= {a["prefix"] for a in data["adapters"]}
    assert data["configured"] == [{"id": "local", "adapter": "openai"}]
    assert data["default"] == "local"
    assert dsh("models").stdout.splitlines()[-1].startswith("default: local (set in ")


def test_agents_lists_configured_agents(dsh: Callable[..., Result],
                                        cfg: Callable[..., Path]) -> None:
    cfg('agent = "coder"\n[agents.coder]\nmodel = "echo"\nmax_steps = 7\nsystem = "Code."\n'
        '[agents.writer]\nmodel = "scripted:x.json"\n')
    rows = json.loads(dsh("agents", "--json").stdout)
    assert [(r["name"], r["default"], r["model"]) for r in rows] == [
        ("coder", True, "echo"), ("writer", False, "scripted:x.json")]
    assert rows[0]["max_steps"] == 7
    assert rows[0]["prompt"][0]["plugin"] == "config"
    assert dsh("agents").stdout.startswith("coder (default)\n  model: echo  max_steps: 7\n")


# --------------------------------------------------------------------------------------------
# dsh config
# --------------------------------------------------------------------------------------------


def test_config_path_order(dsh: Callable[..., Result], tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = tmp_path / "explicit.toml"
    assert dsh("--config", str(explicit), "config", "path").stdout.strip() == str(explicit)
    assert dsh("config", "path").stdout.strip() == os.environ["DSH_CONFIG"]
    monkeypatch.delenv("DSH_CONFIG")
    xdg = Path(os.environ["XDG_CONFIG_HOME"]) / "dsh" / "config.toml"
    assert dsh("config", "path").stdout.strip() == str(xdg)


def test_config_init_writes_a_valid_private_file(dsh: Callable[..., Result],
                                                 tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "config.toml"
    r = dsh("--config", str(path), "config", "init")
    assert r.exit_code == 0 and path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("# dsh configuration")
    assert dsh("--config", str(path), "config", "validate").stdout == f"ok: {path}\n"
    again = dsh("--config", str(path), "config", "init")
    assert again.exit_code == 2 and "--force" in again.stderr
    assert dsh("--config", str(path), "config", "init", "--force").exit_code == 0
    r = dsh("--config", str(path), "config", "set", "max_steps", "9")
    assert r.exit_code == 0 and "comments were not kept" not in r.stderr
    assert "# dsh configuration" in path.read_text()  # edited in place (tomlkit)
    assert tomllib.loads(path.read_text()) == {"model": "echo", "agent": "default",
                                               "max_steps": 9}


def test_config_set_keeps_other_keys(dsh: Callable[..., Result], cfg: Callable[..., Path]) -> None:
    path = cfg('model = "echo"\n[plugins.shell]\ntimeout = 30\n')
    for key, value in [("max_steps", "7"), ("agents.coder.model", "openai:gpt-4o-mini"),
                       ("agents.coder.tools", '["read_file", "ls"]'), ("strict_plugins", "true"),
                       ('models."gpt-4.1".base_url', "http://localhost:8080/v1")]:
        r = dsh("config", "set", key, value)
        assert r.exit_code == 0, r.stderr
    data = tomllib.loads(path.read_text())
    assert data == {
        "autoload": False, "model": "echo", "max_steps": 7, "strict_plugins": True,
        "plugins": {"shell": {"timeout": 30}},
        "agents": {"coder": {"model": "openai:gpt-4o-mini", "tools": ["read_file", "ls"]}},
        "models": {"gpt-4.1": {"base_url": "http://localhost:8080/v1"}},
    }


def test_config_set_creates_a_missing_file(dsh: Callable[..., Result], tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "c.toml"
    assert dsh("--config", str(path), "config", "set", "model", "echo").exit_code == 0
    assert tomllib.loads(path.read_text()) == {"model": "echo"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(("key", "value", "message"), [
    ("modle", "echo", "unknown key 'modle'; did you mean 'model'?"),
    ("max_steps", "many", "key 'max_steps': expected an integer, got string 'many'"),
    ("agents.coder.max_step", "3", "unknown key 'agents.coder.max_step'; did you mean"),
    ("model.x", "1", "model is not a table"),
])
def test_config_set_rejects_invalid_results(dsh: Callable[..., Result], cfg: Callable[..., Path],
                                            key: str, value: str, message: str) -> None:
    path = cfg('model = "echo"\n')
    before = path.read_text()
    r = dsh("config", "set", key, value)
    assert r.exit_code == 2
    assert message in r.stderr
    assert path.read_text() == before


def test_config_show_prints_the_effective_config(dsh: Callable[..., Result],
                                                 cfg: Callable[..., Path]) -> None:
    cfg('model = "scripted:x.json"\n[agents.coder]\nmax_steps = 5\n')
    r = dsh("config", "show")
    assert r.exit_code == 0
    data = tomllib.loads(r.stdout)
    assert data["model"] == "scripted:x.json" and data["max_steps"] == 20
    assert data["agents"]["coder"]["max_steps"] == 5
    assert "system" not in data["agents"]["coder"]  # unset optional keys are left out
    assert data["autoload"] is False


@pytest.mark.parametrize(("text", "message"), [
    ("model = \n", "invalid TOML: Invalid value (at line 2, column 9)"),
    ("modle = 'echo'\n", ":2: unknown key 'modle'; did you mean 'model'?"),
    ("[agents.coder]\nmax_steps = \"x\"\n",
     ":3: key 'agents.coder.max_steps': expected an integer, got string 'x'"),
    ("disable = 'dsh.prompt'\n", ":2: key 'disable': expected an array, got string"),
    ("strict_plugins = 'no'\n", ":2: key 'strict_plugins': expected a boolean"),
    ("[limits]\nstep = 3\n", ":3: unknown key 'limits.step'; did you mean 'steps'?"),
])
def test_config_validate_errors_name_file_and_key(dsh: Callable[..., Result],
                                                   cfg: Callable[..., Path],
                                                   text: str, message: str) -> None:
    path = cfg(text)
    r = dsh("config", "validate")
    assert r.exit_code == 2
    assert r.stderr.startswith(f"dsh: error: {path}")
    assert message in r.stderr
    assert r.stdout == ""


def test_config_validate_assembles_agents(dsh: Callable[..., Result],
                                          cfg: Callable[..., Path]) -> None:
    cfg('[agents.coder]\nplugins = ["ghost"]\n')
    r = dsh("config", "validate")
    assert r.exit_code == 2 and "unknown plugin(s) ghost" in r.stderr
    cfg('[agents.coder]\nmodel = "nope:x"\n')
    r = dsh("config", "validate")
    assert r.exit_code == 2 and "unknown model 'nope:x'" in r.stderr
    cfg('[agents.coder]\nmodel = "echo"\n')
    assert dsh("config", "validate").exit_code == 0


def test_config_validate_missing_file(dsh: Callable[..., Result], tmp_path: Path) -> None:
    r = dsh("--config", str(tmp_path / "none.toml"), "config", "validate")
    assert r.exit_code == 2 and "config file not found" in r.stderr


# --------------------------------------------------------------------------------------------
# The command tree itself
# --------------------------------------------------------------------------------------------


def _walk(cmd: click.Command, path: str = "dsh") -> list[tuple[str, click.Command]]:
    found = [(path, cmd)]
    if isinstance(cmd, click.Group):  # list_commands: the lazily imported ones too
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, f"{path} {name}"
            found += _walk(sub, f"{path} {name}")
    return found


def test_every_command_and_option_is_documented_in_help() -> None:
    commands = _walk(cli)
    assert len(commands) >= 18
    for path, cmd in commands:
        assert cmd.help, f"{path} has no docstring"
        for param in cmd.params:
            if isinstance(param, click.Option):
                assert param.help, f"{path} {param.opts} has no help"


def test_version(dsh: Callable[..., Result]) -> None:
    from dsh._version import __version__

    assert dsh("--version").stdout == f"dsh {__version__}\n"


def test_docs_cli_md_lists_every_command_and_option() -> None:
    import re

    text = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    sections = {m.group(1): m.group(2) for m in re.finditer(
        r"^### `(dsh[^`]*)`\n(.*?)(?=^#{1,3} |\Z)", text, re.M | re.S)}
    for path, cmd in _walk(cli):
        assert path in sections, f"docs/cli.md has no section for `{path}`"
        for param in cmd.params:
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--"):
                    assert f"`{opt}`" in sections[path], f"`{path}` does not document {opt}"


def test_docs_config_md_lists_every_key() -> None:
    import attrs

    from dsh.config.loader import AgentConfig
    from dsh.config.loader import Config
    from dsh.host.runcontext import Limits

    text = (Path(__file__).parent.parent / "docs" / "config.md").read_text()
    for cls in (Config, AgentConfig, Limits):
        for field in attrs.fields(cls):
            if field.name != "source":
                assert f"`{field.name}`" in text, f"docs/config.md misses {field.name}"


# --------------------------------------------------------------------------------------------
# Sub-agent sessions
# --------------------------------------------------------------------------------------------


def test_sub_agent_sessions_nest_in_show_and_are_not_latest(
        dsh: Callable[..., Result], cfg: Callable[..., Path], script: Callable[..., str]) -> None:
    lead = script({"text": "asking", "tool_calls": [{"name": "ask_researcher",
                                                     "arguments": {"prompt": "find x"}}]},
                  {"text": "done"})
    cfg(f'agent = "lead"\n[agents.lead]\nmodel = "{lead.replace(chr(92), "/")}"\n'
        'subagents = ["researcher"]\n[agents.researcher]\nmodel = "echo"\n'
        'description = "Finds facts."\n')
    data = _json(dsh("run", "--json", "go"))
    assert data["output"] == "done"
    listing = json.loads(dsh("sessions", "list", "--json").stdout)
    child = next(s for s in listing if s["parent"] == data["session"])
    assert child["agent"] == "researcher"
    shown = dsh("sessions", "show", "latest").stdout  # the lead's, not the newer child's
    assert shown.startswith(f"session {data['session']} · cwd ")
    assert shown.splitlines()[1].startswith("━━ turn 1 ━━ agent lead")
    assert f"    │ ━━ turn 1 ━━ agent researcher · model echo · mode ask · sub-agent of session " \
           f"{data['session']}" in shown
    assert "    │   find x" in shown


def test_run_limit_option_sets_budgets(tmp_path, monkeypatch):
    """`-L requests=2` stops a tool loop after two model requests: exit 3, output printed."""
    import json as _json

    from click.testing import CliRunner

    from dsh.cli.root import cli

    monkeypatch.setenv("DSH_HOME", str(tmp_path / "home"))
    call = {"text": "partial", "tool_calls": [{"name": "nope", "arguments": {}}]}
    script = tmp_path / "s.json"
    script.write_text(_json.dumps({"responses": [call, call, call, {"text": "end"}]}))
    runner = CliRunner()
    result = runner.invoke(cli, ["run", "-m", f"scripted:{script}", "-L", "requests=2", "go"])
    assert result.exit_code == 3, result.stderr
    assert result.stdout == "partial\n"
    assert "model requests limit reached (2/2)" in result.stderr
    bad = runner.invoke(cli, ["run", "-m", "echo", "-L", "reqests=2", "go"])
    assert bad.exit_code == 2 and "did you mean 'requests'" in bad.stderr


def test_names_moved_to_dsh_commands_still_resolve_from_dsh_cli() -> None:
    """A plugin that imported a built-in command (or ``newest``) from dsh.cli.root before the
    commands got modules of their own (dsh/cli/commands/) gets the same object; other names are
    still an AttributeError."""
    import importlib

    import dsh.cli.root

    moved = {**dsh.cli.root.LAZY_COMMANDS, **dsh.cli.root.MOVED}
    assert {"sessions", "config", "chat", "batch", "newest"} <= set(moved)
    for name, target in moved.items():
        module, _, attr = target.partition(":")
        assert getattr(dsh.cli, name) is getattr(importlib.import_module(module), attr)
        lazy = dsh.cli.root.LAZY_COMMANDS
        assert isinstance(getattr(dsh.cli, name), click.Command) == (name in lazy)
    missing = "no_such_name"
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        getattr(dsh.cli, missing)
