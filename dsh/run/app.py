"""The library API: assemble an app from a config, run prompts, resume sessions.

Assembly (MISSION D1) reads the config and builds plugin managers, tool tables and prompts;
it does no other I/O. Execution happens per run: a :class:`~dsh.host.runcontext.RunContext` is
opened,
events are appended to the session ledger, and ``run_turn`` drives the loop.

    app = App.from_config("dsh.toml")          # or a dict, or None for the defaults
    result = app.run("hello", model="echo")
    again = app.run("and then?", session=result.session_id)

This module holds :class:`App` (config, plugins, models, the session store, agents, sessions,
``run`` and ``parallel``) and the choice of the default model (:func:`choose_default_model`).
An assembled agent is :mod:`dsh.run.agent`, an open session and its turns
:mod:`dsh.run.session`, the sub-agent tool :mod:`dsh.run.subagent`; their names are
re-exported here (this was one module until issue 21).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dsh.config.loader import Config
from dsh.config.loader import config_from_dict
from dsh.config.loader import load_config
from dsh.core.errors import PluginError
from dsh.core.errors import UsageError
from dsh.host.manager import PluginRecord
from dsh.host.manager import call_impl
from dsh.host.manager import discover
from dsh.host.manager import make_plugin_manager
from dsh.host.runcontext import Limits
from dsh.host.stash import Stash
from dsh.ledger.writer import Ledger
from dsh.ledger.writer import new_session_id
from dsh.llm.base import Model
from dsh.llm.base import ModelEntry
from dsh.run.agent import _BUILD_LOCK
from dsh.run.agent import Agent as Agent  # re-exported
from dsh.run.agent import check_tool_names as check_tool_names  # re-exported
from dsh.run.agent import configure
from dsh.run.result import RunResult as RunResult  # re-exported: dsh.RunResult
from dsh.run.session import Session as Session  # re-exported
from dsh.run.session import describe_error as describe_error  # re-exported
from dsh.run.session import withheld_reasoning as withheld_reasoning  # re-exported
from dsh.run.subagent import MAX_DEPTH as MAX_DEPTH  # re-exported
from dsh.run.subagent import check_subagent as check_subagent  # re-exported
from dsh.run.subagent import subagent_tool as subagent_tool  # re-exported

#: ``(environment variable, model id)``: the model used when the config sets none and the
#: variable holds a key, in this order.
PROVIDER_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("OPENAI_API_KEY", "openai:gpt-4o-mini"),
    ("ANTHROPIC_API_KEY", "anthropic:claude-haiku-4-5"),
)


@attrs.frozen
class DefaultModel:
    """The default model: its ``id``, ``why`` it was chosen, and whether it is the offline
    ``echo`` fallback (``dsh run`` and ``dsh chat`` then say so on stderr)."""

    id: str
    why: str
    fallback: bool = False


def is_toml_text(source: str) -> bool:
    """Whether ``source`` (given where a config file's path or text may be) is TOML text."""
    if "\n" not in source and "=" not in source:
        return False
    try:
        return not os.path.exists(source)
    except (OSError, ValueError):  # a NUL byte, a name too long: not a path
        return True


def frozen_states(projection: Any) -> list[tuple[Any, Any]]:
    """``(key, value)`` of every recorded state (dsh.ledger.state) the session has updated,
    for the keys this process knows: what a ``parallel`` child starts from."""
    index = projection.plugin_index
    if not index:
        return []
    from dsh.ledger.state import KEYS

    return [(KEYS[k], KEYS[k].read(projection)) for k in index
            if isinstance(k, tuple) and k in KEYS]


def choose_default_model(app: App) -> DefaultModel:
    cfg = app.config
    if cfg.model:
        return DefaultModel(cfg.model, f"set in {cfg.source or 'the config'}")
    for env, model in PROVIDER_DEFAULTS:
        if os.environ.get(env, "").strip():
            return DefaultModel(model, f"no model configured and {env} is set")
    stored = _stored_key_names()
    for _env, model in PROVIDER_DEFAULTS:
        name = model.partition(":")[0]  # the provider's name is its stored key's default name
        if name in stored:
            return DefaultModel(model, f"no model configured and a key {name!r} is stored "
                                       "(dsh keys)")
    offered = app.pm.hook.default_model()
    if offered:
        model, why = offered
        return DefaultModel(str(model), f"no model configured and no provider key set; {why}")
    return DefaultModel("echo", "no model configured, no provider key in the environment "
                                "(OPENAI_API_KEY, ANTHROPIC_API_KEY) and no local model",
                        fallback=True)


def _stored_key_names() -> frozenset[str]:
    """The names of the stored keys (dsh keys), or none when the key store cannot be read:
    choosing a default model is no reason to fail (``dsh keys list`` reports the problem)."""
    from dsh.core.errors import ConfigError

    try:
        from dsh.config.keys import store

        return frozenset(store().names())
    except (ConfigError, OSError):
        return frozenset()


class App:
    """An assembled dsh application: config, plugins, agents, session store."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self._plugins: list[PluginRecord] | None = None
        self._pm: Any = None
        self._agents: dict[Any, Agent] = {}
        self._models: dict[str, ModelEntry] | None = None
        self._store: Any = None
        self._default_model: DefaultModel | None = None
        #: App scope for plugins (``handle.app_stash``): as long as this object lives.
        self.stash = Stash()
        self._agent_stashes: dict[str, Stash] = {}
        #: Notes for the user (an agent a plugin registers that the config overrides), which
        #: the command line prints on stderr as ``dsh: note: …``.
        self.notes: list[str] = []
        #: Where each agent a plugin registered comes from (a file), for error messages.
        self.agent_sources: dict[str, str] = {}

    def agent_stash(self, name: str) -> Stash:
        """The agent-scope stash of agent ``name`` in this app (``handle.stash``): shared by
        its variants with overrides (``agent(name, model=…)``), never by another app."""
        return self._agent_stashes.setdefault(name, Stash())

    @classmethod
    def from_config(cls, source: str | Path | Mapping[str, Any] | None = None) -> App:
        """Assemble from a TOML file path, TOML text, a mapping, or (``None``) the default
        config file. A string is TOML text when it has a line break or an ``=`` and names no
        existing file; invalid TOML text is a :class:`~dsh.core.errors.ConfigError` with the
        line (``<config text>`` stands for the file name)."""
        if isinstance(source, Mapping):
            return cls(config_from_dict(source))
        if isinstance(source, str) and is_toml_text(source):
            import tomllib

            from dsh.core.errors import ConfigError

            try:
                data = tomllib.loads(source)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"<config text>: invalid TOML: {exc}") from None
            return cls(config_from_dict(data, source="<config text>", text=source))
        return cls(load_config(source))

    @property
    def plugins(self) -> list[PluginRecord]:
        """Installed plugins (imported once), with their load errors."""
        if self._plugins is None:
            cfg = self.config
            self._plugins = discover(cfg.autoload, cfg.load, cfg.strict_plugins,
                                     cfg.disable, cfg.source or "config")
        return self._plugins

    @property
    def pm(self) -> Any:
        """The app-wide plugin manager: built-ins plus every installed plugin."""
        if self._pm is None:
            cfg = self.config
            self._pm = make_plugin_manager(self.plugins, cfg.disable, cfg.strict_plugins,
                                           complete=True, where=cfg.source or "config")
            try:
                configure(self._pm, self)  # a plugin's configure may already use app.pm
                if self._pm.hook.register_agents.get_hookimpls():
                    from dsh.run.plugin_agents import merge_agents

                    self.config, notes = merge_agents(self.config, self._pm, self)
                    self.notes.extend(notes)
            except BaseException:
                self._pm = None  # half-configured: the next use fails the same way
                raise
        return self._pm

    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = self.pm.hook.session_store(app=self)
            if self._store is None:
                raise PluginError("no plugin provides 'session_store' (is dsh.ledger blocked?)",
                                  hook="session_store")
        return self._store

    @property
    def default_model(self) -> DefaultModel:
        """The model of agents that set none, and why it was chosen: the config's ``model``;
        else the first provider whose API key is in the environment
        (:data:`PROVIDER_DEFAULTS`); else what a plugin offers (``default_model`` hook, e.g.
        dsh-llama when a local model is installed); else the offline ``echo`` model."""
        if self._default_model is None:
            self._default_model = choose_default_model(self)
        return self._default_model

    @property
    def models(self) -> dict[str, ModelEntry]:
        if self._models is None:
            table: dict[str, ModelEntry] = {}
            for impl in self.pm.hook.register_models.get_hookimpls():
                plugin = impl.plugin_name

                def register(prefix: str, factory: Any, description: str = "",
                             models: Any = None, _plugin: str = plugin) -> None:
                    if prefix in table:
                        raise PluginError(
                            f"model prefix {prefix!r} registered twice: by "
                            f"{table[prefix].plugin} and {_plugin}", plugin=_plugin,
                            hook="register_models")
                    table[prefix] = ModelEntry(prefix, factory, _plugin, description, models)

                call_impl(impl, "register_models", register=register)
            self._models = table
        return self._models

    def adapter_entry(self, model_id: str) -> tuple[ModelEntry | None, str, str, dict[str, Any]]:
        """Which registered adapter serves ``model_id``: ``(entry or None, prefix, the
        adapter's model name, the ``[models.ID]`` settings)`` — an alias's ``adapter`` and
        ``model`` keys, else the id's ``prefix:name``."""
        settings = dict(self.config.models.get(model_id, {}))
        if "adapter" in settings:
            prefix, name = settings["adapter"], settings.get("model", model_id)
        else:
            prefix, _, name = model_id.partition(":")
        return self.models.get(prefix), prefix, name, settings

    def build_model(self, model_id: str) -> Model:
        """The adapter for ``model_id`` (``echo``, ``scripted:PATH``, ``openai:gpt-4o``, or a
        ``[models.ID]`` alias with an ``adapter`` key)."""
        entry, prefix, name, settings = self.adapter_entry(model_id)
        if entry is None:
            from dsh.run.model_names import did_you_mean

            known = ", ".join(sorted(self.models)) or "none"
            near = did_you_mean(model_id, self.config.models, self.models)
            raise UsageError(f"unknown model {model_id!r}: no adapter {prefix!r} "
                             f"(known: {known}){near}")
        model = entry.build(name, settings)
        model.check()
        return model

    def agent(self, name: str | None = None, **overrides: Any) -> Agent:
        """The assembled agent ``name`` (default: the config's ``agent``), memoised."""
        _ = self.pm  # plugins may register agents (register_agents): merged into the config
        name = name or self.config.agent
        if isinstance(overrides.get("model"), str) and not overrides["model"].strip():
            raise UsageError("-m needs a model name (got an empty one)")
        if name not in self.config.agent_names():
            from dsh.config.loader import unknown_agent

            raise unknown_agent(self.config, name)
        key = (name, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        agent = self._agents.get(key)
        if agent is None:
            with _BUILD_LOCK:  # parallel sub-agents of one name share one Agent
                agent = self._agents.get(key)
                if agent is None:
                    agent = self._agents[key] = Agent(self, name, **overrides)
        return agent

    def open_session(self, agent: Agent, session_id: str | None = None, *,
                     save: bool = True, create: bool = False) -> Session:
        """A new session (``session_id=None``), or an existing one resumed; with ``create``,
        a new session with the given id (sub-agents choose their child's id up front)."""
        # Resolve the adapter (and check its key) before any I/O, and convert the tool table
        # to the provider's format now, once, rather than on every request (D1).
        agent.model.provider_tools(agent.tool_specs)
        _ = agent.options  # merged and checked now: a protocol key is a ConfigError, no I/O
        if not save:
            if session_id is not None:
                raise UsageError("--no-save cannot resume a saved session")
            return Session(agent, Ledger(new_session_id()))
        if session_id is None or create:
            return Session(agent, self.store.create(session_id))
        return Session(agent, self.store.open(session_id))

    def reader(self, session: str = "latest") -> Any:
        """Open a stored session read-only (issue 25): ``session`` is an id, a unique prefix of
        one, or ``latest``. No model, no key and no lock are needed: it reads while a run
        holds the session. Returns a :class:`dsh.ledger.reader.SessionReader` (events, plugin
        events, history, recorded state)."""
        from dsh.ledger.reader import open_session

        return open_session(self.store, session)

    def session(self, agent: str | None = None, session_id: str | None = None, *,
                save: bool = True, **overrides: Any) -> Session:
        return self.open_session(self.agent(agent, **overrides), session_id, save=save)

    def run(self, prompt: str, *, agent: str | None = None, session: str | None = None,
            save: bool = True, inject: list[str] | None = None, **kwargs: Any) -> RunResult:
        """Run ``prompt`` as one turn; ``session`` resumes that session.

        Agent overrides (``model``, ``system``, ``tools``, ``max_steps``, ``options``) and
        :meth:`Session.send` options are accepted as keywords.
        """
        overrides = {k: kwargs.pop(k) for k in ("model", "system", "tools", "max_steps", "mode",
                                                "options") if kwargs.get(k) is not None}
        with self.session(agent, session, save=save, **overrides) as s:
            for item in inject or ():
                s.inject(item)
            return s.send(prompt, **kwargs)

    def parallel(self, tasks: list[tuple[str, str]], *, parent: Session | None = None,
                 limits: Limits | None = None, max_workers: int = 4) -> list[RunResult]:
        """Run several agents at once (MISSION D6); return their results in task order.

        :param tasks: ``(agent, prompt)`` pairs.
        :param parent: a session whose history each task starts from — a frozen read, taken
            once before any task runs, injected into each child session as context (so it is
            in the child's ledger, C3) — and into whose inbox the results are then injected
            in task order, whatever order they finished in.

        Each task runs in its own thread, in its own copy of the caller's context, in its own
        session. A task that fails is reported in its result and does not affect the others.

        Called inside a run (from a tool or a hook), each task is a nested run of it: its
        budget is chained to the run's, so the run's limits hold over all the tasks together
        (D8); the run's cancellation reaches it; its first ``turn/start`` names the run's
        session as ``parent``.
        """
        import contextvars
        from concurrent.futures import ThreadPoolExecutor

        from dsh.host.runcontext import current_or_none
        from dsh.ledger.history import render_history

        frozen = render_history(parent.ledger.projection.view()) if parent else ""
        states = frozen_states(parent.ledger.projection) if parent else []
        run = current_or_none()

        def one(agent: str, prompt: str) -> RunResult:
            try:
                with self.session(agent) as session:
                    for key, value in states:  # a frozen copy of the parent's state (D6)
                        from dsh.ledger.state import SET

                        key.apply(session.ledger, {SET: value})
                    if frozen:
                        session.inject(frozen, source=f"fork:{parent.id}")  # type: ignore[union-attr]
                    if run is None:
                        return session.send(prompt, limits=limits)
                    return session.send(prompt, limits=limits, parent=run, cancel=run.cancel,
                                        approve=run.approve_all)
            except Exception as exc:  # a task that cannot even start is reported, not raised
                return RunResult(output="", session_id="", outcome="error",
                                 reason=describe_error(self.pm, exc), error=exc)

        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(tasks))),
                                thread_name_prefix="dsh-parallel") as pool:
            futures = [pool.submit(contextvars.copy_context().run, one, agent, prompt)
                       for agent, prompt in tasks]
            results = [f.result() for f in futures]
        if parent is not None:
            for (agent, _), r in zip(tasks, results, strict=True):
                body = r.output if r.outcome == "completed" else f"{r.outcome}: {r.reason}"
                parent.inject(body, source=f"parallel:{agent}:{r.session_id or '-'}")
        return results
