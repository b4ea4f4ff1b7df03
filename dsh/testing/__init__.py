"""pytest fixtures for testing dsh plugins (docs/testing-plugins.md).

Installed with dsh as the pytest plugin ``dsh`` (entry point group ``pytest11``), so a plugin's
test suite only asks for the fixtures::

    def test_greets(dsh_script, dsh_run):
        dsh_script.text("Hello!")
        result = dsh_run("Say hello")
        assert result.output == "Hello!"
        assert result.requests[0].messages[-1].content == "Say hello"

Every app the fixtures build answers with a **scripted model** (:class:`Script`: replies you
give in order; every request it received), keeps its sessions under ``tmp_path``, and runs in
an environment without API keys or the developer's config (:func:`dsh_env`). Results
(:class:`PromptResult`, :class:`CliResult`) carry the session's ledger events, typed and as
the ledger's JSON objects, and the exact requests the model received.

Importing this module is cheap: pytest loads it in every test run of an environment where dsh
is installed, so it imports only pytest and pluggy (already loaded) at module level; dsh's app,
providers, httpx and cattrs are imported by the fixtures that need them. Disable it with
``pytest -p no:dsh``.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

import pytest

from dsh.hookspecs import hookimpl

if TYPE_CHECKING:
    from dsh.core.messages import ModelRequest
    from dsh.ledger.events import Event
    from dsh.llm.base import Model
    from dsh.run.app import App
    from dsh.run.app import RunResult

__all__ = [
    "MODEL",
    "CliResult",
    "IsolatedEnv",
    "PromptResult",
    "Result",
    "Script",
    "ScriptedApp",
    "request_to_dict",
]

#: The id (and adapter prefix) of the scripted model, which this module provides when it is
#: loaded as a dsh plugin: the default ``model`` of every app the fixtures build.
MODEL = "dsh-testing"

#: Environment variables :func:`dsh_env` removes, besides every ``DSH_*`` variable.
SECRET_VARIABLE = re.compile(r"(API_KEY|API_TOKEN|_TOKEN|_SECRET|SECRET_KEY|ACCESS_KEY|"
                             r"_PASSWORD|_BASE_URL|^RAY_ADDRESS)$")

E = TypeVar("E", bound="Event")


# --------------------------------------------------------------------------------------------
# The scripted model
# --------------------------------------------------------------------------------------------


class Script:
    """The scripted model of one app: the replies it gives, in order, one per request, and
    every request it received.

    Add replies before the run that uses them (or between runs); each method returns the
    script, so calls chain: ``dsh_script.tool_call("add", a=1, b=2).text("3")``. A request
    with no reply left fails the turn (outcome ``error``) with a reason saying so.

    Replies are consumed in the order requests arrive, whatever session they belong to: a
    resumed session simply gets the next reply. Sub-agents running in parallel share the
    script, so their order is not fixed; give them replies that do not depend on it.
    """

    def __init__(self, replies: Iterable[Mapping[str, Any]] = ()) -> None:
        #: The replies not used yet, as the dicts the built-in ``scripted`` model reads
        #: (``text``, ``tool_calls``, ``usage``, ``stop_reason``, ``error``/``status``,
        #: ``delay``).
        self.replies: list[dict[str, Any]] = []
        #: Every request the model received, in order (:class:`dsh.core.messages.ModelRequest`,
        #: exactly as the adapter got it from dsh's transport).
        self.requests: list[ModelRequest] = []
        self._lock = threading.Lock()
        for reply in replies:
            self.add(reply)

    def add(self, reply: Mapping[str, Any]) -> Script:
        """Append a reply written as the built-in ``scripted`` model's JSON object."""
        from dsh.llm.builtin import _check_response

        self.replies.append(_check_response(dict(reply), len(self.replies), "dsh_script"))
        return self

    def text(self, text: str, **extra: Any) -> Script:
        """The model answers ``text`` (``extra``: ``usage={"input_tokens": …}``,
        ``stop_reason=…``, ``delay=seconds``)."""
        return self.add({"text": text, **extra})

    def tool_call(self, name: str, arguments: Mapping[str, Any] | None = None, /,
                  **kwargs: Any) -> Script:
        """The model calls one tool: ``tool_call("add", a=1, b=2)`` or, for argument names
        that are not identifiers, ``tool_call("add", {"a": 1})``."""
        return self.tool_calls((name, {**(arguments or {}), **kwargs}))

    def tool_calls(self, *calls: tuple[str, Mapping[str, Any]], text: str = "") -> Script:
        """The model calls several tools in one reply (they run concurrently):
        ``tool_calls(("a", {...}), ("b", {...}))``, with an optional ``text``."""
        return self.add({"text": text, "tool_calls": [
            {"name": name, "arguments": dict(args)} for name, args in calls]})

    def error(self, message: str, status: int | None = None) -> Script:
        """The provider fails: the request raises :class:`dsh.core.errors.ProviderError`
        (``scripted: MESSAGE``, with the HTTP ``status``)."""
        return self.add({"error": message, "status": status})

    def __len__(self) -> int:
        """How many replies are left."""
        return len(self.replies)

    def _take(self, request: ModelRequest) -> dict[str, Any]:
        import attrs

        with self._lock:
            # A view of the ledger's projection is stable, but a tuple reads better in a diff.
            self.requests.append(attrs.evolve(request, messages=tuple(request.messages)))
            if not self.replies:
                from dsh.core.errors import ProviderError

                raise ProviderError(
                    f"dsh.testing: the script has no reply left for request "
                    f"{len(self.requests)}: add one with dsh_script.text(...) or "
                    f".tool_call(...) before the run")
            return self.replies.pop(0)


