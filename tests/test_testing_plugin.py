"""dsh.testing, the pytest plugin for plugin authors: the example plugin installed for real and
tested with it in a fresh environment, and each fixture held to what docs/testing-plugins.md
says of it.

This module uses the fixtures the way a plugin's tests do: pytest finds them through dsh's
``pytest11`` entry point (``dsh = "dsh.testing"``), nothing here imports them.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import types
from collections.abc import Callable
from collections.abc import Generator
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import dsh.testing
from dsh import hookimpl
from dsh.core.errors import ConfigError
from dsh.core.messages import ModelRequest
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.testing import MODEL
from dsh.testing import CliResult
from dsh.testing import PromptResult
from dsh.testing import Script
from dsh.testing import ScriptedApp
from dsh.testing import request_to_dict

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "dsh-example"
_IGNORED = ("build", "__pycache__", ".pytest_cache", "*.egg-info")

#: No installed plugin: the fixtures' apps hold only the built-ins and what a test registers.
BARE: dict[str, Any] = {"autoload": False}

MakeApp = Callable[..., ScriptedApp]


# --------------------------------------------------------------------------------------------
# The example plugin, installed in a fresh environment, passes its own tests
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A fresh venv with dsh and the example installed in it (not editable, from copies of
    their sources), and the copy of the example to run its tests from: ``(python, sources)``.

    The venv sees this environment's other packages (pytest, pluggy, httpx, setuptools…)
    through a ``.pth`` file that adds our site-packages after its own (``--system-site-packages``
    alone would add the base interpreter's, not this venv's). Nothing is installed here.
    """
    root = tmp_path_factory.mktemp("example-env")
    sources = root / "dsh-example"
    shutil.copytree(EXAMPLE, sources, ignore=shutil.ignore_patterns(*_IGNORED))
    dsh_sources = root / "dsh-src"  # a build in the tree would leave build/ and *.egg-info
    shutil.copytree(REPO / "dsh", dsh_sources / "dsh", ignore=shutil.ignore_patterns(*_IGNORED))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dsh_sources / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site_dir = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    (site_dir / "zz_outer_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--disable-pip-version-check", str(dsh_sources), str(sources)],
        capture_output=True, text=True, timeout=300, cwd=root, env=_clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield python, sources


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of the fresh venv's processes: none of ours that changes what Python,
    pytest or dsh do. Bytecode is written (into the venv and the copies under tmp): without
    it every process would compile dsh and pytest's assertion rewriting anew."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DSH_", "PYTEST_", "PYTHON"))}
    env.update(**extra)
    return env


def _pytest(python: Path, sources: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=sources, env=_clean_env(), capture_output=True, text=True, timeout=600)


