"""Sandbox policies: the TOML settings, validated, and the plan of what a command may touch.

A policy is chosen per agent (``[sandbox]``, overlaid by ``[agents.NAME] sandbox = …`` or
``[agents.NAME.sandbox]``; docs/config.md) and turned, for one command, into a :class:`Plan`:
the paths it may read, the paths it may write, and whether it has a network. dsh's own
config, key store, session store and attachment store are taken out of every plan, whatever
the lists say (:func:`protected_paths`). Inside each writable root, the persistence paths
(:data:`dsh.core.beneath.PERSISTENCE`, less ``unprotected``, plus the caller's ``read_only``
and the other files git obeys: :func:`git_paths`) become read-only bind mounts where
namespaces can be made (:func:`persistence_binds`).
"""

from __future__ import annotations

import functools
import math
import os
import posixpath
import sys
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import attrs

from dsh.core.errors import ConfigError
from dsh.core.files import PERSISTENCE

MODES = ("workspace-write", "read-only", "off")
BACKENDS = ("auto", "landlock")
KEYS = ("policy", "network", "read", "write", "backend", "unprotected")
#: What "read the system" means: these trees (those that exist), plus the Python installation
#: dsh runs under (commands often run ``python``). Never a home directory, ``/tmp``, ``/run``,
#: ``/var`` or ``/dev`` as a whole.
SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
               "/proc", "/sys")
#: The environment ``dsh sandbox run`` passes (``LC_*`` a prefix): dsh-shell's allowlist
#: (``dsh_shell.process.BASE_ENV``), so a command tried by hand sees what run_command's would.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM",
            "TZ", "TMPDIR")
#: Device files every command may read and write.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


@attrs.frozen
class Policy:
    """One agent's sandbox policy (``mode`` ``off`` is never implied: it is written)."""

    mode: str = "workspace-write"
    network: bool = False
    #: Extra readable / writable absolute paths (``~`` expanded), resolved.
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    backend: str = "auto"
    #: Where the policy came from, for error messages (``agent coder``, a file).
    where: str = "sandbox"
    #: Persistence paths (of :data:`dsh.core.beneath.PERSISTENCE`) left writable.
    unprotected: tuple[str, ...] = ()
    #: More paths kept read-only inside a writable root (absolute; set by code, not TOML:
    #: the agent's project memory file, :func:`dsh.sandbox.policy_for`).
    read_only: tuple[str, ...] = ()

    @property
    def confined(self) -> bool:
        return self.mode != "off"

    def record(self) -> dict[str, Any]:
        """The policy as recorded in the ledger (plain JSON)."""
        out: dict[str, Any] = {"policy": self.mode}
        if self.confined:
            out.update(network=self.network, read=list(self.read), write=list(self.write))
            if self.unprotected:
                out["unprotected"] = list(self.unprotected)
        return out

    def describe(self) -> str:
        """One line: ``workspace-write, no network`` / ``off (unconfined)``."""
        if not self.confined:
            return "off (unconfined)"
        parts = [self.mode, "network" if self.network else "no network"]
        if self.read:
            parts.append("also reads " + ", ".join(self.read))
        if self.write:
            parts.append("also writes " + ", ".join(self.write))
        if self.unprotected:
            parts.append("may write " + ", ".join(self.unprotected))
        return ", ".join(parts)

    def persistence(self) -> tuple[str, ...]:
        """The persistence paths kept read-only in each writable root (relative)."""
        return tuple(p for p in PERSISTENCE if p not in self.unprotected)


def describe_record(data: Mapping[str, Any]) -> str:
    """A recorded policy (``x/PLUGIN/sandbox``) as one line for ``dsh sessions show``:
    ``sandbox of call_1 (run_command): workspace-write, no network — landlock ABI 7``."""
    mode = str(data.get("policy"))
    what = f" of {data['call_id']}" if data.get("call_id") else ""
    what += f" ({data['tool']})" if data.get("tool") else ""
    if mode == "off":
        return f"sandbox{what}: off — ran unconfined"
    parts = [mode, "network" if data.get("network") else "no network"]
    for key, verb in (("read", "also reads"), ("write", "also writes")):
        if data.get(key):
            parts.append(f"{verb} {', '.join(map(str, data[key]))}")
    if data.get("unprotected"):
        parts.append(f"may write {', '.join(map(str, data['unprotected']))}")
    backend = f"{data.get('backend')}" + (f" ABI {data['abi']}" if data.get("abi") else "")
    ws = f" in {data['workspace']}" if data.get("workspace") else ""
    spaces = data.get("namespaces")
    if spaces:
        backend += f", namespaces {'+'.join(map(str, spaces))}"
        if data.get("read_only"):
            backend += f"; read-only {', '.join(map(str, data['read_only']))}"
        if data.get("read_only_scan"):
            backend += f" ({data['read_only_scan']})"
    elif spaces is not None:
        backend += (f"; no namespaces ({data.get('fallback') or 'unavailable'}): persistence "
                    "paths stay writable, background processes may outlive the call")
    return f"sandbox{what}: {', '.join(parts)}{ws} — {backend}"


