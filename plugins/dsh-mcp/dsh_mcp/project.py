"""MCP servers a project defines: its ``.mcp.json`` files and plugin folders (docs/mcp.md,
"Project servers").

A file that lies in the project (the folder dsh runs in) may have been written by a confined
command, a model or a ``git pull``; it is input, not configuration. So it is

* **read through** :mod:`dsh.core.beneath` relative to the project root: no symbolic link is
  followed, nothing outside the root or among dsh's protected paths is read;
* **used only when trusted**: :func:`dsh.config.trust.gate` with the bytes just read and a
  summary of what it would launch; an untrusted or changed file is inert (one stderr line);
* **confined**: its stdio servers run under the kernel sandbox (``[plugins.mcp] sandbox``,
  ``workspace-write`` when unset) with the project root as their workspace; a ``cwd`` that
  leaves the root is a configuration error naming the server and key (so is a file that
  cannot be read the safe way: a symbolic link, a FIFO);
* **refused dsh's secrets**: ``${VAR}`` never expands a credential (``*_API_KEY``,
  ``*_TOKEN``, ``*_SECRET``, ``*PASSWORD*``…), a key of dsh's key store or a loader variable
  (``LD_PRELOAD``, ``PYTHONPATH``, ``DSH_*``…), and its servers may not set a loader variable.

Whatever file a server comes from, a secret never travels on its command line (``command``,
``args``): other processes can read ``/proc/PID/cmdline``; ``env`` is the place for it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any

import attrs

from dsh.core.errors import ConfigError

#: Variables that change how a program is loaded or what an interpreter runs first. A
#: project file may neither expand them (they are dsh's own environment) nor set them for a
#: server (the sandbox launcher runs before the server is confined).
LOADER_NAMES = frozenset({
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "ZDOTDIR", "IFS",
    "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS", "NODE_PATH",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "GCONV_PATH", "LOCPATH",
    "HOSTALIASES",
})
LOADER_PREFIXES = ("LD_", "DYLD_", "PYTHON", "DSH_", "BASH_FUNC_", "MALLOC_", "GLIBC_")
#: What kind a trust record of a project ``.mcp.json`` has.
KIND = "mcp"
PLUGIN_KIND = "plugin"



def loader_variable(name: str) -> bool:
    """Whether ``name`` is a loader variable (:data:`LOADER_NAMES`, :data:`LOADER_PREFIXES`)."""
    return name in LOADER_NAMES or name.startswith(LOADER_PREFIXES)


def secret_name(name: str) -> bool:
    """Whether the variable ``name`` holds a credential: ``*_API_KEY``, ``*_TOKEN``,
    ``*_SECRET``, ``*PASSWORD*``, and what :func:`dsh.core.redact.credential_name` says
    (``AWS_SECRET_ACCESS_KEY``, ``*_AUTH_*``…; not ``API_KEY_FILE``)."""
    from dsh.core.redact import credential_name

    upper = name.upper()
    return (upper.endswith(("_API_KEY", "_TOKEN", "_SECRET")) or "PASSWORD" in upper
            or upper in ("API_KEY", "TOKEN", "SECRET") or credential_name(name))


@attrs.define
class Expansion:
    """How ``${VAR}`` is expanded in one ``mcpServers`` file: ``project`` when the file lies
    in the project. Knows dsh's secrets (computed on first need)."""

    project: bool = False
    _known: frozenset[str] | None = None

    def known(self) -> frozenset[str]:
        """The values of dsh's secrets: the credential variables of this environment and the
        keys of dsh's key store."""
        if self._known is None:
            from dsh.core.redact import is_secret

            found = {v for k, v in os.environ.items() if secret_name(k) and is_secret(v)}
            found |= _stored_keys()
            self._known = frozenset(found)
        return self._known

    def refusal(self, var: str, value: str, key: str) -> str | None:
        """Why ``${var}`` (which is ``value``) may not be expanded at ``key`` (``args[1]``,
        ``env.X``…), or ``None``."""
        from dsh.core.redact import is_secret

        argv = key.split(".", 1)[0].split("[", 1)[0] in ("command", "args")
        if self.project and loader_variable(var):
            return (f"{var} is a loader variable; a project file never expands dsh's loader "
                    "variables")
        named = secret_name(var)
        if self.project and named:
            return (f"{var} names a credential; a project file never expands dsh's secrets "
                    "(define the server in your own config, [plugins.mcp.servers], to give "
                    "it one in 'env')")
        held = ((self.project or argv) and bool(value) and is_secret(value)
                and any(k in value for k in self.known()))
        if self.project and held:
            return (f"{var} holds one of dsh's secrets; a project file never expands them "
                    "(define the server in your own config, [plugins.mcp.servers], to give "
                    "it one in 'env')")
        if argv and ((named and bool(value)) or held):
            return (f"{var} is a secret, and a secret never travels on a command line (other "
                    "processes can read it); pass it in 'env'")
        return None


