"""The ACP agent of ``dsh acp``: the protocol's methods over dsh's apps, sessions and turns.

Each session's app is the person's config with the workbench's workspace
(``[plugins.shell] workspace``, the agents' own too) set to the session's ``cwd``, which must
be an existing directory inside the allowed roots (where ``dsh acp`` started, and its
``--root`` options). A prompt is one dsh turn in a worker thread (:mod:`dsh_acp.turns`); a
second prompt to a session whose turn runs is refused with a JSON-RPC error. Client-supplied
MCP servers are not started (dsh-acp advertises no MCP capability): they are refused, named
on stderr and in the response's ``_meta``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from typing import Any
from typing import cast

import acp
from acp import RequestError
from acp import schema

from dsh_acp import convert
from dsh_acp import options
from dsh_acp.transport import LineTransport
from dsh_acp.transport import claim_stdio

#: Sessions listed per ``session/list`` page.
PAGE = 50
#: The workbench's terminal under ``dsh acp``: a path that cannot be opened.
NO_TERMINAL = os.path.join(os.devnull, "no-terminal-under-dsh-acp")


def _refuse(message: str, **data: Any) -> RequestError:
    return RequestError(-32602, message, data or None)


def _busy(message: str) -> RequestError:
    return RequestError(-32600, message)


class DshAgent:
    """The :class:`acp.interfaces.Agent` of ``dsh acp``."""

    def __init__(self, state: Any, *, allowed: list[str], agent: str | None,
                 model: str | None, mode: str | None, permission_timeout: float,
                 config: Any = None) -> None:
        self.state = state
        self.allowed = allowed
        self.agent_name = agent
        self.model = model
        self.mode = mode
        self.permission_timeout = permission_timeout
        self.sessions: dict[str, Any] = {}
        self.apps: dict[str, Any] = {}
        self.conn: Any = None
        self.loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.outbox: Any = None
        self.closing = False
        self._config: Any = config
        self._app: Any = None

    def on_connect(self, conn: Any) -> None:
        from dsh_acp.turns import Outbox

        self.conn = conn
        self.outbox = Outbox(self.loop, conn)

    # -- apps -----------------------------------------------------------------------------

    def _base_config(self) -> Any:
        if self._config is None:
            self._config = _config_of(self.state)
        return self._config

    def _base_app(self) -> Any:
        """The app of the person's config as it is (listing sessions)."""
        if self._app is None:
            from dsh.run.app import App

            self._app = App(self._base_config())
        return self._app

    def app_for(self, cwd: str) -> Any:
        """The app of sessions in ``cwd``: the config with the workbench's workspace set to
        it, and its terminal (``ask_user``'s, ``tty``) none: the person is in the editor, so
        a question the workbench would type on a terminal fails at once ("no one can
        answer"), as when dsh runs without one."""
        app = self.apps.get(cwd)
        if app is None:
            import attrs

            from dsh.run.app import App

            cfg = self._base_config()
            shell = {"workspace": cwd, "tty": NO_TERMINAL}
            plugins = {**cfg.plugins, "shell": {**cfg.plugins.get("shell", {}), **shell}}
            agents = {}
            for name, acfg in cfg.agents.items():
                own = acfg.plugin_settings
                if own.get("shell", {}).keys() & shell.keys():
                    own = {**own, "shell": {**own["shell"], **shell}}
                agents[name] = attrs.evolve(acfg, plugin_settings=own)
            app = self.apps[cwd] = App(attrs.evolve(cfg, plugins=plugins, agents=agents))
        return app

    def check_cwd(self, cwd: Any) -> str:
        if not isinstance(cwd, str) or not os.path.isabs(cwd) or "\0" in cwd:
            raise _refuse(f"cwd must be an absolute path, got {cwd!r}"[:300])
        real = os.path.realpath(cwd)
        if not os.path.isdir(real):
            raise _refuse(f"cwd {cwd} is not an existing directory", cwd=cwd)
        if self.inside(real):
            return real
        raise _refuse(f"cwd {cwd} is outside the directories dsh acp serves "
                      f"({', '.join(self.allowed)}); start dsh acp there or give --root",
                      cwd=cwd)

    def inside(self, real: str) -> bool:
        return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep)
                   for r in self.allowed)

    def _session(self, session_id: Any) -> Any:
        found = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if found is None:
            raise _refuse(f"unknown session {session_id!r}: create one with session/new or "
                          "load it with session/load"[:300], sessionId=str(session_id)[:200])
        return found

    # -- the protocol ---------------------------------------------------------------------

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> schema.InitializeResponse:
        from dsh import __version__

        # The client's version when dsh speaks it, else the latest dsh speaks (the client
        # then decides whether to go on).
        return schema.InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=schema.AgentCapabilities(
                load_session=True,
                prompt_capabilities=schema.PromptCapabilities(
                    image=False, audio=False, embedded_context=True),
                mcp_capabilities=schema.McpCapabilities(http=False, sse=False),
                session_capabilities=schema.SessionCapabilities(
                    list=schema.SessionListCapabilities())),
            agent_info=schema.Implementation(name="dsh", title="dsh", version=__version__),
            auth_methods=[])

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        raise _refuse(f"dsh acp has no authentication method {method_id!r}"[:200])

    def _refused_servers(self, servers: Any) -> dict[str, Any] | None:
        if not servers:
            return None
        names = [str(getattr(s, "name", "?"))[:100] for s in servers]
        _warn(f"acp: the editor's MCP servers are not started ({', '.join(names)}): dsh acp "
              "runs only the servers of the person's own config ([plugins.mcp])")
        return {"dsh": {"refusedMcpServers": names,
                        "reason": "dsh acp does not start MCP servers an editor supplies; "
                                  "configure them in [plugins.mcp]"}}

    async def new_session(self, cwd: str, additional_directories: Any = None,
                          mcp_servers: Any = None, **kwargs: Any) -> schema.NewSessionResponse:
        real = self.check_cwd(cwd)
        meta = self._refused_servers(mcp_servers)
        acp_session = await self._open(real, None)
        await self._commands(acp_session)
        return schema.NewSessionResponse(session_id=acp_session.id,
                                         modes=options.modes(acp_session.mode),
                                         config_options=options.config_options(acp_session),
                                         field_meta=meta)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           additional_directories: Any = None, **kwargs: Any
                           ) -> schema.LoadSessionResponse:
        real = self.check_cwd(cwd)
        if session_id in self.sessions:
            raise _busy(f"session {session_id} is already open in this connection")
        meta = self._refused_servers(mcp_servers)
        acp_session = await self._open(real, session_id)
        events = await asyncio.to_thread(acp_session.app.store.read, acp_session.id)
        for update in convert.replay(events, real):
            self.outbox.put(acp_session.id, update)
        await self._commands(acp_session)
        await self.outbox.flush()
        return schema.LoadSessionResponse(modes=options.modes(acp_session.mode),
                                         config_options=options.config_options(acp_session),
                                         field_meta=meta)

    async def _open(self, cwd: str, session_id: str | None) -> Any:
        from dsh.core.errors import DshError

        try:
            acp_session = await asyncio.to_thread(self._open_now, cwd, session_id)
        except DshError as exc:
            raise _refuse(str(exc)[:500]) from None
        self.sessions[acp_session.id] = acp_session
        return acp_session

    def _open_now(self, cwd: str, session_id: str | None) -> Any:
        from dsh.core.errors import UsageError
        from dsh_acp.turns import AcpSession
        from dsh_acp.turns import in_directory

        app = self.app_for(cwd)
        name = self.agent_name
        model = self.model
        if session_id is not None:
            store = app.store
            if not store.exists(session_id):  # store.path refuses ids that name other files
                raise UsageError(f"no session {session_id!r}")
            events = store.read(session_id)
            where = convert.recorded_cwd(events)
            if where is not None and not self.inside(os.path.realpath(where)):
                raise UsageError(f"session {session_id!r} ran in {where}, outside the "
                                 f"directories dsh acp serves ({', '.join(self.allowed)})")
            recorded = convert.recorded(events)
            if name is None and recorded[0] in app.config.agent_names():
                name = recorded[0]
            model = model or recorded[1]
        name = name or app.config.agent
        with in_directory(cwd):
            overrides: dict[str, Any] = {"model": model} if model else {}
            if self.mode:
                overrides["mode"] = self.mode
            agent = app.agent(name, **overrides)
            session = app.open_session(agent, session_id)
        return AcpSession(self, app, session, cwd, name, self.mode or agent.mode, model)

    async def _commands(self, acp_session: Any) -> None:
        from dsh.run.commands import known_commands

        agent = acp_session.session.agent
        try:
            known = known_commands(agent.pm, agent.handle)
        except Exception as exc:  # noqa: BLE001 - a plugin's listing: said, not fatal
            _warn(f"warning: listing commands failed: {type(exc).__name__}: {exc}")
            return
        if not known:
            return
        commands = [schema.AvailableCommand(
            name=n, description=d or n, input=schema.AvailableCommandInput(
                root=schema.UnstructuredCommandInput(hint="arguments")))
            for n, d in sorted(known.items())]
        self.outbox.put(acp_session.id, schema.AvailableCommandsUpdate(
            session_update="available_commands_update", available_commands=commands))

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None,
                            **kwargs: Any) -> schema.ListSessionsResponse:
        real = self.check_cwd(cwd) if cwd is not None else None
        start = int(cursor) if isinstance(cursor, str) and cursor.isdigit() else 0
        found = await asyncio.to_thread(self._list, real, start)
        more = str(start + PAGE) if len(found) > PAGE else None
        return schema.ListSessionsResponse(sessions=found[:PAGE], next_cursor=more)

    def _list(self, cwd: str | None, start: int) -> list[schema.SessionInfo]:
        from dsh.ledger.reader import newest_sessions

        app = self._base_app()
        out: list[schema.SessionInfo] = []
        skipped = 0
        for info in newest_sessions(app.store, roots=True):
            where = info.cwd and os.path.realpath(info.cwd)
            if not where or (cwd is not None and where != cwd):
                continue
            if not self.inside(where):
                continue
            if skipped < start:
                skipped += 1
                continue
            title = (info.first_prompt or "").strip().splitlines()
            out.append(schema.SessionInfo(session_id=info.id, cwd=where,
                                          title=title[0][:100] if title else None,
                                          updated_at=info.started or None))
            if len(out) > PAGE:
                break
        return out

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> None:
        await self._set(self._session(session_id), "mode", mode_id)

    async def set_config_option(self, config_id: str, session_id: str, value: Any,
                                **kwargs: Any) -> schema.SetSessionConfigOptionResponse:
        acp_session = self._session(session_id)
        await self._set(acp_session, config_id, value)
        return schema.SetSessionConfigOptionResponse(
            config_options=options.config_options(acp_session))

    async def _set(self, acp_session: Any, config_id: str, value: Any) -> None:
        """From the next prompt on (a running turn keeps its mode and model)."""
        from dsh.core.errors import DshError

        try:
            await asyncio.to_thread(options.set_option, acp_session, config_id, value)
        except (ValueError, DshError) as exc:
            raise _refuse(str(exc)[:500]) from None

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any
                     ) -> schema.PromptResponse:
        acp_session = self._session(session_id)
        try:
            text = convert.prompt_text(prompt)
        except ValueError as exc:
            raise _refuse(str(exc)[:300]) from None
        if self.closing:  # the editor closed its end: nothing more runs
            return schema.PromptResponse(stop_reason="cancelled")
        if acp_session.running:
            raise _busy(f"session {session_id} is already running a prompt; send "
                        "session/cancel or wait for its answer")
        acp_session.running = True
        acp_session.cancelled = acp_session.taken = False
        acp_session.ctx = acp_session._stop_reason = None
        done: asyncio.Future[Any] = self.loop.create_future()

        def work() -> None:
            try:
                outcome: tuple[bool, Any] = (True, acp_session.run(text))
            except BaseException as exc:  # noqa: BLE001 - answered to the editor
                outcome = (False, exc)
            try:
                self.loop.call_soon_threadsafe(_settle, done, outcome)
            except RuntimeError:
                pass

        thread = threading.Thread(target=work, name=f"dsh-acp-{session_id}", daemon=True)
        acp_session.thread = thread
        thread.start()
        try:
            ok, value = await done
        except asyncio.CancelledError:  # the connection closed: abort the run
            acp_session.cancel("the editor disconnected")
            raise
        finally:
            acp_session.running = False
        await self.outbox.flush()
        if not ok:
            from dsh.core.errors import DshError

            if isinstance(value, DshError):
                raise _refuse(str(value)[:1000])
            raise RequestError(-32603, f"the turn failed: {type(value).__name__}: "
                                       f"{value}"[:1000])
        if value.outcome == "error" and not acp_session.cancelled:
            raise RequestError(-32603, f"the turn ended with an error: {value.reason}"[:1000],
                               {"sessionId": session_id, "outcome": value.outcome})
        return schema.PromptResponse(stop_reason=acp_session.stop_reason(value))

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        found = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if found is not None:
            found.cancel()

    # -- the end --------------------------------------------------------------------------

    def disconnected(self) -> None:
        """The end of input: abort the running turns (their prompts answer ``cancelled``)."""
        self.closing = True
        for acp_session in self.sessions.values():
            acp_session.cancel("the editor disconnected")

    async def shutdown(self) -> None:
        """The editor is gone: abort the turns, wait for them to close their ledgers."""
        self.closing = True
        for acp_session in self.sessions.values():
            acp_session.cancel("the editor disconnected")
        for acp_session in list(self.sessions.values()):
            thread = acp_session.thread
            if thread is not None and thread.is_alive():
                await asyncio.to_thread(thread.join, 60)
            try:
                acp_session.session.close()
            except Exception as exc:  # noqa: BLE001 - every session gets closed
                _warn(f"warning: closing session {acp_session.id}: {exc}")


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if not future.done():
        future.set_result(outcome)


