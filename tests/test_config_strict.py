"""Configuration is strict and every failure is one clear line (issue 9, section 5).

* Every key of the schema (the attrs classes of dsh.config) given a value of the wrong type is
  one ConfigError naming the file, the dotted key and the expected type — through the library
  (``App.from_config``) and ``dsh config validate`` as a real process (exit 2, one line).
* Limits follow one rule in ``[limits]`` and ``-L``; option values must be JSON-compatible
  wherever they are given; unknown names (``disable``, ``DSH_LOAD_PLUGINS``, ``tools``) are
  errors with a did-you-mean; a misspelt hook implementation is a warning; a configuration
  that leaves an essential hook without an implementation is an error.
* A config file with a UTF-8 byte-order mark is read by every path; ``config set`` writes
  through a symbolic link, keeps the mark and the mode, and refuses what it cannot write.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import tomli_w
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.config.loader import MAX_OPTION_DEPTH
from dsh.config.loader import AgentConfig
from dsh.config.loader import Config
from dsh.config.loader import SandboxSetting
from dsh.config.loader import check_limit
from dsh.config.loader import config_from_dict
from dsh.config.loader import json_problem
from dsh.config.loader import load_config
from dsh.core.errors import ConfigError
from dsh.core.errors import DshError
from dsh.core.errors import PluginError
from dsh.core.errors import PluginWarning
from dsh.core.errors import UsageError
from dsh.hookspecs import hookimpl
from dsh.host.manager import BUILTIN_PLUGINS
from dsh.host.manager import ESSENTIAL_HOOKS
from dsh.host.runcontext import LIMIT_NAMES
from dsh.host.runcontext import Limits
from dsh.run.app import App

DSH = [sys.executable, "-m", "dsh"]
DATE = datetime.date(1979, 5, 27)
BOM = "\ufeff"


def run_dsh(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The process failed with exit 2 and said so in exactly one ``dsh: error:`` line."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsh: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


# --------------------------------------------------------------------------------------------
# The schema, walked: every key, every wrong type
# --------------------------------------------------------------------------------------------


def _kind(tp: Any) -> tuple[str, Any]:
    """``(kind, type)`` of a field: string, boolean, integer, number, array or table, or a
    sandbox policy (a string or a table)."""
    if tp == SandboxSetting:
        return "policy", tp
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    origin = typing.get_origin(tp)
    if tp is str:
        return "string", tp
    if tp is bool:
        return "boolean", tp
    if tp is int:
        return "integer", tp
    if tp is float:
        return "number", tp
    if origin is list:
        return "array", tp
    if origin is dict or attrs.has(tp):
        return "table", tp
    raise AssertionError(f"a config field of a type this test does not know: {tp!r}")


EXPECTED = {"string": "expected a string", "boolean": "expected a boolean",
            "integer": "expected an integer", "number": "expected a number",
            "array": "expected an array", "table": "expected a table",
            "policy": "expected a policy name"}
#: Values of every TOML kind but the expected one (a TOML date included).
WRONG: dict[str, list[Any]] = {
    "string": [3, 1.5, True, ["a"], {"a": "b"}, DATE],
    "boolean": ["yes", 1, 0.0, [True], {"a": "b"}, DATE],
    "integer": ["3", 1.5, True, [1], {"a": "b"}, DATE],
    "number": ["0.5", True, [1.0], {"a": "b"}, DATE],
    "array": ["a", 3, True, {"a": "b"}, DATE],
    "table": ["a", 3, True, [1], DATE],
    "policy": [3, 1.5, True, ["off"], DATE],
}


def schema_keys() -> list[tuple[str, str, Callable[[Any], dict[str, Any]], str]]:
    """``(dotted key, kind, build(value) -> config dict, expected phrase)`` of every key of
    Config, AgentConfig (in ``[agents.x]``) and Limits (top level and per agent)."""
    keys = []

    def add(cls: type, prefix: str, wrap: Callable[[dict[str, Any]], dict[str, Any]],
            expected: Callable[[str, Any], str] | None = None) -> None:
        hints = typing.get_type_hints(cls)
        for f in attrs.fields(cls):
            if f.name == "source":
                continue
            kind, tp = _kind(hints[f.name])
            phrase = expected(kind, tp) if expected else EXPECTED[kind]
            keys.append((prefix + f.name, kind,
                         lambda v, _n=f.name: wrap({_n: v}), phrase))  # type: ignore[misc]

    def limit_phrase(kind: str, tp: Any) -> str:
        return "expected a positive integer" if kind == "integer" else "expected a positive number"

    add(Config, "", lambda d: d)
    add(AgentConfig, "agents.x.", lambda d: {"agents": {"x": d}})
    add(Limits, "limits.", lambda d: {"limits": d}, limit_phrase)
    add(Limits, "agents.x.limits.", lambda d: {"agents": {"x": {"limits": d}}}, limit_phrase)
    return keys


SCHEMA = schema_keys()
CASES = [(key, value, build, phrase) for key, kind, build, phrase in SCHEMA
         for value in WRONG[kind]]


def test_the_schema_walk_covers_every_field():
    names = {k for k, *_ in SCHEMA}
    assert {f.name for f in attrs.fields(Config)} - {"source"} <= names
    assert {f"agents.x.{f.name}" for f in attrs.fields(AgentConfig)} <= names
    assert {f"limits.{n}" for n in LIMIT_NAMES} <= names
    assert {f"agents.x.limits.{n}" for n in LIMIT_NAMES} <= names


@pytest.mark.parametrize(("key", "value", "build", "phrase"), CASES,
                         ids=[f"{c[0]}={type(c[1]).__name__}" for c in CASES])
def test_every_key_with_a_wrong_type_is_one_clear_config_error(tmp_path, key, value, build,
                                                               phrase):
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(build(value)), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        App.from_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:"), message
    assert f"key '{key}" in message and phrase in message, message
    assert "\n" not in message
    # the same mapping through the API names the key the same way
    with pytest.raises(ConfigError, match=f"^config: key '{key}"):
        App.from_config(build(value))


def _table_inner_cases() -> list[tuple[str, dict[str, Any], str]]:
    """Wrong values *inside* the tables: items of arrays, tables of tables."""
    return [
        ("disable", {"disable": ["dsh.prompt", 3]}, "item 2: expected a string"),
        ("load", {"load": [True]}, "item 1: expected a string"),
        ("agents.x.tools", {"agents": {"x": {"tools": ["a", 1.5]}}}, "item 2: expected a string"),
        ("agents.x.plugins", {"agents": {"x": {"plugins": [[]]}}}, "item 1: expected a string"),
        ("agents.x.subagents", {"agents": {"x": {"subagents": [{}]}}}, "expected a string"),
        ("plugins.shell", {"plugins": {"shell": 3}}, "expected a table"),
        ("models.m", {"models": {"m": "openai:x"}}, "expected a table"),
        ("agents.x.plugin_settings.shell", {"agents": {"x": {"plugin_settings": {"shell": []}}}},
         "expected a table"),
        ("agents.x", {"agents": {"x": "coder"}}, "expected a table"),
        ("models.m.options", {"models": {"m": {"options": 3}}}, "expected a table"),
        ("models.m.adapter", {"models": {"m": {"adapter": 3}}}, "expected a string"),
        ("models.m.model", {"models": {"m": {"model": ["a"]}}}, "expected a string"),
        ("models.m.price", {"models": {"m": {"price": 0.15}}}, "expected a table"),
        ("models.m.price.input", {"models": {"m": {"price": {"input": "1"}}}},
         "expected a number ≥ 0"),
        ("models.m.price.output", {"models": {"m": {"price": {"output": -1}}}},
         "expected a number ≥ 0"),
        ("models.m.price", {"models": {"m": {"price": {"inptu": 1}}}},
         "unknown key 'inptu'; did you mean 'input'?"),
    ]


@pytest.mark.parametrize(("key", "data", "phrase"), _table_inner_cases(),
                         ids=[c[0] + "-" + c[2][:12] for c in _table_inner_cases()])
def test_wrong_values_inside_tables_name_the_nested_key(tmp_path, key, data, phrase):
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        App.from_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:") and f"key '{key}" in message and phrase in message, \
        message


@pytest.mark.parametrize(("data", "key", "phrase"), [
    ({"max_steps": -1}, "max_steps", "expected an integer ≥ 0, got integer -1"),
    ({"max_continuations": -3}, "max_continuations", "expected an integer ≥ 0"),
    ({"agents": {"x": {"max_steps": -1}}}, "agents.x.max_steps", "expected an integer ≥ 0"),
    ({"fsync": "sometimes"}, "fsync", "expected one of 'event', 'step', 'never', got string"),
])
def test_wrong_values_of_the_right_type_are_refused(data, key, phrase):
    with pytest.raises(ConfigError, match=f"^f.toml: key '{key}': {phrase}"):
        config_from_dict(data, source="f.toml")


def test_api_mappings_with_non_string_keys_or_of_the_wrong_shape_are_config_errors():
    with pytest.raises(ConfigError, match="keys must be strings"):
        config_from_dict({3: 1})
    with pytest.raises(ConfigError, match="keys must be strings"):
        config_from_dict({"agents": {"x": {4: 1}}})
    with pytest.raises(ConfigError, match="expected a table of settings, got an array"):
        config_from_dict([("model", "echo")])  # type: ignore[arg-type]


def test_the_error_names_the_line_of_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('model = "echo"\n\n[agents.coder]\nmax_steps = true\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"c\.toml:4: key 'agents\.coder\.max_steps': expected "
                                          r"an integer, got boolean true$"):
        load_config(path)


# The same table, through `dsh config validate` as a real process: one wrong value per key.
CLI_CASES = [(key, WRONG[kind][0], build, phrase) for key, kind, build, phrase in SCHEMA]


def test_every_key_with_a_wrong_type_through_config_validate(tmp_path):
    procs = []
    for i, (key, value, build, phrase) in enumerate(CLI_CASES):
        path = tmp_path / f"c{i}.toml"
        path.write_text(tomli_w.dumps({"autoload": False, **build(value)})
                        if key != "autoload" else tomli_w.dumps(build(value)), encoding="utf-8")
        env = {**os.environ, "DSH_HOME": str(tmp_path / "home")}
        procs.append((key, phrase, path, subprocess.Popen(
            [*DSH, "--config", str(path), "config", "validate"], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for key, phrase, path, proc in procs:
        out, err = proc.communicate(timeout=120)
        line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        assert out == ""
        assert line.startswith(f"dsh: error: {path}:") and f"key '{key}" in line, line
        assert phrase in line, line


def _toml_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.text(max_size=8), st.integers(-(2**63), 2**63 - 1), st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True), st.dates(), st.datetimes(),
        st.times())
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
        max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(SCHEMA), value=_toml_values())
def test_any_value_for_any_key_is_accepted_or_one_config_error_naming_the_key(case, value):
    key, kind, build, _ = case
    try:
        cfg = config_from_dict(build(value), source="gen.toml")
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("gen.toml") and "\n" not in message
        assert key in message, message  # the dotted key (or a deeper one under it)
        return
    # accepted: then the value really is of the expected kind
    check = {"string": lambda v: isinstance(v, str),
             "boolean": lambda v: isinstance(v, bool),
             "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
             "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
             "array": lambda v: isinstance(v, list), "table": lambda v: isinstance(v, dict),
             "policy": lambda v: isinstance(v, str | dict)}
    assert check[kind](value), (key, value)
    if kind == "policy":  # its content is checked when the agent is assembled: same rule
        from dsh.sandbox.policy import parse_policy

        try:
            parse_policy(value, where=key)
        except ConfigError as exc:
            assert str(exc).startswith(f"[{key}]") and "\n" not in str(exc), str(exc)
    if "limits." in key:  # and a limit is valid by the one rule
        limits = cfg.limits if key.startswith("limits.") else cfg.agents["x"].limits
        assert limits is not None
        name = key.rpartition(".")[2]
        assert check_limit(name, getattr(limits, name)) == value
    if key == "agents.x.options":
        assert json_problem(value) is None
        json.dumps(value, allow_nan=False)


# --------------------------------------------------------------------------------------------
# Limits: one rule for the config and -L
# --------------------------------------------------------------------------------------------


BAD_LIMITS = [-1, 0, -0.5, math.nan, math.inf, -math.inf, True, False, "5", [5], {"a": 1}, DATE]


@pytest.mark.parametrize("name", LIMIT_NAMES)
@pytest.mark.parametrize("value", BAD_LIMITS, ids=repr)
def test_a_bad_limit_is_refused_the_same_way_by_config_and_cli(name, value):
    from dsh.cli.options import parse_limits

    with pytest.raises(ValueError) as rule:
        check_limit(name, value)
    with pytest.raises(ConfigError) as config:
        config_from_dict({"limits": {name: value}}, source="c.toml")
    assert str(config.value) == f"c.toml: key 'limits.{name}': {rule.value}"
    dumped = tomli_w.dumps({"v": value})
    if dumped.startswith("v = "):  # the same value written on the command line
        with pytest.raises(UsageError) as cli:
            parse_limits((f"{name}={dumped[4:].strip()}",))
        assert str(cli.value) == f"--limit {name}: {rule.value}"


def test_integer_limits_take_no_fractions_and_number_limits_do():
    from dsh.cli.options import parse_limits

    assert parse_limits(("requests=5", "cost=.5", "seconds=1e-1")) == Limits(
        requests=5, cost=0.5, seconds=0.1)
    with pytest.raises(UsageError, match="--limit requests: expected a positive integer, "
                                         "got float 1.5"):
        parse_limits(("requests=1.5",))
    with pytest.raises(ConfigError, match="key 'limits.tool_calls': expected a positive integer,"
                                          " got float 2.0"):
        config_from_dict({"limits": {"tool_calls": 2.0}})
    with pytest.raises(UsageError, match="unknown limit 'reqests'; did you mean 'requests'"):
        parse_limits(("reqests=1",))
    with pytest.raises(UsageError, match="expected KEY=VALUE"):
        parse_limits(("requests",))


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(LIMIT_NAMES), raw=st.one_of(
    st.integers(-5, 10**12).map(str), st.floats().map(repr),
    st.sampled_from(["true", "nan", "-inf", "inf", "+1", "1_000", "0x10", "1e3", "5.0", "'5'",
                     "[1]", "{a = 1}", "1979-05-27", "x"])))
def test_cli_and_config_agree_on_every_limit_value(name, raw):
    """Whatever text -L is given, it is accepted exactly when the same TOML value in [limits]
    is (a text that is no TOML value has no config counterpart, and is refused)."""
    import tomllib

    from dsh.cli.options import parse_limits

    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = None
    try:
        cli = parse_limits((f"{name}={raw}",))
    except UsageError as exc:
        cli = None
        assert str(exc).startswith(f"--limit {name}: expected a positive")
    if value is None:  # not TOML: the CLI still reads plain numbers (".5") by the same rule
        if cli is not None:
            assert getattr(cli, name) == check_limit(name, float(raw))
        return
    try:
        config = config_from_dict({"limits": {name: value}}).limits
    except ConfigError:
        config = None
    assert (cli is None) == (config is None), (raw, cli, config)
    if cli is not None:
        assert cli == config


def test_a_bad_limit_in_a_real_config_file_fails_dsh_run_before_any_session(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("autoload = false\n[limits]\nrequests = -1\n", encoding="utf-8")
    home = tmp_path / "home"
    r = run_dsh("--config", str(cfg), "run", "-m", "echo", "hi", env={"DSH_HOME": str(home)})
    assert one_error_line(r) == (f"dsh: error: {cfg}:3: key 'limits.requests': expected a "
                                 "positive integer, got integer -1")
    assert not (home / "sessions").exists() or not list((home / "sessions").iterdir())
    r = run_dsh("run", "-m", "echo", "-L", "requests=-1", "hi", env={"DSH_HOME": str(home)})
    assert one_error_line(r) == ("dsh: error: --limit requests: expected a positive integer, "
                                 "got integer -1")


# --------------------------------------------------------------------------------------------
# Option values must be JSON-compatible: config, models, -o, the API
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "key", "what"), [
    ({"agents": {"x": {"options": {"when": DATE}}}}, "agents.x.options.when", "got date 1979"),
    ({"agents": {"x": {"options": {"t": math.nan}}}}, "agents.x.options.t", "got float nan"),
    ({"agents": {"x": {"options": {"a": {"b": [1, datetime.time(7, 32)]}}}}},
     "agents.x.options.a.b[1]", "got time 07:32:00"),
    ({"models": {"openai:gpt-4o": {"options": {"stop": [math.inf]}}}},
     'models."openai:gpt-4o".options.stop[0]', "got float inf"),
    ({"models": {"m": {"options": {"when": datetime.datetime(1979, 5, 27, 7, 32)}}}},
     "models.m.options.when", "got date-time 1979-05-27T07:32:00"),
])
def test_option_values_that_json_cannot_carry_are_config_errors(data, key, what):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source="c.toml")
    assert str(info.value).startswith(f"c.toml: key '{key}': option values must be "
                                      "JSON-compatible"), str(info.value)
    assert what in str(info.value)


def test_deeply_nested_options_are_a_clear_error_not_a_recursion_error():
    deep: Any = 1
    for _ in range(5000):
        deep = {"a": deep}
    with pytest.raises(ConfigError, match=f"nested more than {MAX_OPTION_DEPTH} levels"):
        config_from_dict({"agents": {"x": {"options": {"deep": deep}}}})


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.text(max_size=5), st.integers(), st.booleans(),
                        st.floats(allow_nan=True, allow_infinity=True), st.dates(), st.times())
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.tuples(inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), inner, max_size=3)),
        max_leaves=10)


@settings(max_examples=500, deadline=None)
@given(value=_json_values())
def test_json_compatible_means_what_strict_json_accepts(value):
    """The rule is strict JSON's: what ``json.dumps(allow_nan=False)`` writes (without
    turning integer keys into strings), nothing more."""

    def strict(v: Any) -> bool:
        if isinstance(v, dict):
            return all(isinstance(k, str) and strict(x) for k, x in v.items())
        if isinstance(v, list | tuple):
            return all(strict(x) for x in v)
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError):
            return False
        return True

    assert (json_problem(value) is None) == strict(value)


def test_dash_o_with_a_toml_date_fails_at_parse_time_and_creates_no_session(tmp_path):
    home = tmp_path / "home"
    r = run_dsh("run", "-m", "echo", "-o", "when=1979-05-27", "hi", env={"DSH_HOME": str(home)})
    line = one_error_line(r)
    assert line.startswith("dsh: error: -o 'when': option values must be JSON-compatible")
    assert "got date 1979-05-27" in line and r.stdout == ""
    assert not (home / "sessions").exists() or not list((home / "sessions").iterdir())
    r = run_dsh("run", "-m", "echo", "--json", "-o", 'when="1979-05-27"', "-o", "t=0.5", "hi",
                env={"DSH_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["output"] == "hi"


def test_api_option_overrides_are_checked_before_any_session(make_app, tmp_path):
    app = make_app()
    with pytest.raises(UsageError, match="agent 'default': 'options.when': option values must "
                                         "be JSON-compatible"):
        app.run("hi", model="echo", options={"when": DATE})
    assert not (tmp_path / "sessions").exists() or not list((tmp_path / "sessions").iterdir())
    assert app.run("hi", model="echo", options={"t": 0.5}).outcome == "completed"


# --------------------------------------------------------------------------------------------
# Unknown names are errors: disable, DSH_LOAD_PLUGINS, tools
# --------------------------------------------------------------------------------------------


def test_a_typo_in_disable_is_an_error_with_a_did_you_mean(make_app):
    with pytest.raises(ConfigError, match="key 'disable': unknown plugin 'dsh.promt'; did you "
                                          "mean 'dsh.prompt'"):
        make_app(disable=["dsh.promt"]).agent()
    with pytest.raises(ConfigError, match="key 'disable': unknown plugin 'zzz' \\(built-in and "
                                          "installed: dsh.loop, "):
        make_app(disable=["zzz"]).agent()


def test_disable_accepts_builtins_installed_and_loaded_plugins(make_app, plugin_module,
                                                               monkeypatch):
    mine = plugin_module()
    monkeypatch.setenv("DSH_LOAD_PLUGINS", "")  # installed but not loaded is still a name
    app = make_app(disable=["dsh.prompt", "shell", mine], load=[mine])
    assert app.run("hi", model="echo").output == "hi"
    assert app.pm.is_blocked("shell") and app.pm.get_plugin(mine) is None


def test_a_typo_in_dsh_load_plugins_is_an_error(make_app, monkeypatch):
    monkeypatch.setenv("DSH_LOAD_PLUGINS", "shell,shel")
    with pytest.raises(ConfigError, match="^DSH_LOAD_PLUGINS: unknown plugin 'shel'; did you "
                                          "mean 'shell'"):
        make_app(autoload=True).agent()
    monkeypatch.setenv("DSH_LOAD_PLUGINS", " shell , ")
    assert [r.name for r in make_app(autoload=True).plugins] == ["shell"]


def test_a_typo_in_an_agents_tool_list_is_an_error(make_app, plugin_module):
    tools = plugin_module(register_tools=_register_add)
    with pytest.raises(ConfigError, match="^config: key 'agents.a.tools': unknown tool 'ad'; "
                                          "did you mean 'add'"):
        make_app(load=[tools], agents={"a": {"tools": ["ad"]}}).agent("a")
    app = make_app(load=[tools], agents={"a": {"tools": ["add", "ask_b"], "subagents": ["b"]},
                                         "b": {}})
    assert list(app.agent("a").tools) == ["add", "ask_b"]
    with pytest.raises(UsageError, match="agent 'a': tools: unknown tool 'sub' \\(available: "
                                         "add, ask_b\\)"):
        app.agent("a", tools=["sub"])


def test_a_typo_in_subagents_is_an_error_naming_the_key(make_app):
    app = make_app(agents={"lead": {"subagents": ["reserch"]}, "research": {}})
    with pytest.raises(ConfigError, match="^config: key 'agents.lead.subagents': unknown agent "
                                          "'reserch'; did you mean 'research'"):
        app.agent("lead")


def test_the_essential_budget_plugin_cannot_be_disabled_and_the_key_is_named(make_app):
    with pytest.raises(ConfigError, match="^config: key 'disable': plugin dsh.budget is "
                                          "essential"):
        make_app(disable=["dsh.budget"]).agent()


def test_tool_names_are_not_checked_while_a_plugin_of_the_agent_failed_to_load(make_app):
    app = make_app(load=["dsh_no_such_module_xyz"], agents={"a": {"tools": ["from_it"]}})
    assert app.agent("a").tools == {}  # its failure is reported on its own
    assert next(r for r in app.plugins if r.name == "dsh_no_such_module_xyz").error


def _register_add(register: Any) -> None:
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    register(add)


_register_add = hookimpl(_register_add)  # type: ignore[assignment]


def test_unknown_names_through_the_cli_are_one_line_each(tmp_path):
    cfg = tmp_path / "c.toml"
    home = {"DSH_HOME": str(tmp_path / "home")}
    cfg.write_text('disable = ["dsh.promtp"]\n', encoding="utf-8")
    assert one_error_line(run_dsh("--config", str(cfg), "config", "validate", env=home)) == (
        f"dsh: error: {cfg}: key 'disable': unknown plugin 'dsh.promtp'; did you mean "
        "'dsh.prompt'?")
    cfg.write_text('[agents.default]\ntools = ["run_comand"]\n', encoding="utf-8")
    assert one_error_line(run_dsh("--config", str(cfg), "run", "hi", env=home)) == (
        f"dsh: error: {cfg}: key 'agents.default.tools': unknown tool 'run_comand'; did you "
        "mean 'run_command'?")
    assert one_error_line(run_dsh("run", "-T", "run_comand", "hi", env=home)) == (
        "dsh: error: --tool: unknown tool 'run_comand'; did you mean 'run_command'?")
    assert one_error_line(run_dsh("run", "hi", env={**home, "DSH_LOAD_PLUGINS": "shel"})) == (
        "dsh: error: DSH_LOAD_PLUGINS: unknown plugin 'shel'; did you mean 'shell'?")


# --------------------------------------------------------------------------------------------
# Misspelt hooks warn; essential hooks must have an implementation
# --------------------------------------------------------------------------------------------


def _typo_plugin(plugin_module: Callable[..., str]) -> str:
    @hookimpl
    def pre_stpe(step: Any) -> None:
        raise AssertionError("never called")

    @hookimpl
    def register_prompt(register: Any) -> None:
        register("still registered")

    return plugin_module(pre_stpe=pre_stpe, register_prompt=register_prompt)


def test_a_misspelt_hook_warns_once_naming_plugin_and_hook(make_app, plugin_module):
    name = _typo_plugin(plugin_module)
    # two agents with managers of their own, both holding the plugin: still one warning
    app = make_app(load=[name], agents={"a": {"plugins": [name]}, "b": {"plugins": [name]}})
    with pytest.warns(PluginWarning) as caught:
        a, b = app.agent("a"), app.agent("b")
        app.pm  # noqa: B018 - the app-wide manager too
    assert [str(w.message) for w in caught] == [
        f"plugin {name}: 'pre_stpe' is not a dsh hook, so this implementation is never "
        "called; did you mean 'pre_step'?"]
    assert "still registered" in a.system and "still registered" in b.system  # the rest works


def test_an_optional_hook_is_silent_and_strict_plugins_make_a_typo_fatal(make_app, plugin_module,
                                                                         recwarn):
    @hookimpl(optionalhook=True)
    def maybe_later(x: Any) -> None:
        pass

    app = make_app(load=[plugin_module(maybe_later=maybe_later)])
    assert app.run("hi", model="echo").output == "hi"
    assert not recwarn.list
    name = _typo_plugin(plugin_module)
    with pytest.raises(PluginError, match=f"plugin {name} failed to register: implements unknown "
                                          "hook 'pre_stpe'; did you mean 'pre_step'"):
        make_app(load=[name], strict_plugins=True).agent()


def test_a_misspelt_hook_is_one_warning_line_on_the_cli(tmp_path):
    (tmp_path / "typo_plugin.py").write_text(
        "from dsh import hookimpl\n\n@hookimpl\ndef post_exectue(call, outcome):\n    pass\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text('autoload = false\nload = ["typo_plugin"]\n[agents.a]\nplugins = '
                   '["typo_plugin"]\n', encoding="utf-8")
    env = {"DSH_HOME": str(tmp_path / "home"), "PYTHONPATH": str(tmp_path)}
    r = run_dsh("--config", str(cfg), "run", "-m", "echo", "-a", "a", "hi", env=env)
    assert (r.returncode, r.stdout) == (0, "hi\n"), r.stderr
    assert r.stderr.splitlines() == [
        "dsh: warning: plugin typo_plugin: 'post_exectue' is not a dsh hook, so this "
        "implementation is never called; did you mean 'post_execute'?"]
    r = run_dsh("--config", str(cfg), "config", "validate", env=env)
    assert r.returncode == 0 and r.stdout == f"ok: {cfg}\n"
    assert len(r.stderr.splitlines()) == 1 and "'post_exectue'" in r.stderr


def _providers() -> list[tuple[str, str]]:
    """``(built-in, essential hook)`` for every built-in that is the only provider of one."""
    from dsh.host.manager import _builtin_implements

    return [(b, h) for h in ESSENTIAL_HOOKS for b in BUILTIN_PLUGINS
            if _builtin_implements(b, h)]


def test_every_essential_hook_has_a_builtin_provider():
    assert {h for _, h in _providers()} == set(ESSENTIAL_HOOKS)


@pytest.mark.parametrize(("builtin", "hook"), _providers())
def test_disabling_an_essential_provider_without_replacement_is_a_config_error(
        make_app, builtin, hook):
    app = make_app(disable=[builtin])
    with pytest.raises(ConfigError, match=f"^config: no plugin implements the hook '{hook}', "
                                          f"which every run needs: '{builtin}' is disabled"):
        app.run("hi", model="echo")


def test_a_replacement_must_be_in_the_agents_scope(make_app, plugin_module):
    @hookimpl
    def run_turn(turn: Any) -> str:
        turn.output = "replaced"
        return "completed"

    loop = plugin_module(run_turn=run_turn)
    app = make_app(load=[loop], disable=["dsh.loop"], agents={"bare": {"plugins": []}})
    from dsh.core.errors import InputDroppedWarning

    with pytest.warns(InputDroppedWarning, match="user from user"):  # it never took "hi"
        assert app.run("hi", model="echo").output == "replaced"
    with pytest.raises(ConfigError, match="^config: agent 'bare': no plugin implements the hook "
                                          "'run_turn'"):
        app.agent("bare")


def test_disabling_the_loop_is_exit_2_with_one_line_not_a_silent_exit_0(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('disable = ["dsh.loop"]\n', encoding="utf-8")
    r = run_dsh("--config", str(cfg), "run", "hi", env={"DSH_HOME": str(tmp_path / "home")})
    assert one_error_line(r) == (
        f"dsh: error: {cfg}: no plugin implements the hook 'run_turn', which every run needs: "
        "'dsh.loop' is disabled (key 'disable') and no plugin here replaces it")
    assert r.stdout == ""


# --------------------------------------------------------------------------------------------
# A byte-order mark is accepted everywhere a config is read
# --------------------------------------------------------------------------------------------


BOM_CONFIG = BOM + 'autoload = false\nmodel = "echo"\n[agents.default]\nsystem = "hello"\n'


def test_a_bom_config_is_read_by_the_library_with_correct_lines(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(BOM_CONFIG, encoding="utf-8")
    assert App.from_config(path).config.agent_config("default").system == "hello"
    path.write_text(BOM + "autoload = false\nmodle = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"c\.toml:2: unknown key 'modle'"):
        App.from_config(path)


def test_a_bom_config_through_every_cli_path(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(BOM_CONFIG, encoding="utf-8")
    env = {"DSH_HOME": str(tmp_path / "home")}
    r = run_dsh("--config", str(path), "run", "hi", env=env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "hi\n", "")
    r = run_dsh("--config", str(path), "config", "validate", env=env)
    assert (r.returncode, r.stdout) == (0, f"ok: {path}\n"), r.stderr
    r = run_dsh("--config", str(path), "config", "show", env=env)
    assert r.returncode == 0 and 'system = "hello"' in r.stdout, r.stderr
    r = run_dsh("--config", str(path), "config", "set", "max_steps", "7", env=env)
    assert r.returncode == 0, r.stderr
    data = path.read_bytes()
    assert data.startswith(BOM.encode()) and data.count(BOM.encode()) == 1  # kept, once
    assert load_config(path).max_steps == 7
    r = run_dsh("--config", str(path), "config", "set", "agent", "default", env=env)
    assert r.returncode == 0 and path.read_bytes().count(BOM.encode()) == 1


def test_a_config_that_is_not_utf8_names_the_line_and_byte(tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b'model = "echo"\nsystem = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"c\.toml:2: config file is not UTF-8 text \(byte "
                                          r"0xe9\)"):
        load_config(path)


# --------------------------------------------------------------------------------------------
# config set: symbolic links, modes, bad keys and values, unwritable files
# --------------------------------------------------------------------------------------------


def test_config_set_writes_through_a_symlink_keeping_link_and_mode(tmp_path):
    real = tmp_path / "dotfiles" / "dsh.toml"
    real.parent.mkdir()
    real.write_text('model = "echo"\n', encoding="utf-8")
    real.chmod(0o640)
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    r = run_dsh("--config", str(link), "config", "set", "agents.coder.max_steps", "40")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real.stat().st_mode & 0o777) == 0o640
    assert load_config(real).agents["coder"].max_steps == 40
    assert [p.name for p in real.parent.iterdir()] == ["dsh.toml"]  # no temporary file left


def test_config_set_through_a_dangling_symlink_creates_the_target(tmp_path):
    from dsh.config.edit import set_value

    target = tmp_path / "elsewhere.toml"
    link = tmp_path / "config.toml"
    link.symlink_to(target)
    set_value(link, "model", "openai:gpt-4o-mini")
    assert link.is_symlink() and load_config(target).model == "openai:gpt-4o-mini"
    assert (target.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("key", ["a b", "", "model = 1 #", "model = 1\nagent", "agents.",
                                 "[agents]", "a.'b"])
def test_config_set_with_an_invalid_key_is_one_line(tmp_path, key):
    path = tmp_path / "c.toml"
    path.write_text('model = "echo"\n', encoding="utf-8")
    line = one_error_line(run_dsh("--config", str(path), "config", "set", key, "1"))
    assert line.startswith(f"dsh: error: invalid key {key!r}: expected a dotted TOML key")
    assert path.read_text() == 'model = "echo"\n'


@pytest.mark.parametrize(("key", "value", "message"), [
    ("model", "\udcff", "cannot set model: the value is not UTF-8 text (byte 0xff)"),
    ("agents.c\udcfe", "x", "the key is not UTF-8 text (byte 0xfe)"),
    ("model.x", "1", "cannot set model.x: model is not a table"),
    ("agents.coder", "x", "key 'agents.coder': expected a table, got string 'x'"),
    ("agents.coder.limits.requests", "-1",
     "key 'agents.coder.limits.requests': expected a positive integer, got integer -1"),
    ("agents.coder.options.when", "1979-05-27",
     "key 'agents.coder.options.when': option values must be JSON-compatible"),
    ("agents.coder.max_stpes", "3", "unknown key 'agents.coder.max_stpes'; did you mean "
                                    "'max_steps'?"),
])
def test_config_set_refuses_bad_values_in_one_line_and_leaves_the_file(tmp_path, key, value,
                                                                       message):
    path = tmp_path / "c.toml"
    path.write_text('model = "echo"\n', encoding="utf-8")
    args = [os.fsencode(a) for a in (*DSH, "--config", str(path), "config", "set", key, value)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    line = one_error_line(r)
    assert message in line, line
    assert path.read_text() == 'model = "echo"\n'


def test_config_set_nested_keys_and_values_that_are_not_one_toml_value(tmp_path):
    from dsh.config.edit import set_value

    path = tmp_path / "c.toml"
    set_value(path, 'models."openai:gpt-4o".options', "{ temperature = 0.2 }")
    set_value(path, "agents.coder.limits.cost", "0.25")
    set_value(path, "agents.coder.system", "1\nmodel = 'x'")  # one string, not two keys
    cfg = load_config(path)
    assert cfg.models["openai:gpt-4o"]["options"] == {"temperature": 0.2}
    assert cfg.agents["coder"].limits == Limits(cost=0.25)
    assert cfg.agents["coder"].system == "1\nmodel = 'x'" and cfg.model != "x"


def test_config_set_refuses_a_read_only_file_and_unwritable_places(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('model = "echo"\n', encoding="utf-8")
    path.chmod(0o444)
    line = one_error_line(run_dsh("--config", str(path), "config", "set", "agent", "x"))
    assert line == (f"dsh: error: {path}: cannot write config file: it is read-only (mode 0444);"
                    " change its mode first")
    assert path.read_text() == 'model = "echo"\n'
    line = one_error_line(run_dsh("--config", "/proc/dsh-test.toml", "config", "set",
                                  "agent", "x"))  # a place nobody may create a file in
    assert line.startswith("dsh: error: /proc/dsh-test.toml: cannot write config file: ")
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_error_line(run_dsh("--config", str(blocker / "c.toml"), "config", "set",
                                  "agent", "x"))
    assert line == f"dsh: error: {blocker / 'c.toml'}: cannot read config file: Not a directory"
    (tmp_path / "dir.toml").mkdir()
    line = one_error_line(run_dsh("config", "set", "agent", "x",
                                  env={"DSH_CONFIG": str(tmp_path / "dir.toml")}))
    assert "dir.toml: cannot read config file: " in line


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(max_size=12), raw=st.text(max_size=12))
def test_config_set_never_raises_anything_but_a_dsh_error(tmp_path, key, raw):
    from dsh.config.edit import set_value

    path = tmp_path / "c.toml"
    path.write_text('model = "echo"\n', encoding="utf-8")
    try:
        set_value(path, key, raw)
    except DshError as exc:
        assert "\n" not in str(exc).replace(repr(key), "").replace(repr(raw), "")
        assert path.read_text() == 'model = "echo"\n'
    else:
        load_config(path)  # what was written reads back