def _stored_keys() -> set[str]:
    """The values of dsh's key store (each registered as a secret by the store); none when
    it cannot be read (the names of the variables still count)."""
    try:
        from dsh.config.keys import store

        st = store()
        return {v for v in (st.get(n) for n in st.names()) if v}
    except Exception:  # noqa: BLE001 - an unreadable store holds nothing this check can use
        return set()


@attrs.frozen
class Project:
    """The project: the folder dsh runs in (``root``, absolute), and the sandbox of the
    servers its files define (``policy``: a :class:`dsh.sandbox.Policy`, ``None`` when the
    person set ``sandbox = "off"``)."""

    root: str
    policy: Any = None

    @property
    def real(self) -> str:
        return os.path.realpath(self.root)

    def rel_of(self, path: str | os.PathLike[str]) -> str | None:
        """``path`` relative to the root when it lies in the project (by its name, or by its
        folder's real path), else ``None``: a file of the person's own elsewhere."""
        from dsh.core.beneath import within

        full = os.path.abspath(path)
        real = os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))
        for cand, base in ((full, os.path.abspath(self.root)), (real, self.real)):
            if within(cand, base):
                return os.path.relpath(cand, base)
        return None

    def shown(self, rel: str) -> str:
        return os.path.normpath(os.path.join(self.real, rel))

    def read(self, rel: str, cap: int) -> bytes | None:
        """The bytes of ``rel``, read beneath the root; ``None`` when there is no such file;
        a :class:`ConfigError` naming it when it cannot be read the safe way (a symbolic link
        on the way, a FIFO, one of dsh's protected paths…): nothing of it is used."""
        from dsh.core import beneath
        from dsh.core import files

        try:
            return beneath.read(self.root, rel, cap)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except beneath.Refused as exc:
            why = exc.why
        except files.NotRegular as exc:
            why = f"it is {exc.kind}, not a regular file"
        except files.TooLarge:
            why = f"larger than {cap} bytes"
        except OSError as exc:
            why = files.reason(exc)
        raise ConfigError(f"{self.shown(rel)}: cannot read: {why}")

    def trusted(self, rel: str, data: bytes, kind: str, summary: str) -> bool:
        """:func:`dsh.config.trust.gate` (which asks once per process for the same bytes)."""
        from dsh.config import trust

        return trust.gate(self.root, rel, data, kind, summary)

    def folder(self, rel: str, where: str) -> str:
        """The real path of the folder ``rel`` in the project, checked beneath the root (no
        symbolic link on the way); else a :class:`ConfigError` naming ``where``."""
        from dsh.core import beneath

        try:
            fd = beneath.open_dir(self.root, rel)
        except beneath.Refused as exc:
            raise ConfigError(f"{where}: {self.shown(rel)} is not used: {exc.why}") from None
        except (FileNotFoundError, NotADirectoryError):
            raise ConfigError(f"{where}: {self.shown(rel)} is not a folder") from None
        os.close(fd)
        return self.shown(rel)

    def confine(self, server: Any) -> Any:
        """``server`` (from a project file) with its sandbox and workspace set, its ``cwd``
        checked and made absolute, its ``env`` free of loader variables."""
        where = server.source
        for key in server.env:
            if loader_variable(key):
                raise ConfigError(f"{where}: env.{key}: a project's server may not set the "
                                  f"loader variable {key}")
        return attrs.evolve(server, cwd=self.cwd(server.cwd, where), workspace=self.real,
                            sandbox=self.policy if server.transport == "stdio" else None)

    def cwd(self, cwd: str | None, where: str) -> str | None:
        """The absolute ``cwd`` of a project's server: inside the root (relative paths are
        relative to it), reached without a symbolic link; else a :class:`ConfigError` naming
        ``where`` and the key."""
        if cwd is None:
            return None
        from dsh.core import beneath

        shown = repr(cwd)
        if "\0" in cwd or ".." in cwd.split("/"):
            raise ConfigError(f"{where}: 'cwd' {shown} leaves the project {self.real} "
                              "(through '..'); a project's server runs inside the project")
        if os.path.isabs(cwd):
            rel = None
            for base in (os.path.abspath(self.root), self.real):
                if beneath.within(os.path.normpath(cwd), base):
                    rel = os.path.relpath(os.path.normpath(cwd), base)
                    break
            if rel is None:
                raise ConfigError(f"{where}: 'cwd' {shown} is outside the project "
                                  f"{self.real}; a project's server runs inside the project")
        else:
            rel = os.path.normpath(cwd)
        try:
            fd = beneath.open_dir(self.root, rel)
        except beneath.Refused as exc:
            raise ConfigError(f"{where}: 'cwd' {shown} is refused: {exc.why}; a project's "
                              "server runs inside the project") from None
        except FileNotFoundError:
            raise ConfigError(f"{where}: 'cwd' {shown} does not exist in the project "
                              f"{self.real}") from None
        except NotADirectoryError:
            raise ConfigError(f"{where}: 'cwd' {shown} is not a folder") from None
        except OSError as exc:
            from dsh.core.files import reason

            raise ConfigError(f"{where}: 'cwd' {shown}: {reason(exc)}") from None
        os.close(fd)
        return self.shown(rel)