def _warn(text: str) -> None:
    from dsh.core.escape import escape_controls

    sys.stderr.write(f"dsh: {escape_controls(text, newlines=False)}\n")
    sys.stderr.flush()


class _LogFormat(logging.Formatter):
    """The SDK's log lines on stderr: controls a client sent (a method name, a value) made
    visible, and no traceback for what is the client's fault (an unknown notification, bad
    params)."""

    def format(self, record: logging.LogRecord) -> str:
        from pydantic import ValidationError

        from dsh.core.escape import escape_controls

        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, (RequestError, ValidationError)):
            return escape_controls(super().format(record))
        record.exc_info = record.exc_text = None
        text = f"{super().format(record)}: {type(exc).__name__}: {exc}"
        return escape_controls(text)


def _config_of(state: Any) -> Any:
    """The person's config, its ``sessions_dir`` made absolute (turns change the working
    directory)."""
    import attrs

    from dsh.config.loader import load_config

    cfg = load_config(state.config_path)
    if cfg.sessions_dir and not os.path.isabs(os.path.expanduser(cfg.sessions_dir)):
        cfg = attrs.evolve(cfg, sessions_dir=os.path.abspath(cfg.sessions_dir))
    return cfg


def _check(state: Any, agent: str | None, model: str | None, mode: str | None) -> Any:
    """The config, with the agent and model of the sessions built once to fail now, not at
    the first prompt."""
    from dsh.run.app import App

    cfg = _config_of(state)
    app = App(cfg)
    overrides: dict[str, Any] = {"model": model} if model else {}
    if mode:
        overrides["mode"] = mode
    built = app.agent(agent, **overrides)
    built.model.provider_tools(built.tool_specs)
    return cfg


