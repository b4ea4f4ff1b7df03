"""Prompt commands (issue 24): a prompt that starts with ``/NAME ARGS…`` is expanded by a
plugin's ``expand_command`` hook into the prompt that is sent — and recorded as the user
message, so the ledger holds what the model saw (C3) — and plugin-provided agents
(``register_agents``) are merged under the config's own ``[agents.NAME]``.

:func:`split_command` says whether a prompt is a command at all: ``/NAME`` where ``NAME`` is
letters, digits, ``_ - . :`` (a namespaced ``ns:name`` too) and no other ``/`` (so
``/etc/passwd what is this?`` stays text); ``//text`` sends ``/text``. :func:`expand` asks the
agent's plugins; an unknown name is a :class:`~dsh.core.errors.UsageError` naming the known
ones, so a typo is never sent to the model as text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import PluginError
from dsh.core.errors import UsageError
from dsh.run import plugin_agents

if TYPE_CHECKING:
    pass

#: A command's name, what follows the ``/`` up to the first blank: the rule of agents' names.
NAME = plugin_agents.NAME


@attrs.frozen(kw_only=True)
class CommandExpansion:
    """What ``expand_command`` returns for a command it knows.

    ``prompt`` is sent (and recorded) as the user message; ``model`` and ``tools`` (an allow
    list), when set, apply to the run the command starts (``dsh run``); ``source`` says where
    the command came from (a file), for messages."""

    prompt: str
    model: str | None = None
    tools: tuple[str, ...] | None = None
    source: str = ""


def split_command(text: str) -> tuple[str, str] | None:
    """``(name, arguments)`` when ``text`` starts with a command, else None. Leading blanks
    do not make a command; ``//…`` is an escaped ``/…`` (see :func:`unescape`)."""
    if not text.startswith("/") or text.startswith("//"):
        return None
    head, _, rest = text[1:].partition("\n")
    word, sep, args = head.partition(" ")
    word, tab, targs = word.partition("\t")
    if not NAME.fullmatch(word):
        return None  # "/etc/passwd …", "/ …": text, not a command
    arguments = (targs + sep + args) if tab else args
    if rest:
        arguments = f"{arguments}\n{rest}" if arguments else rest
    return word, arguments.strip()


def unescape(text: str) -> str:
    """``//text`` → ``/text`` (how a prompt starting with ``/NAME`` is sent as text)."""
    return text[1:] if text.startswith("//") else text


def known_commands(pm: Any, agent: Any) -> dict[str, str]:
    """``{name: description}`` of the commands the agent's plugins list (``list_commands``
    is optional: a plugin without it still expands its commands)."""
    out: dict[str, str] = {}
    for listed in pm.hook.list_commands(agent=agent):
        for name, description in (listed or {}).items():
            out.setdefault(str(name), str(description))
    return out


def expand(pm: Any, agent: Any, name: str, arguments: str) -> CommandExpansion:
    """The expansion of ``/name arguments`` by the agent's plugins (``pm``, ``agent`` its
    :class:`dsh.AgentHandle`); an unknown command is a :class:`UsageError`."""
    found = pm.hook.expand_command(name=name, arguments=arguments, agent=agent)
    if found is None:
        from dsh.core.errors import unknown_name

        known = known_commands(pm, agent)
        raise UsageError(unknown_name("command", "/" + name, ["/" + k for k in known], "known")
                         + " (send text starting with / as //…)")
    if isinstance(found, str):
        return CommandExpansion(prompt=found)
    if not isinstance(found, CommandExpansion):
        raise PluginError(f"expand_command returned {type(found).__name__} for /{name}, "
                          "not a str or CommandExpansion", hook="expand_command")
    return found
