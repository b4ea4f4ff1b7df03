"""An assembled agent (MISSION D1): its scope, tools, prompt, options and model.

:class:`Agent` is what ``App.agent(name)`` builds, once: the agent's own plugin manager (the
app-wide one when it uses every installed plugin; scope, A6), its tool table (with the
``ask_CHILD`` tools of its sub-agents, :mod:`dsh.run.subagent`) checked against its allow
list, its system prompt, limits and the layers of its model options; the adapter itself is
built on first use. Here too: :func:`configure` (the historic ``configure`` hook, a raising
plugin named) and :func:`check_tool_names`. Running it is :mod:`dsh.run.session`'s.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.config.loader import options_error
from dsh.core.errors import ConfigError
from dsh.core.errors import DshError
from dsh.core.errors import PluginError
from dsh.core.errors import UsageError
from dsh.core.messages import ToolSpec
from dsh.host.manager import make_plugin_manager
from dsh.host.manager import plugin_of
from dsh.host.runcontext import Limits
from dsh.host.scope import AgentHandle
from dsh.llm import record
from dsh.llm.base import Model
from dsh.run.prompt import collect_prompt
from dsh.run.subagent import INHERIT
from dsh.run.subagent import check_subagent
from dsh.run.subagent import subagent_tool
from dsh.tools.registry import ToolDef
from dsh.tools.registry import collect_tools

if TYPE_CHECKING:
    from dsh.run.app import App

#: Serialises the lazy, first-use construction of agents and adapters (re-entrant: building
#: an agent may build another's pieces).
_BUILD_LOCK = threading.RLock()
#: App-wide plugin managers already used as an agent's own (at most one agent each: A6).
_adopted: weakref.WeakSet[Any] = weakref.WeakSet()


class Agent:
    """An assembled agent: its own plugin manager (scope), tools, prompt and model."""

    def __init__(self, app: App, name: str, *, model: str | None = None,
                 system: str | None = None, tools: list[str] | None = None,
                 max_steps: int | None = None, options: Mapping[str, Any] | None = None,
                 compaction: str | None = None, mode: str | None = None) -> None:
        cfg = app.config
        acfg = cfg.agent_config(name)
        self.app = app
        self.name = name
        own = None if acfg.model == INHERIT else acfg.model  # inherit: the parent's, if any
        self.model_id = model or own or app.default_model.id
        self.max_steps = max_steps if max_steps is not None else (
            acfg.max_steps if acfg.max_steps is not None else cfg.max_steps)
        #: The permission mode of its runs: ``mode=`` (``--mode``), else ``[agents.NAME]
        #: mode``, else ``ask`` (a sub-agent's run takes the narrower of it and its parent's).
        from dsh.host.runcontext import check_mode

        if mode:
            self.mode = check_mode(mode, "--mode")
        elif acfg.mode:
            self.mode = check_mode(acfg.mode, f"{cfg.source or 'config'}: [agents.{name}] mode")
        else:
            self.mode = "ask"
        if options:
            problem = options_error(options, "options")
            if problem is not None:
                raise UsageError(f"agent {name!r}: {problem}")
        # Options, lowest first: the adapter's defaults, [models.ID] options, [agents.X]
        # options, -o / options=. All of them are recorded on turn/start (C3); none may set a
        # protocol key. Merged once the adapter is known (see `options`).
        where = cfg.source or "config"
        model_options = cfg.models.get(self.model_id, {}).get("options") or {}
        if not isinstance(model_options, Mapping):
            raise ConfigError(f"{where}: [models.{self.model_id!r}] options must be a table")
        self._option_layers: list[tuple[str, Mapping[str, Any]]] = [
            (f"{where}: [models.{json.dumps(self.model_id)}] options", model_options),
            (f"{where}: [agents.{name}] options", acfg.options),
            ("-o / options= override", options or {}),
        ]
        for source, layer in self._option_layers:
            record.check_option_keys(layer, source)
        self._options: Mapping[str, Any] | None = None
        #: Context compaction (dsh.compaction): strategy, trigger fraction, window, summariser.
        self.compaction: str = compaction or acfg.compaction or cfg.compaction
        self.compact_at: float = acfg.compact_at or cfg.compact_at
        self.context_window: int | None = acfg.context_window or cfg.context_window
        self.summary_model: str | None = acfg.summary_model or cfg.summary_model
        #: What hooks reach as ``agent`` / ``.handle`` (issue 11); ``info`` is its old name.
        from dsh.sandbox.policy import merged_settings
        from dsh.sandbox.policy import parse_policy

        sandbox = merged_settings(cfg.sandbox, acfg.sandbox)
        try:  # a bad policy fails assembly, naming the file, the agent and the key
            parse_policy(sandbox, where=f"sandbox, agent {name}")
        except ConfigError as exc:
            raise ConfigError(f"{cfg.source}: {exc}" if cfg.source else str(exc)) from None
        self.handle = self.info = AgentHandle(
            name=name, model=self.model_id, settings={**attrs.asdict(acfg), "sandbox": sandbox},
            plugins=tuple(acfg.plugins) if acfg.plugins is not None else None,
            all_plugin_settings=cfg.plugins, stash=app.agent_stash(name), app_stash=app.stash,
        )
        installed = [r.name for r in app.plugins if r.obj is not None]
        chosen = app.pm.hook.agent_plugins(agent=self.info, installed=installed)
        unknown = [p for p in chosen if p not in {r.name for r in app.plugins}]
        if unknown:
            where = f" ({cfg.source})" if cfg.source else ""
            raise UsageError(
                f"agent {name!r}{where}: unknown plugin(s) {', '.join(unknown)}; installed: "
                + (", ".join(installed) or "none")
            )
        self.plugin_names = tuple(chosen)
        if list(chosen) == installed and app.pm not in _adopted:
            # Every installed plugin: the first such agent uses the app-wide manager itself;
            # any other gets its own, so a plugin registered at runtime in one agent's
            # manager never changes another agent (issue 23, MISSION A6).
            _adopted.add(app.pm)
            self.pm = app.pm
        else:
            records = [r for r in app.plugins if r.name in set(chosen)]
            self.pm = make_plugin_manager(records, cfg.disable, cfg.strict_plugins, complete=True,
                                          where=f"{cfg.source or 'config'}: agent {name!r}")
            configure(self.pm, app)
        allow = tools if tools is not None else acfg.tools
        self.tools: dict[str, ToolDef] = collect_tools(self.pm, self.info)
        for child in acfg.subagents:
            check_subagent(app, name, child)
            sub_tool = subagent_tool(app, child, parent_model=self.model_id)
            self.tools[sub_tool.name] = sub_tool
        if allow is not None:
            check_tool_names(app, name, allow, self.tools, override=tools is not None)
            self.tools = {k: v for k, v in self.tools.items() if k in allow}
        if self.mode == "plan":  # the one way out of plan mode (dsh.tools.plan)
            from dsh.tools.plan import plan_tool

            self.tools["propose_plan"] = plan_tool()
        self.limits: Limits = cfg.limits.merged(acfg.limits)
        self.tool_specs: tuple[ToolSpec, ...] = tuple(t.spec for t in self.tools.values())
        self.system, self.prompt_parts = collect_prompt(
            self.pm, self.info, system if system is not None else acfg.system)
        self._model: Model | None = None

    @property
    def model(self) -> Model:
        """The adapter, built on first use (so assembling never imports provider code) — once,
        also when parallel runs of the agent (sub-agents) start at the same moment: a run is
        bound to the adapter it recorded (C3), so every run must see the same one."""
        model = self._model
        if model is None:
            with _BUILD_LOCK:
                if self._model is None:
                    self._model = self.app.build_model(self.model_id)
                model = self._model
        return model

    @property
    def options(self) -> Mapping[str, Any]:
        """The effective model options (read-only): adapter defaults, then ``[models.ID]``,
        ``[agents.NAME]`` and override options. Exactly these are recorded and sent."""
        if self._options is None:
            self._options = record.merge_options(self.model, self._option_layers)
        return self._options

    @options.setter
    def options(self, value: Mapping[str, Any]) -> None:
        # A plugin may replace them: they are checked, frozen and recorded on the next turn.
        self._option_layers = [("agent.options (set by a plugin)", dict(value))]
        self._options = record.merge_options(self.model, self._option_layers)

    @property
    def effective_model(self) -> str:
        """The model id recorded on ``turn/start``: the adapter's effective id, if it has
        one (an alias resolved), else the configured id."""
        return self.model.effective_id or self.model_id

    @property
    def price(self) -> tuple[float | None, ...] | None:
        """``(input, output, cache_read, cache_write)`` price per million tokens from
        ``[models.ID] price`` (:func:`dsh.run.budget.model_price`; a cache price not given is
        None: a default multiple of the input price applies)."""
        from dsh.run.budget import model_price

        return model_price(self.model_id, self.app.config.models.get(self.model_id))

    @property
    def observed(self) -> bool:
        """True when some plugin of this agent implements ``observe_event``."""
        return bool(self.pm.hook.observe_event.get_hookimpls())


def configure(pm: Any, app: App) -> None:
    """Call the historic ``configure`` hook; a plugin raising is named with the hook."""
    try:
        pm.hook.configure.call_historic(kwargs={"app": app, "pm": pm})
    except DshError:
        raise
    except Exception as exc:
        found = plugin_of(pm, exc)
        who = f"plugin {found[0]}" if found else "a plugin"
        raise PluginError(f"{who} raised in hook configure: {type(exc).__name__}: {exc}",
                          plugin=found[0] if found else "", hook="configure") from exc
    if pm.hook.declare_settings.get_hookimpls():  # declared settings: validated here
        from dsh.config.declared import check_app

        check_app(app, pm)


def check_tool_names(app: App, agent: str, allow: list[str], available: Mapping[str, Any],
                     override: bool) -> None:
    """Every name of a tool allow list names a tool: a typo would silently leave the agent
    without it. Unchecked while a plugin of the agent failed to load (its tools are unknown;
    that failure is reported on its own)."""
    acfg = app.config.agent_config(agent)
    if any(r.error and (acfg.plugins is None or r.name in acfg.plugins) for r in app.plugins):
        return
    for tool_name in allow:
        if tool_name not in available:
            from dsh.config.loader import unknown_name

            message = unknown_name("tool", tool_name, available, "available")
            if override:
                raise UsageError(f"agent {agent!r}: tools: {message}")
            from dsh.core.errors import ConfigError

            where = app.agent_sources.get(agent) or app.config.source or "config"
            raise ConfigError(f"{where}: key 'agents.{agent}.tools': {message}")