def serve(state: Any, *, allowed: list[str], agent: str | None, model: str | None,
          mode: str | None, permission_timeout: float, max_line: int) -> None:
    """Serve ACP on this process's stdin/stdout until the editor closes stdin. The config,
    the agent and the model are checked first: a bad one is an error on stderr (exit 2 for
    a usage or config error) before anything is served."""
    checked = _check(state, agent, model, mode)
    fd_in, fd_out = claim_stdio()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogFormat("dsh: acp: %(levelname)s: %(message)s"))
    logging.basicConfig(handlers=[handler], level=logging.WARNING)

    ended: list[int] = []

    async def main() -> None:
        import signal

        transport = LineTransport(fd_in, fd_out, max_line)
        await transport.start()
        loop = asyncio.get_running_loop()

        def terminated(signum: int) -> None:
            # As the end of input: the turns are aborted, open requests answered, the
            # sessions closed; then the exit code says which signal (143, 129).
            ended.append(signum)
            transport.stop()

        for signum in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, terminated, signum)
        dsh_agent = DshAgent(state, allowed=allowed, agent=agent, model=model, mode=mode,
                             permission_timeout=permission_timeout, config=checked)
        transport.on_eof = dsh_agent.disconnected
        conn = acp.core.AgentSideConnection(cast(Any, dsh_agent), transport, listening=False)
        try:
            await conn.listen()
        finally:
            await dsh_agent.shutdown()
            await conn.close()

    asyncio.run(main())
    if ended:
        import click

        raise click.exceptions.Exit(128 + ended[0])
