"""The kernel sandbox for processes a model drives (issue 22; docs/security.md).

Public API, for dsh-shell and any third-party tool plugin that starts a program::

    from dsh import sandbox

    result = sandbox.run(argv, cwd=root, timeout=60)   # in a tool: the agent's policy,
    result.exit_code, result.stdout, result.sandbox    # recorded with the call

    policy = sandbox.policy_for(agent)          # at register_tools: the agent's policy
    proc = sandbox.Popen(argv, policy, workspace=root, stdout=subprocess.PIPE)
    record = proc.sandbox                       # what was applied: record it with the call

* :mod:`dsh.sandbox.policy` — the ``[sandbox]`` settings (:func:`parse_policy`), dsh's own
  paths (:func:`protected_paths`) and the plan of one command;
* :mod:`dsh.sandbox.runner` — :func:`run` (start, bound, kill, record: what a tool wants)
  and its :class:`Result`;
* :mod:`dsh.sandbox.spawn` — :class:`Popen`, :class:`SandboxUnavailable`, :func:`check`;
* :mod:`dsh.sandbox.environment` — :func:`allowed_env`, the environment a child gets
  without ``env`` (never a key), and :func:`~dsh.sandbox.environment.harden`;
* :mod:`dsh.sandbox.child` — what ``Popen``'s forked child runs before execve, prepared in
  the parent (Landlock ruleset, seccomp program, the system calls);
* :mod:`dsh.sandbox.exec` — the launcher (Landlock, seccomp, no capabilities, then execve),
  for :func:`~dsh.sandbox.spawn.wrap`, subinterpreters and ``launcher=True``.

May import ``dsh.config``, ``dsh.ledger`` (where dsh's data lives), ``dsh.host`` and
``dsh.core`` (it sits beside ``dsh.tools`` and ``dsh.llm``, below ``dsh.run``); this module
imports nothing until a name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from dsh.sandbox.environment import allowed_env
    from dsh.sandbox.policy import Policy
    from dsh.sandbox.policy import parse_policy
    from dsh.sandbox.runner import Result
    from dsh.sandbox.runner import run
    from dsh.sandbox.spawn import Popen
    from dsh.sandbox.spawn import SandboxUnavailable
    from dsh.sandbox.spawn import check

__all__ = ["Policy", "Popen", "Result", "SandboxUnavailable", "allowed_env", "check",
           "parse_policy", "policy_for", "run"]

_LAZY = {"Policy": "dsh.sandbox.policy", "parse_policy": "dsh.sandbox.policy",
         "Popen": "dsh.sandbox.spawn", "SandboxUnavailable": "dsh.sandbox.spawn",
         "check": "dsh.sandbox.spawn", "run": "dsh.sandbox.runner",
         "Result": "dsh.sandbox.runner", "allowed_env": "dsh.sandbox.environment"}


def policy_for(agent: Any) -> Policy:
    """The sandbox policy of ``agent`` (an :class:`dsh.AgentHandle`): ``[sandbox]`` overlaid
    by the agent's own ``sandbox`` setting, validated (a bad one is a ConfigError naming the
    agent and key). The agent's project memory file (``[plugins."dsh.memory"] file``, when
    memory is enabled) is kept read-only inside the workspace with the persistence paths."""
    from dsh.sandbox.policy import parse_policy

    raw = agent.settings.get("sandbox")
    policy = parse_policy(raw, where=f"sandbox, agent {agent.name}")
    memory = _memory_file(agent)
    if memory is None:
        return policy
    import attrs

    return attrs.evolve(policy, read_only=(*policy.read_only, memory))


def _memory_file(agent: Any) -> str | None:
    """The agent's project memory file, absolute (relative to the working directory, as
    dsh.memory reads it), or None."""
    import os

    try:
        settings = agent.plugin_settings("dsh.memory")
    except (AttributeError, TypeError):
        return None
    value = settings.get("file") if settings.get("enabled", False) else None
    if not isinstance(value, str) or not value or "\0" in value:
        return None
    return os.path.abspath(os.path.expanduser(value))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dsh.sandbox' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
