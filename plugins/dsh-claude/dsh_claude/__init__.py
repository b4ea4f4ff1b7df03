"""dsh-claude: a team's ``AGENTS.md``, ``CLAUDE.md`` and Agent Skills (``.claude/skills``)
work unchanged under dsh, recorded like everything else (docs/claude.md).

Installed, it is found through the ``dsh`` entry point ``claude`` and reaches the agents
that enable it (``plugins = ["claude"]``, or every agent that lists no plugins). Its
settings come from ``[plugins.claude]``, overlaid with
``[agents.NAME.plugin_settings.claude]`` (docs/config.md). This module is only the hook
implementations: the readers (:mod:`dsh_claude.frontmatter`, PyYAML) are imported when an
agent that enables the plugin runs a turn in a folder that has such files.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]

# i24b: custom commands, sub-agent files, plugin folders (light modules: their readers are
# imported inside the hooks).
from dsh_claude.agents import register_agents as register_agents  # noqa: E402
from dsh_claude.cli import register_commands as register_commands  # noqa: E402
from dsh_claude.commands import expand_command as expand_command  # noqa: E402
from dsh_claude.commands import list_commands as list_commands  # noqa: E402
