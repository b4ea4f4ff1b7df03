"""Per-agent scope (MISSION A6) and the agent handle (issue 11), as a built-in plugin.

Each agent gets its own pluggy ``PluginManager`` holding the built-ins plus the plugins enabled
for it, so a tool, prompt fragment or hook of a plugin enabled for agent A never reaches agent B.
Which plugins an agent gets is itself a hook (``agent_plugins``) so the policy can be replaced.

Every hook that runs for an agent reaches the same :class:`AgentHandle`: ``register_tools``,
``register_prompt`` and ``agent_plugins`` receive it as ``agent``; the objects the other hooks
receive carry it as ``.handle`` (``step.handle``, ``call.handle``, ``turn.handle``,
``request.handle``, ``dsh.context().handle``). It is one object per assembled agent of one
:class:`dsh.App`, so two apps in one process never share a plugin's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import NoRunContext
from dsh.core.messages import freeze
from dsh.hookspecs import hookimpl
from dsh.host.stash import Stash

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext


class NotInRun(NoRunContext, RuntimeError):
    """A run-scoped part of an :class:`AgentHandle` (``session_stash``, ``run_stash``,
    ``record_event``) was used outside a run of its agent."""


@attrs.frozen
class AgentHandle:
    """The agent a hook runs for: its name, model, settings and the plugin's stashes.

    Equality compares the configuration (``name``, ``model``, ``settings``, ``plugins``); the
    stashes are never compared or hashed.
    """

    #: The agent's name (``[agents.NAME]``).
    name: str
    #: The agent's model id as configured (``openai:gpt-4o``, an alias, ``echo``).
    model: str
    #: The agent's config table (``[agents.NAME]``, every key with its default filled in);
    #: read-only, nested values too.
    settings: Mapping[str, Any] = attrs.field(factory=dict, hash=False, converter=freeze)
    #: The plugins the agent enables (its ``plugins`` list), or None for every installed one.
    plugins: tuple[str, ...] | None = None
    #: ``[plugins.NAME]`` tables of the config, for :meth:`plugin_settings`; read-only (a
    #: frozen copy: two apps made from one config never see each other's changes).
    all_plugin_settings: Mapping[str, Mapping[str, Any]] = attrs.field(
        factory=dict, hash=False, repr=False, converter=freeze
    )
    #: Agent scope: lives as long as the app; shared by every run and session of this agent
    #: in this :class:`dsh.App` (also by its variants with overrides, ``app.agent(NAME,
    #: model=…)``), never with another app's agent of the same name.
    stash: Stash = attrs.field(factory=Stash, eq=False, hash=False, repr=False)
    #: App scope: ``App.stash``, shared by every agent of the app.
    app_stash: Stash = attrs.field(factory=Stash, eq=False, hash=False, repr=False)

    def plugin_settings(self, name: str) -> Mapping[str, Any]:
        """The ``[plugins.NAME]`` table of the config, overlaid key by key with the agent's
        own ``[agents.AGENT.plugin_settings.NAME]`` (empty if neither exists): a new dict
        each call, its nested tables and lists read-only."""
        base = dict(self.all_plugin_settings.get(name, {}))
        own = self.settings.get("plugin_settings", {}).get(name, {})
        base.update(own)
        return base

    @property
    def session_stash(self) -> Stash:
        """Session scope: ``Session.stash`` of the session this agent is running in (in
        memory, one per open :class:`dsh.run.session.Session`; use plugin events for state that
        must survive a restart). Raises :class:`NotInRun` outside a run of this agent."""
        session = self._run("session_stash").session
        if session is None:
            raise NotInRun(f"agent {self.name!r}: this run has no Session, so no session_stash")
        stash: Stash = session.stash
        return stash

    @property
    def run_stash(self) -> Stash:
        """Run scope: ``RunContext.stash`` of the current run of this agent (one ``send``, one
        turn). Raises :class:`NotInRun` outside a run of this agent."""
        return self._run("run_stash").stash

    def record_event(self, plugin: str, name: str, data: Mapping[str, Any] | None = None, *,
                     version: int = 1) -> Any:
        """Append the plugin's own persistent event ``x/PLUGIN/NAME`` to the current run's
        session: :func:`dsh.ledger.plugin_events.record_event`. ``PLUGIN`` is the calling
        plugin's own name (registered or distribution): the handle is shared by every plugin
        of the agent, and one plugin's hook or tool naming another plugin is refused with a
        :class:`~dsh.ledger.plugin_events.PluginEventError` naming both."""
        from dsh.ledger import plugin_events  # only plugins that write events import it

        return plugin_events.record_event(plugin, name, data, version=version)

    def plugin_events(self, plugin: str, name: str | None = None) -> Any:
        """The plugin's events of the current run's session, oldest first (also those written
        before a restart): :func:`dsh.ledger.plugin_events.plugin_events`."""
        from dsh.ledger import plugin_events

        return plugin_events.plugin_events(plugin, name)

    def _run(self, what: str) -> RunContext:
        """The innermost run of this agent in the current context (a sub-agent's run nested
        in it is skipped: its hooks have their own handle)."""
        from dsh.host.runcontext import current_or_none

        ctx = current_or_none()
        run = ctx
        while run is not None and run._handle is not self:
            run = run.parent
        if run is None:
            where = ("outside any run" if ctx is None
                     else f"in a run of another agent or App (agent {ctx.agent_name!r})")
            raise NotInRun(
                f"agent {self.name!r}: {what} is only available during a run of this agent, "
                f"and was used {where}; keep app- or agent-wide state in app_stash or stash "
                "(a thread you start must run in contextvars.copy_context().run(...))")
        return run


#: The name used before issue 11 (``register_tools(register, agent: AgentInfo)``); the same
#: class.
AgentInfo = AgentHandle


@hookimpl(trylast=True)
def agent_plugins(agent: AgentHandle, installed: list[str]) -> list[str]:
    if agent.plugins is None:
        return list(installed)
    return [name for name in agent.plugins]