def test_example_plugin_is_installed_not_imported_from_the_tree(
        example_env: tuple[Path, Path]) -> None:
    python, sources = example_env
    proc = subprocess.run(
        [str(python), "-c", "import dsh_example, dsh.testing, importlib.metadata as m; "
         "print(dsh_example.__file__); print(dsh.testing.__file__); "
         "print(m.version('dsh-example')); "
         "print(sorted({e.value for e in m.entry_points(group='pytest11') if e.name == 'dsh'}))"],
        cwd=sources, env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    example, testing, version, entry = proc.stdout.splitlines()
    for where in (example, testing):  # the venv's site-packages, not a source tree
        assert Path(where).is_relative_to(python.parent.parent), where
        assert not Path(where).is_relative_to(REPO) and not Path(where).is_relative_to(sources)
    assert (version, entry) == ("0.1.0", "['dsh.testing']")


def test_example_tests_pass_with_the_fixtures_of_the_entry_point(
        example_env: tuple[Path, Path]) -> None:
    python, sources = example_env
    proc = _pytest(python, sources)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].startswith("11 passed"), proc.stdout

    # dsh imported before pytest starts (a runner such as mutmut): the installed package is
    # marked for assertion rewriting, and must not warn (an error under -W error).
    proc = subprocess.run(
        [str(python), "-c", "import sys, dsh, pytest; sys.exit(pytest.main(['-q', '-p', "
         "'no:cacheprovider', '-W', 'error', 'tests/test_example.py::test_the_command_line']))"],
        cwd=sources, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # Without the plugin the entry point names, the fixtures are gone: they came from it.
    proc = _pytest(python, sources, "-p", "no:dsh", "tests/test_example.py::test_the_command_line")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fixture 'dsh_script' not found" in proc.stdout


# --------------------------------------------------------------------------------------------
# The plugin as pytest loads it
# --------------------------------------------------------------------------------------------


def test_pytest_loads_the_module_through_the_entry_point(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("dsh") is dsh.testing


def test_importing_it_imports_nothing_heavy() -> None:
    """pytest imports it in every run of an environment with dsh installed."""
    code = ("import sys, json, pytest; before = set(sys.modules); import dsh.testing; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=_clean_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["dsh", "dsh._compat", "dsh._version", "dsh.hookspecs",
                                       "dsh.testing", "dsh.testing.app", "dsh.testing.script"]


def test_the_names_it_had_before_it_was_split_are_still_its_own() -> None:
    """dsh.testing was one module (issue 21 split it): every public name still imports from
    it, as the very object defined in its new module, and the ``register_models`` hook is on
    the module the fixtures' apps ``load`` (``dsh.testing``)."""
    import dsh.testing.app
    import dsh.testing.script

    homes = {dsh.testing.script: ["MODEL", "Script", "register_models"],
             dsh.testing.app: ["Result", "PromptResult", "CliResult", "ScriptedApp",
                               "request_to_dict"]}
    for module, names in homes.items():
        for name in names:
            assert getattr(dsh.testing, name) is getattr(module, name), name
            obj = getattr(module, name)
            assert isinstance(obj, str) or obj.__module__ == module.__name__, name
    assert set(dsh.testing.__all__) <= set(vars(dsh.testing))
    assert hasattr(dsh.testing.register_models, "dsh_impl")  # a dsh hookimpl, seen by pluggy


def test_a_test_that_asks_for_nothing_gets_nothing(request: pytest.FixtureRequest) -> None:
    """No autouse fixture: other projects' tests are not touched."""
    assert not [name for name in request.fixturenames if name.startswith("dsh_")]


# --------------------------------------------------------------------------------------------
# Requests and events
# --------------------------------------------------------------------------------------------


class RequestSpy:
    """A plugin of these tests: keeps every request the chat chain carried."""

    def __init__(self) -> None:
        self.seen: list[ModelRequest] = []

    @hookimpl(wrapper=True)
    def request(self, call: Any) -> Generator[None, Any, Any]:
        self.seen.append(call.request)
        return (yield)

    @hookimpl
    def register_tools(self, register: Callable[..., None]) -> None:
        def add(a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

        register(add)


def test_the_requests_are_those_the_model_received(dsh_make_app: MakeApp) -> None:
    spy = RequestSpy()
    app = dsh_make_app({**BARE, "agents": {"calc": {"system": "Be exact."}}},
                       plugins={"spy": spy})
    app.script.tool_call("add", a=2, b=3).text("5")
    result = app.run("2 + 3?", agent="calc")
    assert (result.outcome, result.output) == ("completed", "5")

    assert result.requests == spy.seen and len(spy.seen) == 2
    first, second = result.requests
    assert (first.model, first.system, [t.name for t in first.tools]) == (
        MODEL, "Be exact.", ["add"])
    assert [m.role for m in first.messages] == ["user"]
    assert [m.role for m in second.messages] == ["user", "assistant", "tool"]
    assert second.messages[2].content == "5"
    assert result.request_dicts == [request_to_dict(r) for r in spy.seen]
    assert result.request_dicts[1]["messages"][1]["tool_calls"] == [
        {"id": "call_0_0", "name": "add", "arguments": {"a": 2, "b": 3}}]
    json.dumps(result.request_dicts)  # plain data
    assert app.requests == spy.seen  # the app's, over every run


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_SCALAR = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _TEXT
_NESTED = _SCALAR | st.lists(_SCALAR, max_size=3) | st.dictionaries(_TEXT, _SCALAR, max_size=3)
_JSON = _NESTED | st.lists(_NESTED, max_size=3) | st.dictionaries(_TEXT, _NESTED, max_size=3)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arguments=st.dictionaries(_TEXT, _JSON, max_size=4), answer=_TEXT)
def test_scripted_arguments_and_text_arrive_unchanged(dsh_make_app: MakeApp,
                                                      arguments: dict[str, Any],
                                                      answer: str) -> None:
    """Whatever a reply holds reaches the ledger and the next request as it was scripted."""
    app = dsh_make_app(BARE)
    app.script.tool_call("anything", arguments).text(answer)
    result = app.run("go")
    [called] = result.events_of(ToolCalled)
    assert called.arguments == arguments
    calls = result.request_dicts[1]["messages"][1]["tool_calls"]
    assert calls == [{"id": "call_0_0", "name": "anything", "arguments": arguments}]
    assert json.loads(json.dumps(result.request_dicts)) == result.request_dicts
    assert result.output == answer


def test_events_are_the_session_ledger_typed_and_as_its_lines(dsh_make_app: MakeApp) -> None:
    app = dsh_make_app(BARE, script=[{"text": "hello"}])
    result = app.run("hi")
    assert result.event_types == ["turn/start", "step/start", "user/message",
                                  "assistant/message", "step/end", "turn/end"]
    assert [type(e) for e in result.events_of(UserMessage)] == [UserMessage]
    assert result.events_of(AssistantMessage)[0].text == "hello"
    path = app.sessions_dir / f"{result.session_id}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert result.event_dicts == lines


def test_a_resumed_session_continues_the_script_and_shows_every_turn(
        dsh_app: ScriptedApp, dsh_script: Script) -> None:
    dsh_script.text("one").text("two")
    first = dsh_app.run("a")
    second = dsh_app.reopen().run("b", session=first.session_id)
    assert (first.output, second.output) == ("one", "two")
    assert len(second.requests) == 1  # this run's requests only
    assert [m.content for m in second.requests[0].messages] == ["a", "one", "b"]
    assert [e.text for e in second.events_of(UserMessage)] == ["a", "b"]  # the whole session


# --------------------------------------------------------------------------------------------
# The script
# --------------------------------------------------------------------------------------------


def test_script_replies(dsh_make_app: MakeApp) -> None:
    app = dsh_make_app({**BARE, "load": []}, plugins={"spy": RequestSpy()})
    app.script.tool_calls(("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2}), text="both")
    app.script.text("2 and 4", usage={"input_tokens": 7, "output_tokens": 3})
    assert len(app.script) == 2
    result = app.run("add")
    assert [(e.name, e.output) for e in result.events_of(ToolReturned)] == [
        ("add", "2"), ("add", "4")]
    assert result.run.usage.input_tokens == 7
    assert len(app.script) == 0

    app.script.error("overloaded", status=529)
    failed = app.run("again")
    assert failed.outcome == "error" and "scripted: overloaded" in failed.reason
    assert len(failed.requests) == 1  # the model received it, then failed

    empty = app.run("and again")
    assert empty.outcome == "error"
    assert "no reply left for request 4" in empty.reason


def test_a_bad_reply_is_refused_when_it_is_added() -> None:
    with pytest.raises(ConfigError, match=r"tool_calls\[0\] needs a 'name'"):
        Script([{"tool_calls": [{"arguments": {}}]}])


def test_the_scripted_model_exists_only_in_the_fixtures_apps(dsh_env: Any) -> None:
    from dsh.run.app import App

    app = App.from_config({**BARE, "load": ["dsh.testing"], "model": MODEL,
                           "sessions_dir": str(dsh_env.root / "s"),
                           "models": {MODEL: {"adapter": MODEL, "script": "script-0"}}})
    with pytest.raises(ConfigError, match="exists only in the apps of dsh.testing's fixtures"):
        app.run("hi")


# --------------------------------------------------------------------------------------------
# The command line, in-process
# --------------------------------------------------------------------------------------------


def test_cli_answer_on_stdout_session_and_requests(dsh_make_app: MakeApp) -> None:
    app = dsh_make_app(BARE, script=[{"text": "Hi there"}, {"text": "Again"}])
    result = app.cli("run", "hello")
    assert isinstance(result, CliResult)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "Hi there\n", "")
    assert result.sessions == [result.session_id]
    assert [e.text for e in result.events_of(UserMessage)] == ["hello"]
    assert [m.content for m in result.requests[0].messages] == ["hello"]

    again = app.cli("run", "--session", str(result.session_id), "more")
    assert (again.exit_code, again.stdout, again.session_id) == (0, "Again\n", result.session_id)
    assert [e.text for e in again.events_of(UserMessage)] == ["hello", "more"]

    listed = app.cli("sessions", "list")
    assert listed.exit_code == 0 and result.session_id in listed.stdout
    assert (listed.session_id, listed.events, listed.requests) == (None, [], [])


def test_cli_errors_go_to_stderr_with_their_exit_code(dsh_make_app: MakeApp) -> None:
    app = dsh_make_app({**BARE, "agents": {"main": {}}})
    usage = app.cli("run", "-a", "nobody", "hi")
    assert (usage.exit_code, usage.stdout) == (2, "")
    assert usage.stderr.startswith("dsh: error: unknown agent 'nobody'")

    app.script.error("overloaded", status=529)
    failed = app.cli("run", "hi")
    assert (failed.exit_code, failed.stdout) == (1, "")
    assert "scripted: overloaded" in failed.stderr
    assert failed.event_types[-1] == "turn/end"
    assert failed.exception is None


def test_cli_reports_an_app_that_cannot_be_assembled(dsh_make_app: MakeApp) -> None:
    class Strict:
        @hookimpl
        def configure(self, app: Any) -> None:
            raise ConfigError("[plugins.strict] level: expected 1-3, got 7")

    app = dsh_make_app(BARE, plugins={"strict": Strict()})
    result = app.cli("run", "hi")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "dsh: error: [plugins.strict] level: expected 1-3, got 7\n"
    assert (result.session_id, result.events, result.requests) == (None, [], [])


def test_cli_stdin_and_environment(dsh_make_app: MakeApp) -> None:
    app = dsh_make_app(BARE, script=[{"text": "ok"}])
    result = app.cli("run", "summarise", input="the text on stdin\n", env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.stderr
    assert "the text on stdin" in result.requests[0].messages[-1].content
    assert "NO_COLOR" not in os.environ


def test_a_crash_propagates_unless_caught(dsh_make_app: MakeApp) -> None:
    class Boom:
        @hookimpl
        def register_commands(self, cli: Any) -> None:
            @cli.command("boom")
            def boom() -> None:
                raise KeyError("bug")

    app = dsh_make_app(BARE, plugins={"boom": Boom()})
    with pytest.raises(KeyError, match="bug"):
        app.cli("boom")
    caught = app.cli("boom", catch_exceptions=True)
    assert caught.exit_code == 1 and isinstance(caught.exception, KeyError)


# --------------------------------------------------------------------------------------------
# Apps, plugins and isolation
# --------------------------------------------------------------------------------------------


def test_plugins_registered_in_process(dsh_make_app: MakeApp) -> None:
    module = types.ModuleType("dsh_testing_test_module")
    spy = RequestSpy()
    app = dsh_make_app({**BARE, "agents": {"a": {"plugins": ["spy"]}}},
                       plugins={"spy": spy})
    names = {r.name: r.obj for r in app.app.plugins}
    assert names["spy"] is spy and names["dsh.testing"] is dsh.testing
    assert "add" in app.app.agent("a").tools
    app2 = dsh_make_app(BARE, plugins=[module, "json"])
    assert {"dsh_testing_test_module", "json"} <= {r.name for r in app2.app.plugins}
    assert sys.modules["dsh_testing_test_module"] is module
    with pytest.raises(TypeError, match="is not a module: pass"):
        dsh_make_app(BARE, plugins=[spy])


def test_two_apps_have_their_own_script_and_sessions(dsh_make_app: MakeApp) -> None:
    one, two = dsh_make_app(BARE), dsh_make_app(BARE)
    assert one.sessions_dir != two.sessions_dir
    one.script.text("from one")
    two.script.text("from two")
    assert (two.run("x").output, one.run("x").output) == ("from two", "from one")
    assert (len(one.requests), len(two.requests)) == (1, 1)
    assert one.app.store.ids() != two.app.store.ids()


def test_an_agent_that_names_its_model_keeps_it(dsh_make_app: MakeApp) -> None:
    app = dsh_make_app({**BARE, "agents": {"e": {"model": "echo"}}}, script=[{"text": "s"}])
    echoed = app.run("repeat me", agent="e")
    assert (echoed.output, echoed.requests) == ("repeat me", [])
    assert echoed.events_of(TurnStarted)[0].model == "echo"
    scripted = app.run("now scripted", agent="e", model=MODEL)
    assert (scripted.output, len(scripted.requests)) == ("s", 1)


@pytest.fixture
def dirty_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "developer.toml"
    config.write_text('model = "openai:gpt-4o"\n')
    for name, value in {"OPENAI_API_KEY": "sk-" + "x" * 40, "GITHUB_TOKEN": "ghp_x",
                        "OPENAI_BASE_URL": "http://127.0.0.1:9", "DSH_CONFIG": str(config),
                        "DSH_LOAD_PLUGINS": "shell", "XDG_DATA_HOME": "/nonexistent",
                        "RAY_ADDRESS": "10.0.0.1:6379"}.items():
        monkeypatch.setenv(name, value)


def test_the_environment_is_isolated(dirty_environment: None, request: pytest.FixtureRequest,
                                     tmp_path: Path) -> None:
    env = request.getfixturevalue("dsh_env")  # after the developer's variables were set
    for name in ("OPENAI_API_KEY", "GITHUB_TOKEN", "OPENAI_BASE_URL", "DSH_CONFIG",
                 "DSH_LOAD_PLUGINS", "RAY_ADDRESS"):
        assert name not in os.environ
        assert name in env.removed
    assert os.environ["DSH_HOME"] == str(env.home) and env.home.is_dir()
    assert Path(os.environ["XDG_DATA_HOME"]).is_relative_to(tmp_path)
    app: ScriptedApp = request.getfixturevalue("dsh_app")
    assert app.app.default_model.id == MODEL  # not the developer's config, not the key's
    assert app.sessions_dir.is_relative_to(tmp_path)
    shown = app.cli("config", "path")
    assert shown.exit_code == 0 and shown.stdout.strip().startswith(str(tmp_path))
    keys = app.cli("keys", "path")  # stored keys: a file under tmp_path, never the OS keyring
    assert keys.exit_code == 0 and str(tmp_path) in keys.stdout, keys.stdout + keys.stderr
    assert "keyring" not in keys.stdout


def test_prompt_result_repr_and_run(dsh_make_app: MakeApp) -> None:
    app = dsh_make_app(BARE, script=[{"text": "fine"}, {"text": "unsaved"}])
    result = app.run("how are you?")
    assert isinstance(result, PromptResult)
    assert repr(result).startswith("PromptResult(outcome='completed', output='fine'")
    assert result.run.check() is result.run
    unsaved = app.run("again", save=False)
    assert (unsaved.output, unsaved.session_id, unsaved.events) == ("unsaved", None, [])
    assert len(unsaved.requests) == 1


def test_cli_refuses_config(dsh_app: ScriptedApp) -> None:
    for args in (("--config", "x.toml", "run", "hi"), ("--config=x.toml", "run", "hi")):
        with pytest.raises(ValueError, match="--config would be ignored"):
            dsh_app.cli(*args)


# --------------------------------------------------------------------------------------------
# docs/testing-plugins.md
# --------------------------------------------------------------------------------------------

DOC = REPO / "docs" / "testing-plugins.md"


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.S | re.M)


def test_the_examples_of_the_docs_pass(example_env: tuple[Path, Path], tmp_path: Path) -> None:
    """Every Python block of the page runs, as tests, with the page's conftest.py and
    dsh-example installed."""
    python, _ = example_env
    blocks = _python_blocks()
    [config] = [b for b in blocks if "def dsh_config" in b]
    tests = [b for b in blocks if b is not config]
    (tmp_path / "conftest.py").write_text("import pytest\n\n\n" + config)
    (tmp_path / "test_doc_examples.py").write_text(
        "import pytest\n\nimport dsh\nfrom dsh.core.errors import ConfigError\n"
        "from dsh.ledger.events import PluginEvent\n"
        "from dsh.ledger.events import ToolReturned\n\n\n"
        + "\n\n".join(tests))
    count = sum(len(re.findall(r"^def test_", b, re.M)) for b in tests)
    assert count >= 7
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().splitlines()[-1].startswith(f"{count} passed"), proc.stdout


def _public(cls: type) -> set[str]:
    """The public attributes of a class: its methods and properties, and what ``__init__``
    sets on ``self``."""
    names = {n for n in vars(cls) if not n.startswith("_")}
    init = vars(cls).get("__init__")
    if init is not None:
        names |= set(re.findall(r"self\.([a-z]\w*)(?::[^=\n]+)? = ", inspect.getsource(init)))
    return names


def test_the_docs_name_every_fixture_and_attribute() -> None:
    text = DOC.read_text()
    fixtures = sorted(n for n, v in vars(dsh.testing).items()
                      if n.startswith("dsh_") and callable(v))
    assert len(fixtures) == 8
    for name in fixtures:
        assert f"### `{name}`" in text or f"### `dsh_config` and `{name}`" in text, name
    for name in dsh.testing.__all__:
        assert f"`{name}" in text or f"{name}`" in text, name
    for cls in (dsh.testing.Result, dsh.testing.PromptResult, dsh.testing.CliResult,
                dsh.testing.Script, dsh.testing.ScriptedApp, dsh.testing.IsolatedEnv):
        for name in _public(cls):
            assert re.search(rf"`{name}\b", text), f"{cls.__name__}.{name} is not documented"