def project_of(raw: Any, where: str, base_dir: Any) -> Project:
    """The project of these settings: the folder ``base_dir`` (default: the current
    directory); its servers' sandbox is ``[plugins.mcp] sandbox``, ``workspace-write`` when
    unset."""
    from dsh.sandbox.policy import parse_policy

    root = os.path.abspath(base_dir if base_dir is not None else os.getcwd())
    chosen = raw.get("sandbox")
    policy = parse_policy(chosen if chosen is not None else "workspace-write",
                          where=f"{where}: sandbox")
    return Project(root=root, policy=policy if policy.confined else None)


def summary(data: bytes, project: Project, bare: bool = False) -> str:
    """What an ``mcpServers`` file would launch, for the trust question: each server and
    its command line as written (``${VAR}`` unexpanded), its ``cwd`` and the names of its
    ``env`` keys (never their values), or its URL and header names."""
    import json

    try:
        obj = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return "(not valid JSON: nothing can run from it)"
    entries = obj.get("mcpServers") if isinstance(obj, dict) else None
    if not isinstance(entries, dict):
        entries = obj if bare and isinstance(obj, dict) else {}
    return summarize(entries, project)


def summarize(entries: dict[str, Any], project: Project) -> str:
    """:func:`summary` of an ``mcpServers`` object."""
    lines = []
    confined = (project.policy.describe() if project.policy is not None
                else "off (unconfined)")
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            continue
        if entry.get("disabled") is True:
            lines.append(f"{name}: disabled")
            continue
        if "command" in entry:
            given = entry.get("args")
            args: list[Any] = given if isinstance(given, list) else []
            line = f"{name}: runs {shlex.join([str(entry['command']), *map(str, args)])}"
            if entry.get("cwd") is not None:
                line += f" in {entry['cwd']}"
            if isinstance(entry.get("env"), dict) and entry["env"]:
                line += f" (env: {', '.join(map(str, entry['env']))})"
            line += f"; sandbox {confined}"
        elif "url" in entry:
            from dsh.core.redact import redact_url

            line = f"{name}: connects to {redact_url(str(entry['url']))}"
            if isinstance(entry.get("headers"), dict) and entry["headers"]:
                line += f" (headers: {', '.join(map(str, entry['headers']))})"
        else:
            line = f"{name}: (neither command nor url)"
        lines.append(line)
    return "\n".join(lines) or "(no servers)"


def load_gated(project: Project, rel: str, kind: str,
               summarize: Callable[[bytes], str]) -> Any:
    """The parsed JSON of the project file ``rel`` when it may be used: read beneath the
    root, trusted by its bytes. ``None`` when it is missing or not trusted (inert); a
    :class:`ConfigError` naming it when it cannot be read the safe way, or when trusted
    bytes are not JSON."""

    from dsh_mcp.settings import MCP_JSON_CAP

    data = project.read(rel, MCP_JSON_CAP)
    if data is None:
        return None
    if not project.trusted(rel, data, kind, summarize(data)):
        return None
    from dsh.core import files

    return files.parse_json(data, project.shown(rel))