def parse_policy(raw: Any, where: str = "sandbox") -> Policy:
    """Validate ``raw`` — a mode string (``"off"``) or a table — into a :class:`Policy`;
    raise :class:`ConfigError` naming ``where`` and the key."""
    if isinstance(raw, str):
        raw = {"policy": raw}
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[{where}]: expected a policy name ({', '.join(MODES)}) or a table, "
                          f"got {_kind(raw)}")
    for key in raw:
        if key not in KEYS:
            import difflib

            near = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid keys: {', '.join(KEYS)}"
            raise ConfigError(f"[{where}]: unknown key {key!r}{hint}")
    mode = raw.get("policy", "workspace-write")
    if mode not in MODES:
        raise ConfigError(f"[{where}] policy: expected one of {', '.join(map(repr, MODES))}, "
                          f"got {_kind(mode)}")
    network = raw.get("network", False)
    if not isinstance(network, bool):
        raise ConfigError(f"[{where}] network: expected true or false, got {_kind(network)}")
    backend = raw.get("backend", "auto")
    if backend not in BACKENDS:
        raise ConfigError(f"[{where}] backend: expected one of "
                          f"{', '.join(map(repr, BACKENDS))}, got {_kind(backend)}")
    paths = {key: _paths(raw.get(key, []), where, key) for key in ("read", "write")}
    if mode == "read-only" and paths["write"]:
        raise ConfigError(f"[{where}] write: a read-only policy writes nowhere; remove "
                          "'write' or use policy = \"workspace-write\"")
    unprotected = _unprotected(raw.get("unprotected", []), where)
    return Policy(mode=mode, network=network, read=paths["read"], write=paths["write"],
                  backend=backend, where=where, unprotected=unprotected)


def _unprotected(value: Any, where: str) -> tuple[str, ...]:
    """``unprotected``: persistence paths, relative to the workspace, left writable."""
    known = ", ".join(PERSISTENCE)
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigError(f"[{where}] unprotected: expected a list of persistence paths "
                          f"(of {known}), got {_kind(value)}")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item or "\0" in item:
            raise ConfigError(f"[{where}] unprotected[{i}]: expected a path, got "
                              f"{_kind(item)}")
        if item.startswith(("/", "~")):
            raise ConfigError(f"[{where}] unprotected[{i}]: {item!r} is absolute; name a path "
                              f"relative to the workspace, one of {known}")
        norm = posixpath.normpath(item)
        if norm == ".." or norm.startswith("../") or "/../" in f"/{item}/":
            raise ConfigError(f"[{where}] unprotected[{i}]: {item!r} leaves the workspace "
                              f"('..'); name one of {known}")
        if norm not in PERSISTENCE:
            raise ConfigError(f"[{where}] unprotected[{i}]: {item!r} is not a persistence "
                              f"path; the read-only ones are {known}")
        if norm not in out:
            out.append(norm)
    return tuple(out)


def merged_settings(top: Any, agent: Any) -> Any:
    """``[sandbox]`` overlaid key by key with the agent's ``sandbox`` (a string is the
    ``policy`` key)."""
    def table(value: Any) -> Any:
        return {"policy": value} if isinstance(value, str) else value

    top, agent = table(top), table(agent)
    if agent is None:
        return top
    if isinstance(top, Mapping) and isinstance(agent, Mapping):
        return {**top, **agent}
    return agent