_SCRIPTS: weakref.WeakValueDictionary[str, Script] = weakref.WeakValueDictionary()
_SCRIPT_IDS = itertools.count(1)
_MODEL_CLASS: type[Model] | None = None


def _model_class() -> type[Model]:
    """The adapter class, made on first use (dsh.llm.base imports the transport)."""
    global _MODEL_CLASS
    if _MODEL_CLASS is None:
        from dsh.core.messages import ModelResponse
        from dsh.core.messages import ToolCall
        from dsh.core.messages import Usage
        from dsh.llm.base import Model
        from dsh.llm.base import TextCallback
        from dsh.llm.builtin import _stream_words
        from dsh.llm.builtin import _wait

        class ScriptedTestModel(Model):
            """The model of the fixtures' apps: answers from a :class:`Script`."""

            def __init__(self, name: str, settings: Mapping[str, Any] | None = None) -> None:
                super().__init__(name, settings)
                key = str((settings or {}).get("script", ""))
                script = _SCRIPTS.get(key)
                if script is None:
                    from dsh.core.errors import ConfigError

                    raise ConfigError(f"model {MODEL!r} exists only in the apps of dsh.testing's "
                                      "fixtures (dsh_app, dsh_make_app)")
                self.script = script

            def complete(self, request: ModelRequest,
                         on_text: TextCallback | None = None) -> ModelResponse:
                reply = self.script._take(request)
                if reply.get("delay"):
                    _wait(float(reply["delay"]))
                if "error" in reply:
                    from dsh.core.errors import ProviderError

                    raise ProviderError(f"scripted: {reply['error']}", status=reply.get("status"))
                n = len(self.script.requests)
                text = reply.get("text", "")
                if request.stream:
                    _stream_words(text, on_text)
                # call_REPLY_CALL, both from 0: the ids `dsh run -m scripted:FILE` gives
                calls = tuple(ToolCall(id=c.get("id") or f"call_{n - 1}_{i}", name=c["name"],
                                       arguments=c.get("arguments") or {})
                              for i, c in enumerate(reply.get("tool_calls", ())))
                usage = reply.get("usage") or {}
                return ModelResponse(
                    text=text, tool_calls=calls,
                    usage=Usage(input_tokens=usage.get("input_tokens", 0),
                                output_tokens=usage.get("output_tokens", 0)),
                    stop_reason=reply.get("stop_reason", "tool_use" if calls else "end_turn"),
                    tool_call_source="native" if calls else None, model=MODEL)

        _MODEL_CLASS = ScriptedTestModel
    return _MODEL_CLASS


def _build_model(name: str, settings: Mapping[str, Any]) -> Model:
    return _model_class()(name, settings)


@hookimpl
def register_models(register: Callable[..., None]) -> None:
    """dsh hook: the scripted model, for the apps of the fixtures (they ``load`` this module)."""
    register(MODEL, _build_model, description="dsh.testing's scripted model (tests only)")


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


