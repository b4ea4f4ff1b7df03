"""Agents that plugins provide (the ``register_agents`` hook, issue 24), merged under the
config's own ``[agents.NAME]``. A module of its own, importing nothing at import: an installed
plugin that implements the hook (dsh-claude) makes every start-up reach it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from dsh.config.loader import AgentConfig
    from dsh.config.loader import Config

#: An agent's name: letters, digits, ``_ - . :`` (as a command's name, dsh.run.commands.NAME).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")


def merge_agents(config: Config, pm: Any, app: Any) -> tuple[Config, list[str]]:
    """``config`` with the agents plugins register (``register_agents``) added under its own
    ``[agents.NAME]``: the config wins a collision, which is reported in the returned notes
    (one line each). Each registered agent is validated as an ``[agents.NAME]`` table."""
    import attrs

    from dsh.config.loader import config_from_dict
    from dsh.core.errors import ConfigError
    from dsh.host.manager import call_impl

    found: dict[str, tuple[AgentConfig, str]] = {}
    notes: list[str] = []
    for impl in pm.hook.register_agents.get_hookimpls():
        plugin = impl.plugin_name

        def register(name: str, settings: Mapping[str, Any], *, source: str = "",
                     _plugin: str = plugin) -> None:
            where = source or f"plugin {_plugin}"
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise ConfigError(f"{where}: agent name {name!r} is not a valid name "
                                  "(letters, digits, _ - . :)")
            if name in found:
                notes.append(f"agent {name!r} from {where} ignored: already defined by "
                             f"{found[name][1]}")
                return
            cfg = config_from_dict({"agents": {name: dict(settings)}}, source=where)
            found[name] = (cfg.agents[name], where)

        call_impl(impl, "register_agents", register=register, app=app)
    if not found:
        return config, notes
    agents = dict(config.agents)
    for name, (acfg, where) in found.items():
        if name in agents:
            notes.append(f"agent {name!r} from {where} ignored: [agents.{name}] of "
                         f"{config.source or 'the config'} wins")
            continue
        agents[name] = acfg
        sources = getattr(app, "agent_sources", None)
        if isinstance(sources, dict):
            sources[name] = where  # errors about this agent name its file
    return attrs.evolve(config, agents=agents), notes