def _paths(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigError(f"[{where}] {key}: expected a list of absolute paths, got "
                          f"{_kind(value)}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item or "\0" in item:
            raise ConfigError(f"[{where}] {key}[{i}]: expected a path, got {_kind(item)}")
        path = os.path.expanduser(item)
        if not os.path.isabs(path):
            raise ConfigError(f"[{where}] {key}[{i}]: {item!r} is relative; give an absolute "
                              "path (or one starting with ~)")
        if not os.path.exists(path):
            raise ConfigError(f"[{where}] {key}[{i}]: {item!r} does not exist")
        out.append(os.path.realpath(path))
    return tuple(out)


def _kind(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"the number {value}"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    return f"{type(value).__name__} {value!r}"


# --------------------------------------------------------------------------------------------
# dsh's own paths, and the plan of one command
# --------------------------------------------------------------------------------------------


def protected_paths(extra: Iterable[str | None] = ()) -> tuple[str, ...]:
    """dsh's own files, never granted to a sandboxed process: the config directory (with the
    key store), ``$DSH_CONFIG``, the data directory (sessions and attachments), and
    ``extra`` (the config file and session directory of the current run)."""
    from dsh.config.keys import keys_dir
    from dsh.config.loader import default_config_path
    from dsh.ledger.store import default_data_dir

    found = [str(keys_dir().parent), str(default_config_path()), str(default_data_dir()),
             *(e for e in extra if e)]
    out: list[str] = []
    for p in found:
        real = os.path.realpath(os.path.expanduser(p))
        if real not in out:
            out.append(real)
    return tuple(out)


class PlanError(ConfigError):
    """A policy that cannot be applied as written (it would grant one of dsh's own paths)."""


@attrs.frozen
class Plan:
    """What one command may touch: ``(path, kind)`` rules, kind ``read``/``write``/``device``;
    and, when it gets namespaces (``namespaces``: ``"pid"`` for a tool call, ``"mount"``
    for an MCP server, None without), the writable ``roots`` and the ``binds`` made in them
    (``(root index, relative path, read_only)``, a directory before what lies in it)."""

    rules: tuple[tuple[str, str], ...]
    network: bool
    namespaces: str | None = None
    roots: tuple[str, ...] = ()
    binds: tuple[tuple[int, str, bool], ...] = ()
    #: The git paths of :func:`git_paths` in the workspace that did not exist (relative): a
    #: command that makes one has it moved aside (:meth:`dsh.sandbox.spawn.Popen._quarantine`).
    absent: tuple[str, ...] = ()
    #: Where :func:`git_paths` stopped early, or empty.
    scan: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"rules": [list(r) for r in self.rules], "network": self.network,
                "namespaces": self.namespaces, "roots": list(self.roots),
                "binds": [list(b) for b in self.binds]}

    def read_only(self) -> list[str]:
        """The paths made read-only, as recorded: relative to the workspace (the first
        root), absolute in the others."""
        return [rel if i == 0 else os.path.join(self.roots[i], rel)
                for i, rel, ro in self.binds if ro]

    def encode(self) -> bytes:
        """What the launcher reads (:func:`dsh.sandbox.exec.decode`): NUL-separated fields."""
        fields = ["network", "1" if self.network else "0"]
        for path, kind in self.rules:
            fields += [kind, path]
        if self.namespaces is not None:
            fields += ["ns", self.namespaces]
            for root in self.roots:
                fields += ["root", root]
            for i, rel, ro in self.binds:
                fields += ["ro" if ro else "rw", f"{i}:{rel}"]
        return "\0".join(fields).encode("utf-8", "surrogateescape")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def build_plan(policy: Policy, workspace: str, tmp: str | None,
               protected: Iterable[str], *, namespaces: str | None = None,
               read_only: Iterable[str] = ()) -> Plan:
    """The rules for one command under ``policy`` in ``workspace`` (resolved), with ``tmp``
    as its private temp directory; with ``namespaces`` (``"pid"``/``"mount"``), the bind
    mounts that keep the persistence paths, what git obeys besides them (:func:`git_paths`,
    unless ``.git`` is unprotected) and ``read_only`` (absolute paths) read-only in each
    writable root. Raises :class:`PlanError` when a path the policy names is, holds or
    lies in one of dsh's ``protected`` paths."""
    protected = tuple(protected)
    workspace = os.path.realpath(workspace)
    rules = list(_system_rules(protected))
    ws_kind = "write" if policy.mode == "workspace-write" else "read"
    named = [(workspace, ws_kind, "the workspace")]
    named += [(p, "read", "read") for p in policy.read]
    named += [(p, "write", "write") for p in policy.write]
    for path, kind, what in named:
        for p in protected:
            if _within(path, p):
                raise PlanError(f"[{policy.where}] {what} {path} is inside dsh's own files "
                                f"({p}); a sandboxed process never reaches them")
            if kind == "write" and _within(p, path):
                raise PlanError(f"[{policy.where}] {what} {path} holds dsh's own files ({p}); "
                                "a sandboxed process may not write there: choose a directory "
                                "that does not contain them")
        rules += _read_around(path, protected) if kind == "read" else [(path, kind)]
    if tmp is not None:
        rules.append((os.path.realpath(tmp), "write"))
    if namespaces is None:
        return Plan(rules=tuple(rules), network=policy.network)
    roots = ((workspace,) if ws_kind == "write" else ()) + policy.write
    git: list[str] = []
    notes: list[str] = []
    if ".git" in policy.persistence():
        for root in roots:
            from dsh.sandbox.gitpaths import git_paths

            paths, note = git_paths(root)
            git += paths
            notes += [note] if note else []
    binds = persistence_binds(roots, policy.persistence(),
                              (*policy.read_only, *read_only, *git))
    absent = tuple(os.path.relpath(p, workspace) for p in git
                   if ws_kind == "write" and _within(p, workspace) and not os.path.lexists(p))
    return Plan(rules=tuple(rules), network=policy.network, namespaces=namespaces,
                roots=roots, binds=binds, absent=absent, scan="; ".join(notes))


def persistence_binds(roots: Iterable[str], names: Iterable[str],
                      extra: Iterable[str] = ()) -> tuple[tuple[int, str, bool], ...]:
    """The bind mounts that keep ``names`` (relative) and ``extra`` (absolute) read-only in
    each of ``roots`` (resolved directories): ``(root index, relative path, read_only)``.

    Only what exists now (a path created later is not covered: see docs/execution.md). A
    path reached through a symbolic link on the way is left out (the child refuses every
    link on the way too); a final link is kept (a mount point cannot be replaced) and so is
    its target when that lies in the same root. Every directory on the way to a read-only
    path becomes a writable mount point first, so that it cannot be renamed away and
    replaced (``.git`` for ``.git/config``): the kernel refuses to rename a mount point.
    ``.git`` itself is read-only when it is a file (a worktree's pointer to its git
    directory). A path inside another read-only one is covered by it."""
    names, extra = tuple(names), tuple(extra)
    out: list[tuple[int, str, bool]] = []
    for index, root in enumerate(roots):
        wanted = list(names)
        for path in extra:
            path = os.path.abspath(os.path.expanduser(path))
            path = os.path.join(os.path.realpath(os.path.dirname(path)),
                                os.path.basename(path))
            if path != root and _within(path, root):
                wanted.append(os.path.relpath(path, root))
        if any(n.startswith(".git/") for n in wanted) and _kind_at(root, ".git") == "file":
            wanted.append(".git")
        found: set[str] = set()
        for rel in wanted:
            found.update(_existing(root, rel))
        ro = sorted(r for r in found
                    if not any(r.startswith(other + "/") for other in found))
        rw = sorted({prefix for r in ro for prefix in _prefixes(r)} - set(ro),
                    key=lambda p: (p.count("/"), p))
        out += [(index, p, False) for p in rw] + [(index, r, True) for r in ro]
    return tuple(out)


def _prefixes(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]


def _kind_at(root: str, rel: str) -> str | None:
    """``dir``, ``file``, ``link``, ``other`` or None (missing, or a link on the way)."""
    import stat

    for prefix in _prefixes(rel):
        if _kind_at(root, prefix) != "dir":
            return None
    try:
        mode = os.lstat(os.path.join(root, rel)).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def _existing(root: str, rel: str) -> list[str]:
    rel = posixpath.normpath(rel)
    if rel.startswith(("/", "..")) or rel == ".":
        return []
    kind = _kind_at(root, rel)
    if kind is None:
        return []
    if kind != "link":
        return [rel]
    target = os.path.realpath(os.path.join(root, rel))
    if target == root or not _within(target, root) or not os.path.exists(target):
        return [rel]
    return [rel, os.path.relpath(target, root)]


@functools.lru_cache(maxsize=8)
def _system_rules(protected: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The system trees and devices (the same for every command of a process with the same
    protected paths: computed once, not per command)."""
    rules: list[tuple[str, str]] = []
    system = [*SYSTEM_READ, sys.base_prefix, sys.prefix]
    for root in dict.fromkeys(os.path.realpath(p) for p in system if os.path.exists(p)):
        rules += _read_around(root, protected)
    rules += [(d, "device") for d in DEVICES if os.path.exists(d)]
    return tuple(rules)


def _read_around(root: str, protected: tuple[str, ...], depth: int = 0) -> list[tuple[str, str]]:
    """Read rules for ``root`` minus every protected path in it: the tree itself when none
    is inside, else its entries but the branch that leads to one, recursively."""
    inside = [p for p in protected if _within(p, root)]
    if any(p == root for p in inside) or depth > 16:
        return []
    if not inside:
        return [(root, "read")]
    rules: list[tuple[str, str]] = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        path = entry.path
        if entry.is_symlink():
            target = os.path.realpath(path)
            if os.path.exists(target) and not any(_within(target, p) or _within(p, target)
                                                  for p in protected):
                rules.append((target, "read"))
            continue
        rules += _read_around(path, protected, depth + 1)
    return rules