def request_to_dict(request: ModelRequest) -> dict[str, Any]:
    """A request as plain JSON-able data: ``model``, ``system``, ``messages`` (each with
    every field, as ``context/compacted`` writes them), ``tools`` (``name``, ``description``,
    ``parameters``), ``options`` and ``stream``."""
    from dsh.core.messages import thaw
    from dsh.ledger.serialize import dump_messages

    return {
        "model": request.model,
        "system": request.system,
        "messages": thaw(dump_messages(request.messages)),
        "tools": [{"name": t.name, "description": t.description,
                   "parameters": thaw(t.parameters)} for t in request.tools],
        "options": thaw(request.options),
        "stream": request.stream,
    }


class Result:
    """What a run or a command left behind: its session's ledger and the model's requests."""

    def __init__(self, session_id: str | None, events: list[Event],
                 requests: list[ModelRequest]) -> None:
        #: The session the run wrote (``None``: nothing was written, e.g. ``--no-save``, or
        #: a command that runs nothing).
        self.session_id = session_id
        #: The session's ledger, every event as its class in :mod:`dsh.events`, in order
        #: (the whole session: a resumed session's earlier turns too).
        self.events = events
        #: The requests the scripted model received during this run or command, in order,
        #: exactly as its adapter got them.
        self.requests = requests

    @property
    def event_dicts(self) -> list[dict[str, Any]]:
        """The events as the ledger's JSON objects (``{"v", "type", "seq", "ts",
        "session", …}``), as ``dsh run --events`` prints them."""
        from dsh.ledger.serialize import event_to_dict

        return [event_to_dict(e) for e in self.events]

    @property
    def event_types(self) -> list[str]:
        """The ``type`` of each event (``"turn/start"``, ``"user/message"``, ``"x/PLUGIN/NAME"``
        for a plugin event, …): what to compare a sequence of events with."""
        return [d["type"] for d in self.event_dicts]

    @property
    def request_dicts(self) -> list[dict[str, Any]]:
        """:attr:`requests` as plain data (:func:`request_to_dict`)."""
        return [request_to_dict(r) for r in self.requests]

    def events_of(self, kind: type[E]) -> list[E]:
        """The events of one class, in order: ``result.events_of(ToolReturned)``."""
        return [e for e in self.events if isinstance(e, kind)]


class PromptResult(Result):
    """The result of :meth:`ScriptedApp.run` (the ``dsh_run`` fixture)."""

    def __init__(self, run: RunResult, session_id: str | None, events: list[Event],
                 requests: list[ModelRequest]) -> None:
        super().__init__(session_id, events, requests)
        #: The :class:`dsh.run.app.RunResult` that ``App.run`` returned.
        self.run = run
        #: The final answer.
        self.output: str = run.output
        #: How the turn ended: ``completed``, ``error``, ``budget``, ``rejected``,
        #: ``stopped`` or ``aborted``.
        self.outcome: str = run.outcome
        #: Why it ended that way (empty when completed).
        self.reason: str = run.reason

    def __repr__(self) -> str:
        return (f"PromptResult(outcome={self.outcome!r}, output={self.output!r}, "
                f"reason={self.reason!r}, session_id={self.session_id!r})")


class CliResult(Result):
    """The result of :meth:`ScriptedApp.cli` (the ``dsh_cli`` fixture)."""

    def __init__(self, exit_code: int, stdout: str, stderr: str,
                 exception: BaseException | None, session_id: str | None,
                 events: list[Event], requests: list[ModelRequest],
                 sessions: list[str]) -> None:
        super().__init__(session_id, events, requests)
        #: The command's exit code (docs/cli.md lists them).
        self.exit_code = exit_code
        #: What the command printed on stdout (the answer) and on stderr (everything else).
        self.stdout = stdout
        self.stderr = stderr
        #: The exception that ended the command, if any (``SystemExit`` is not one).
        self.exception = exception
        #: Every session the command created or appended to, the top-level one first (a run
        #: with sub-agents also writes theirs).
        self.sessions = sessions

    def __repr__(self) -> str:
        return (f"CliResult(exit_code={self.exit_code}, stdout={self.stdout!r}, "
                f"stderr={self.stderr!r})")


# --------------------------------------------------------------------------------------------
# The app under test
# --------------------------------------------------------------------------------------------


