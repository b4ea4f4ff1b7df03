"""``[plugins.shell]`` settings, validated once per agent at assembly.

A bad value is a :class:`dsh.core.errors.ConfigError` naming the key, so ``dsh`` reports it before
any run starts instead of a tool failing halfway through one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import attrs

from dsh.core.errors import ConfigError

#: Read-only commands that run without asking. Nothing here writes, deletes or executes
#: other programs (``find`` is left out for ``-delete`` / ``-exec``).
DEFAULT_ALLOW: tuple[str, ...] = ("ls", "cat", "echo", "pwd", "grep", "head", "tail", "wc")
#: The values of ``shell``.
SHELL_MODES = ("auto", "never")


@attrs.frozen
class ShellSettings:
    """The settings of one agent's shell tools (``[plugins.shell]`` overlaid with
    ``[agents.NAME.plugin_settings.shell]``)."""

    #: The directory commands run in and files are confined to; ``None``: the current
    #: directory when the tool is called. ``~`` is expanded; a relative path is relative to
    #: the current directory.
    workspace: str | None = None
    #: Command names (``argv[0]``) that run without approval.
    allow: tuple[str, ...] = DEFAULT_ALLOW
    #: Seconds before a command is killed (with every process it started).
    timeout: float = 60.0
    #: Bytes of command output (stdout and stderr together) returned to the model.
    max_output: int = 64 * 1024
    #: Bytes of a file that ``read_file`` returns; a larger file is cut and said to be.
    max_read: int = 256 * 1024
    #: Environment variables passed to commands besides the base allowlist
    #: (:data:`dsh_shell.process.BASE_ENV`: ``PATH``, ``HOME``, the locale, …), by name or
    #: by pattern (``GIT_*``). Nothing else of dsh's environment reaches a command.
    env_keep: tuple[str, ...] = ()
    #: Where approval is asked. Only tests and unusual setups change it.
    tty: str = "/dev/tty"
    #: ``auto``: a command line with shell syntax (pipes, ``&&``, redirection) runs with
    #: ``bash -c`` when the kernel sandbox confines it; ``never``: commands never get a
    #: shell (shell operators are refused, as without the sandbox).
    shell: str = "auto"
    #: Background jobs (``run_command(background=true)``) that may run at once, per run.
    max_jobs: int = 4

    def workspace_path(self) -> str:
        """The workspace's real path, resolved now (the default follows the current
        directory, so it is resolved per call, not at assembly)."""
        raw = os.path.expanduser(self.workspace) if self.workspace else os.getcwd()
        return os.path.realpath(raw)


_FIELDS = tuple(f.name for f in attrs.fields(ShellSettings))


def parse_settings(raw: Mapping[str, Any], where: str = "plugins.shell") -> ShellSettings:
    """Validate ``raw`` into :class:`ShellSettings`; raise ConfigError naming the key."""
    for key in raw:
        if key not in _FIELDS:
            import difflib  # only on an error: it costs a millisecond at start-up

            near = difflib.get_close_matches(key, _FIELDS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(_FIELDS)}"
            raise ConfigError(f"[{where}]: unknown key {key!r}{hint}")
    values: dict[str, Any] = {}
    if "workspace" in raw:
        values["workspace"] = _string(raw["workspace"], where, "workspace")
    if "tty" in raw:
        values["tty"] = _string(raw["tty"], where, "tty")
    if "shell" in raw:
        if raw["shell"] not in SHELL_MODES:
            raise ConfigError(f"[{where}] shell: expected one of "
                              f"{', '.join(map(repr, SHELL_MODES))}, got {raw['shell']!r}")
        values["shell"] = raw["shell"]
    if "allow" in raw:
        allow = raw["allow"]
        if isinstance(allow, str) or not isinstance(allow, list | tuple) or not all(
            isinstance(a, str) and a and "/" not in a for a in allow
        ):
            raise ConfigError(
                f"[{where}] allow: expected a list of command names such as [\"ls\", \"git\"] "
                f"(names, not paths), got {allow!r}"
            )
        values["allow"] = tuple(allow)
    if "env_keep" in raw:
        keep = raw["env_keep"]
        if isinstance(keep, str) or not isinstance(keep, list | tuple) or not all(
            isinstance(k, str) and k for k in keep
        ):
            raise ConfigError(f"[{where}] env_keep: expected a list of environment variable "
                              f"names, got {keep!r}")
        values["env_keep"] = tuple(keep)
    if "timeout" in raw:
        values["timeout"] = _positive(raw["timeout"], where, "timeout", integer=False)
    for key in ("max_output", "max_read", "max_jobs"):
        if key in raw:
            values[key] = int(_positive(raw[key], where, key, integer=True))
    return ShellSettings(**values)


def _string(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"[{where}] {key}: expected a non-empty string, got {value!r}")
    return value


def _positive(value: Any, where: str, key: str, *, integer: bool) -> float:
    # bool is an int subclass; `timeout = true` is a typo, not one second.
    number = isinstance(value, int if integer else int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:  # NaN passes `<= 0`
        kind = "a positive integer" if integer else "a positive number"
        raise ConfigError(f"[{where}] {key}: expected {kind}, got {value!r}")
    return float(value)
