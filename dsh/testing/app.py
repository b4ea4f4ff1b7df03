"""The app under test and what its runs leave behind.

:class:`ScriptedApp` is a :class:`dsh.run.app.App` whose model is a
:class:`~dsh.testing.script.Script`, with the ways to drive it: a prompt in this process
(:meth:`ScriptedApp.run`, a :class:`PromptResult`) or a ``dsh`` command through click's
``CliRunner`` (:meth:`ScriptedApp.cli`, a :class:`CliResult`). Both results carry the session's
ledger events, typed and as the ledger's JSON objects, and the exact requests the model
received (:func:`request_to_dict` gives one as plain data).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

if TYPE_CHECKING:
    from dsh.core.messages import ModelRequest
    from dsh.ledger.events import Event
    from dsh.run.app import App
    from dsh.run.app import RunResult
    from dsh.testing.script import Script

E = TypeVar("E", bound="Event")


def request_to_dict(request: ModelRequest) -> dict[str, Any]:
    """A request as plain JSON-able data: ``model``, ``system``, ``messages`` (each with
    every field, as ``context/compacted`` writes them), ``tools`` (``name``, ``description``,
    ``parameters``), ``options`` and ``stream``."""
    from dsh.run.replay import request_dict

    return {**request_dict(request), "stream": request.stream}


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

    def plugin_events(self, plugin: str, name: str | None = None) -> list[Mapping[str, Any]]:
        """The ``data`` of the session's ``x/PLUGIN/NAME`` events, in ledger order (read-only
        mappings; ``name`` None: every event of ``plugin``). A :class:`dsh.StateKey`'s
        updates are such events: ``result.plugin_events("dsh-notes", "notes")``."""
        from dsh.ledger.events import PluginEvent

        return [e.data for e in self.events if isinstance(e, PluginEvent)
                and e.plugin == plugin and (name is None or e.name == name)]


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


def limits_of(value: Mapping[str, Any]) -> Any:
    """A :class:`dsh.Limits` from a mapping (``{"steps": 3, "cost": 0.5}``); an unknown name
    is a :class:`TypeError` naming the nearest one."""
    from dsh.core.errors import unknown_name
    from dsh.host.runcontext import LIMIT_NAMES
    from dsh.host.runcontext import Limits

    for name in value:
        if name not in LIMIT_NAMES:
            raise TypeError("limits: " + unknown_name("limit", str(name), LIMIT_NAMES, "known"))
    return Limits(**value)


# --------------------------------------------------------------------------------------------
# The app under test
# --------------------------------------------------------------------------------------------


class ScriptedApp:
    """A :class:`dsh.run.app.App` whose model is a :class:`Script`, and the ways to drive it.

    Made by the ``dsh_make_app`` fixture (``dsh_app`` is one made from ``dsh_config``).
    """

    def state(self, key: Any, session: Any = "latest") -> Any:
        """The recorded state ``key`` (a :class:`dsh.StateKey`) of ``session`` — a session id,
        a unique prefix, ``latest``, or a run's result — folded afresh from the ledger file
        by the read-only reader (what a new process would see)."""
        return self.app.reader(str(getattr(session, "session_id", None) or session)).state(key)

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

    def reopen(self) -> ScriptedApp:
        """A new app from the same config, sessions and script, as a new process would
        build it: nothing kept in memory (agents, stashes, plugin state) carries over. Use it
        to test that state persisted in the ledger survives a resume."""
        return ScriptedApp(self.config, self.script, self.sessions_dir)

    def run(self, prompt: str, *, agent: str | None = None, session: str | None = None,
            **kwargs: Any) -> PromptResult:
        """Run ``prompt`` as one turn with :meth:`dsh.run.app.App.run` (``session`` resumes that
        session; other keywords as ``App.run``: ``model``, ``tools``, ``max_steps``,
        ``inject``, ``limits``, ``save``…). ``limits`` may be a mapping,
        ``{"steps": 3}``, as well as a :class:`dsh.Limits`."""
        if isinstance(kwargs.get("limits"), Mapping):
            kwargs["limits"] = limits_of(kwargs["limits"])
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

        from dsh.cli.root import cli
        from dsh.cli.shared import State

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