class ScriptedApp:
    """A :class:`dsh.run.app.App` whose model is a :class:`Script`, and the ways to drive it.

    Made by the ``dsh_make_app`` fixture (``dsh_app`` is one made from ``dsh_config``).
    """

    def __init__(self, config: Mapping[str, Any], script: Script, sessions_dir: Path) -> None:
        #: The config the app was built from (after the fixture's additions).
        self.config = config
        #: The scripted model's replies and the requests it received.
        self.script = script
        #: Where the app keeps its sessions (a directory under ``tmp_path``).
        self.sessions_dir = sessions_dir
        #: The app itself: ``app.agent(NAME)``, ``app.store``, ``app.plugins``…
        self.app: App = self._build()

    def _build(self) -> App:
        from dsh.run.app import App

        return App.from_config(self.config)

    @property
    def requests(self) -> list[ModelRequest]:
        """Every request the model received from this app's runs and commands."""
        return self.script.requests

    def events(self, session_id: str) -> list[Event]:
        """The ledger of a session, typed."""
        return list(self.app.store.read(session_id))

    def state(self, key: Any, session: Any = "latest") -> Any:
        """The recorded state ``key`` (a :class:`dsh.StateKey`) of ``session`` — a session id,
        a unique prefix, ``latest``, or a run's result — folded afresh from the ledger file
        by the read-only reader (what a new process would see)."""
        return self.app.reader(str(getattr(session, "session_id", None) or session)).state(key)

    def reopen(self) -> ScriptedApp:
        """A new app from the same config, sessions and script, as a new process would
        build it: nothing kept in memory (agents, stashes, plugin state) carries over. Use it
        to test that state persisted in the ledger survives a resume."""
        return ScriptedApp(self.config, self.script, self.sessions_dir)

    def run(self, prompt: str, *, agent: str | None = None, session: str | None = None,
            **kwargs: Any) -> PromptResult:
        """Run ``prompt`` as one turn with :meth:`dsh.run.app.App.run` (``session`` resumes that
        session; other keywords as ``App.run``: ``model``, ``tools``, ``max_steps``,
        ``inject``, ``limits``, ``save``…)."""
        start = len(self.script.requests)
        result = self.app.run(prompt, agent=agent, session=session, **kwargs)
        saved = bool(result.session_id) and self.app.store.exists(result.session_id)
        return PromptResult(result, result.session_id if saved else None,
                            self.events(result.session_id) if saved else [],
                            self.script.requests[start:])

    def cli(self, *args: str, input: str | bytes | None = None,
            env: Mapping[str, str | None] | None = None,
            catch_exceptions: bool = False) -> CliResult:
        """Run ``dsh ARGS...`` in this process with click's ``CliRunner``, against this app,
        stdout and stderr apart. ``--config`` is refused: the command runs with this app's
        config (build another app with ``dsh_make_app``, or run ``dsh`` in a subprocess).

        :param input: what the command reads on stdin.
        :param env: environment variables to set (``None`` removes one) during the command.
        :param catch_exceptions: by default an unexpected exception (a bug, not a dsh error:
            those become ``dsh: error:`` and their exit code) propagates into the test with
            its traceback; true keeps it in :attr:`CliResult.exception`, exit code 1.
        """
        if any(a == "--config" or str(a).startswith("--config=") for a in args):
            raise ValueError("dsh_cli runs dsh with the app's own config, so --config would be "
                             "ignored: build an app from that config with dsh_make_app(...), "
                             "or run dsh in a subprocess")
        from click.testing import CliRunner

        from dsh.cli.root import State
        from dsh.cli.root import cli

        try:
            runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
        except TypeError:
            runner = CliRunner()  # click >= 8.2 keeps stderr apart by itself
        state = State()
        state._app = self.app
        before = self._marks()
        start = len(self.script.requests)
        outcome = runner.invoke(cli, list(args), input=input, env=env, obj=state,
                                catch_exceptions=catch_exceptions)
        changed = self._changed(before)
        events = self.events(changed[0]) if changed else []
        exception = outcome.exception
        if isinstance(exception, SystemExit):
            exception = None
        return CliResult(outcome.exit_code, outcome.stdout, outcome.stderr, exception,
                         changed[0] if changed else None, events,
                         self.script.requests[start:], changed)

    def _marks(self) -> dict[str, int]:
        """The size of every ledger file in :attr:`sessions_dir`, to tell afterwards which
        sessions a command wrote. Read from the directory, not through the app: a command
        must find the app as the test left it (not assembled yet, perhaps)."""
        marks = {}
        for path in self.sessions_dir.glob("*.jsonl"):
            try:
                marks[path.stem] = path.stat().st_size
            except OSError:
                marks[path.stem] = -1
        return marks

    def _changed(self, before: dict[str, int]) -> list[str]:
        from dsh.ledger.events import TurnStarted

        after = self._marks()
        changed = [sid for sid, mark in after.items() if before.get(sid) != mark]

        def nested(sid: str) -> bool:
            first = next((e for e in self.app.store.read(sid) if isinstance(e, TurnStarted)),
                         None)
            return first is not None and first.parent is not None

        return sorted(changed, key=nested)  # stable: top-level sessions first


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


