"""dsh-llm: the models and tools of every ``llm`` plugin, usable from dsh (MISSION E4).

Installed, it is found through the ``dsh`` entry point ``llm`` and

* registers the model prefix ``llm``: ``dsh run -m llm:MODEL_ID`` runs any model the ``llm``
  CLI knows (``llm models``), through that model plugin's own code;
* turns the tools of llm tool plugins into dsh tools, for the agents that select them with
  ``[plugins.llm] tools = ["simple_eval", 'SQLite("data.db")']`` (default: none);
* adds ``dsh llm models`` and ``dsh llm tools``.

This module is imported on every dsh start-up, so it stays tiny and never imports ``llm``
(about a second of start-up): the adapter is the string ``"dsh_llm.model:LLMModel"``, and
the tool bridge is imported only for an agent whose settings name llm tools. See README.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from dsh.hookspecs import hookimpl

if TYPE_CHECKING:
    import click

    from dsh.host.scope import AgentInfo

__version__ = "0.1.0"
__all__ = ["__version__", "register_commands", "register_models", "register_tools"]


@hookimpl
def register_models(register: Callable[..., None]) -> None:
    register("llm", "dsh_llm.model:LLMModel",
             description="any model of the llm CLI and its plugins: llm:MODEL_ID "
                         "(list them: dsh llm models)",
             models="dsh_llm.listing:list_models")


@hookimpl
def register_tools(register: Callable[..., None], agent: AgentInfo) -> None:
    """The llm tools ``agent`` selects (``tools`` in ``[plugins.llm]``, overlaid by
    ``[agents.NAME.plugin_settings.llm]``). With none selected, ``llm`` is not imported."""
    specs: Any = agent.plugin_settings("llm").get("tools", [])
    if not specs:
        return
    from dsh_llm.tools import register_llm_tools

    register_llm_tools(register, specs, where=f"[plugins.llm] tools of agent {agent.name!r}")


@hookimpl
def register_commands(cli: click.Group) -> None:
    from dsh_llm.commands import llm_group

    cli.add_command(llm_group)
