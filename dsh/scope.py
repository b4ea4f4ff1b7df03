"""Per-agent scope (MISSION A6) as a built-in plugin.

Each agent gets its own pluggy ``PluginManager`` holding the built-ins plus the plugins enabled
for it, so a tool, prompt fragment or hook of a plugin enabled for agent A never reaches agent B.
Which plugins an agent gets is itself a hook (``agent_plugins``) so the policy can be replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from dsh.hookspecs import hookimpl


@attrs.frozen
class AgentInfo:
    """What hooks are told about the agent being assembled or run."""

    name: str
    model: str
    settings: Mapping[str, Any] = attrs.field(factory=dict, hash=False)
    plugins: tuple[str, ...] | None = None
    #: ``[plugins.NAME]`` tables of the config, for :meth:`plugin_settings`.
    all_plugin_settings: Mapping[str, Mapping[str, Any]] = attrs.field(
        factory=dict, hash=False, repr=False
    )

    def plugin_settings(self, name: str) -> Mapping[str, Any]:
        """The ``[plugins.NAME]`` table of the config, overlaid with the agent's own
        ``[agents.AGENT.plugin_settings.NAME]`` (empty if neither exists)."""
        base = dict(self.all_plugin_settings.get(name, {}))
        own = self.settings.get("plugin_settings", {}).get(name, {})
        base.update(own)
        return base


@hookimpl(trylast=True)
def agent_plugins(agent: AgentInfo, installed: list[str]) -> list[str]:
    if agent.plugins is None:
        return list(installed)
    return [name for name in agent.plugins]