class IsolatedEnv:
    """Where :func:`dsh_env` put dsh's state for this test (every path under ``tmp_path``)."""

    def __init__(self, root: Path) -> None:
        #: The directory of everything below.
        self.root = root
        #: ``$DSH_HOME``: dsh's data directory (the default sessions directory is in it).
        self.home = root / "home"
        #: ``$XDG_CONFIG_HOME``: dsh looks for ``dsh/config.toml`` here (there is none).
        self.config_home = root / "config"
        #: ``$XDG_DATA_HOME``, ``$XDG_CACHE_HOME``, ``$XDG_STATE_HOME``.
        self.data_home = root / "data"
        self.cache_home = root / "cache"
        self.state_home = root / "state"
        #: The names of the variables removed from the environment (their values are not
        #: kept anywhere).
        self.removed: list[str] = []
        self._apps = itertools.count(1)

    def sessions_dir(self) -> Path:
        """A new sessions directory for the next app (``sessions``, ``sessions-2``, …)."""
        n = next(self._apps)
        return self.root / ("sessions" if n == 1 else f"sessions-{n}")


@pytest.fixture
def dsh_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> IsolatedEnv:
    """Isolate dsh from the machine for one test, and say where its state goes.

    Sets ``DSH_HOME`` and ``XDG_CONFIG_HOME`` / ``XDG_DATA_HOME`` / ``XDG_CACHE_HOME`` /
    ``XDG_STATE_HOME`` to directories under ``tmp_path/dsh``; removes every other ``DSH_*``
    variable (``DSH_CONFIG``, ``DSH_LOAD_PLUGINS``…) and every variable that looks like a
    credential or an endpoint (names ending in ``API_KEY``, ``_TOKEN``, ``_SECRET``,
    ``_PASSWORD``, ``_BASE_URL``…) or a cluster (``RAY_ADDRESS``), so no test reads the
    developer's config or reaches a real provider or cluster; sets
    ``DSH_KEYS_BACKEND=file``, so keys stored with ``dsh keys`` are read from the empty config
    directory, never from the OS keyring. Everything is restored after the test.
    """
    env = IsolatedEnv(tmp_path / "dsh")
    for name in list(os.environ):
        if name.startswith("DSH_") or SECRET_VARIABLE.search(name):
            env.removed.append(name)
            monkeypatch.delenv(name)
    for name, path in (("DSH_HOME", env.home), ("XDG_CONFIG_HOME", env.config_home),
                       ("XDG_DATA_HOME", env.data_home), ("XDG_CACHE_HOME", env.cache_home),
                       ("XDG_STATE_HOME", env.state_home)):
        path.mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(path))
    monkeypatch.setenv("DSH_KEYS_BACKEND", "file")
    return env


@pytest.fixture
def dsh_config() -> dict[str, Any]:
    """The config of ``dsh_app``, as the dict a ``dsh.toml`` would load as: empty here.
    Override it in your ``conftest.py`` (or a test module) to test your plugin's setup::

        @pytest.fixture
        def dsh_config():
            return {"agents": {"writer": {"plugins": ["example"]}},
                    "plugins": {"example": {"max_words": 100}}}
    """
    return {}


@pytest.fixture
def dsh_plugins() -> list[Any]:
    """Plugins ``dsh_app`` registers in-process besides the installed ones: empty here.
    Override it to test hooks that are not installed (see ``dsh_make_app``'s ``plugins``)."""
    return []


@pytest.fixture
def dsh_make_app(dsh_env: IsolatedEnv,
                 monkeypatch: pytest.MonkeyPatch) -> Callable[..., ScriptedApp]:
    """A factory of apps under test: ``dsh_make_app(config=None, *, plugins=(),
    script=None) -> ScriptedApp``. Use it for several apps in one test, or one config per
    test; ``dsh_app`` is ``dsh_make_app(dsh_config, plugins=dsh_plugins)``.

    The app is ``App.from_config(config)`` plus:

    - ``sessions_dir``: a new directory under ``tmp_path`` (unless the config sets one);
    - ``model = "dsh-testing"``, the scripted model (unless the config sets one; an agent
      that names its own model keeps it - pass ``model=dsh.testing.MODEL`` to the run);
    - ``load``: this module (it provides the model) and the ``plugins`` given.

    Installed plugins are found through their entry points as usual (the config's
    ``autoload = false`` turns that off). ``plugins`` registers others in-process: a
    ``{"name": object}`` mapping (a module, a class instance… registered under ``name``), or
    a list of modules (registered under their ``__name__``) and importable module names.
    ``script`` is the :class:`Script` (or a list of reply dicts) to start from.
    """

    def make(config: Mapping[str, Any] | str | os.PathLike[str] | None = None, *,
             plugins: Mapping[str, Any] | Iterable[Any] = (),
             script: Script | Iterable[Mapping[str, Any]] | None = None) -> ScriptedApp:
        cfg = copy.deepcopy(dict(_config_mapping(config)))
        if not isinstance(script, Script):
            script = Script(script or ())
        key = f"script-{next(_SCRIPT_IDS)}"
        _SCRIPTS[key] = script
        if "sessions_dir" not in cfg:
            cfg["sessions_dir"] = str(dsh_env.sessions_dir())
        sessions = Path(cfg["sessions_dir"])
        cfg.setdefault("model", MODEL)
        cfg["models"] = {**cfg.get("models", {}), MODEL: {"adapter": MODEL, "script": key}}
        load = [str(x) for x in cfg.get("load", [])]
        if __name__ not in load:
            load.append(__name__)
        for name in _plugin_names(plugins, monkeypatch):
            if name not in load:
                load.append(name)
        cfg["load"] = load
        return ScriptedApp(cfg, script, sessions)

    return make


def _config_mapping(config: Mapping[str, Any] | str | os.PathLike[str] | None
                    ) -> Mapping[str, Any]:
    """``dsh_make_app``'s config as a mapping: a mapping, TOML text, or a TOML file's path
    (errors name the file and line, as ``dsh --config`` does)."""
    if config is None or isinstance(config, Mapping):
        return config or {}
    import tomllib

    from dsh.config.loader import read_config_text
    from dsh.core.errors import ConfigError
    from dsh.run.app import is_toml_text

    where = "<config text>"
    if isinstance(config, str) and is_toml_text(config):
        text = config
    else:
        where = os.fspath(config)
        try:
            text = read_config_text(Path(where))
        except FileNotFoundError:
            raise ConfigError(f"{where}: config file not found") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from None


def _plugin_names(plugins: Mapping[str, Any] | Iterable[Any],
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The ``load`` names of ``plugins``, registering objects in ``sys.modules`` (undone
    after the test), where dsh's ``load`` finds them."""
    items: Iterable[tuple[str | None, Any]] = (
        plugins.items() if isinstance(plugins, Mapping) else ((None, p) for p in plugins))
    for name, obj in items:
        if name is None:
            if isinstance(obj, str):
                yield obj
                continue
            if not isinstance(obj, types.ModuleType):
                raise TypeError(f"dsh_make_app(plugins=...): {obj!r} is not a module: pass "
                                "{'NAME': plugin} to name it")
            name = obj.__name__
        if sys.modules.get(name) is not obj:
            monkeypatch.setitem(sys.modules, name, obj)
        yield name


@pytest.fixture
def dsh_app(dsh_make_app: Callable[..., ScriptedApp], dsh_config: dict[str, Any],
            dsh_plugins: list[Any]) -> ScriptedApp:
    """The app under test: :class:`ScriptedApp` built from ``dsh_config`` and
    ``dsh_plugins`` (``dsh_make_app`` says what it adds)."""
    return dsh_make_app(dsh_config, plugins=dsh_plugins)


@pytest.fixture
def dsh_script(dsh_app: ScriptedApp) -> Script:
    """The scripted model of ``dsh_app``: add the replies a test needs, read the requests it
    received."""
    return dsh_app.script


@pytest.fixture
def dsh_run(dsh_app: ScriptedApp) -> Callable[..., PromptResult]:
    """Run a prompt in ``dsh_app``: ``dsh_run(prompt, *, agent=None, session=None, **kw)
    -> PromptResult`` (:meth:`ScriptedApp.run`)."""
    return dsh_app.run


@pytest.fixture
def dsh_cli(dsh_app: ScriptedApp) -> Callable[..., CliResult]:
    """Run ``dsh ARGS...`` in-process against ``dsh_app``: ``dsh_cli("run", "-a", "writer",
    "hello", input=None, env=None) -> CliResult`` (:meth:`ScriptedApp.cli`)."""
    return dsh_app.cli
