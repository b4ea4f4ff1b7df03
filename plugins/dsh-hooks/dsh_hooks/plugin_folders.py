"""``claude_plugins``: the hooks of Claude Code plugin folders (docs/hooks-plugin.md).

A plugin folder holds ``.claude-plugin/plugin.json`` (optional here) and its hooks in
``hooks/hooks.json``; the manifest's ``hooks`` may name other files (a path or a list of
paths, relative to the folder, and inside it) or hold the hooks object inline. Each file is
``{"description": …, "hooks": {EVENT: [matcher groups]}}``, the structure of
``.claude/settings.json``'s ``hooks``. Commands get ``CLAUDE_PLUGIN_ROOT`` (the folder) in
their environment, and ``${CLAUDE_PLUGIN_ROOT}`` in their text is replaced by the folder's
path when that path needs no shell quoting (else the shell expands it from the environment).

Every error is a :class:`~dsh.core.errors.ConfigError` naming the file and key: a folder that
is missing, a manifest that is not JSON, a path that leaves the folder (``..``, an absolute
path, a symbolic link out of it).

A folder inside the project (or the agent's workspace) is the project's, not the user's: its
files are read beneath the project (:mod:`dsh.core.beneath`: no symbolic link followed at all)
and each file that holds hooks is used only while its exact bytes are trusted
(:func:`dsh_hooks.config.admit`, kind ``plugin``); its hooks are ``from_project`` (they may
deny or ask, never approve). A folder elsewhere is the user's own, read as it is.
"""

from __future__ import annotations

import os
import re
from typing import Any

import attrs

from dsh.core.errors import ConfigError
from dsh_hooks.config import SETTINGS_CAP
from dsh_hooks.config import Hook
from dsh_hooks.config import parse_hooks

MANIFEST = os.path.join(".claude-plugin", "plugin.json")
DEFAULT_HOOKS = os.path.join("hooks", "hooks.json")
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./@%+=:,-]+")


def check(raw: Any, where: str) -> None:
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        raise ConfigError(f"[{where}] claude_plugins: expected a list of plugin folder paths, "
                          f"got {raw!r:.80}")


def load(raw: list[str], where: str, project: str, timeout: float, *,
         review: bool = False, workspace: str | None = None) -> list[Hook]:
    """The hooks of every folder in ``raw`` (paths relative to the project directory)."""
    out: list[Hook] = []
    for i, given in enumerate(raw):
        full = os.path.normpath(os.path.join(project, os.path.expanduser(given)))
        root = os.path.realpath(full)
        if not os.path.isdir(root):
            raise ConfigError(f"[{where}] claude_plugins[{i}]: {given!r} is not a folder "
                              f"({root})")
        base = _project_of(full, root, project, workspace)
        if base is None:
            out.extend(_folder(root, timeout))
        else:  # the project's own: read beneath it, by the names given, no link followed
            top, rel = base
            out.extend(_folder(os.path.join(top, rel), timeout, (top, rel), review))
    return out


def _project_of(full: str, real: str, project: str, workspace: str | None
                ) -> tuple[str, str] | None:
    """``(root, path in it)`` when the folder lies in the project or the workspace (by the
    name given, else by its real path), else None (a folder of the user's)."""
    from dsh.core.beneath import within

    roots = [project] + ([os.path.realpath(workspace)] if workspace else [])
    for path in (full, real):
        for top in roots:
            if within(path, top):
                return top, os.path.relpath(path, top)
    return None


def _folder(root: str, timeout: float, base: tuple[str, str] | None = None,
            review: bool = False) -> list[Hook]:
    """The hooks of the folder ``root``; ``base`` (``(project, folder in it)``): the
    project's folder, its files read beneath the project and admitted by content."""
    manifest_path = os.path.join(root, MANIFEST)
    manifest_bytes = _read(root, MANIFEST, manifest_path, base)
    files: dict[str, tuple[str, str]] = {}  # rel → (path, the manifest key naming it or "")
    default, default_path = _locate(root, DEFAULT_HOOKS, f"{root}: {DEFAULT_HOOKS}", base)
    files[default] = (default_path, "")
    hooks: list[Hook] = []
    problem: ConfigError | None = None
    try:
        manifest = _json(manifest_bytes, manifest_path) if manifest_bytes is not None else {}
        if not isinstance(manifest, dict):
            raise ConfigError(f"{manifest_path}: expected a JSON object")
        spec = manifest.get("hooks")
        if isinstance(spec, str):
            spec = [spec]
        if isinstance(spec, list):
            for j, given in enumerate(spec):
                key = f"{manifest_path}: hooks" + (f"[{j}]" if len(spec) > 1 else "")
                if not isinstance(given, str) or not given:
                    raise ConfigError(f"{key}: expected a path inside the plugin folder")
                rel, path = _locate(root, given, key, base)
                files.setdefault(rel, (path, key))
        elif isinstance(spec, dict):  # inline: the hooks object, or {"hooks": {...}}
            obj = spec["hooks"] if isinstance(spec.get("hooks"), dict) else spec
            hooks = parse_hooks(obj, f"{manifest_path}: hooks", strict=False,
                                default_timeout=timeout)
        elif spec is not None:
            raise ConfigError(f"{manifest_path}: hooks: expected a path, a list of paths or "
                              f"an object, got {type(spec).__name__}")
    except ConfigError as exc:
        if base is None:
            raise
        problem = exc
    if base is not None and manifest_bytes is not None:
        if not _admitted(base, MANIFEST, manifest_bytes, hooks, problem, review):
            # inert: neither its hooks nor the files it names
            files, hooks = {default: files[default]}, []
    out = list(hooks)
    for rel, (path, key) in files.items():
        data = _read(root, rel, path, base, named_by=key)
        if data is None:
            if key:
                raise ConfigError(f"{path}: cannot read: no such file (named by {key})")
            continue
        found: list[Hook] = []
        problem = None
        try:
            obj = _json(data, path)
            if not isinstance(obj, dict) or not isinstance(obj.get("hooks"), dict):
                raise ConfigError(f"{path}: hooks: expected {{\"hooks\": {{EVENT: [...]}}}}")
            found = parse_hooks(obj["hooks"], f"{path} hooks", strict=False,
                                default_timeout=timeout)
        except ConfigError as exc:
            if base is None:
                raise ConfigError(f"{exc} (named by {key})" if key else str(exc)) from None
            problem = ConfigError(f"{exc} (named by {key})" if key else str(exc))
        if base is not None and not _admitted(base, rel, data, found, problem, review):
            continue
        out.extend(found)
    return [attrs.evolve(h, command=expand(h.command, root), plugin_root=root,
                         from_project=base is not None) for h in out]


def _admitted(base: tuple[str, str], rel: str, data: bytes, hooks: list[Hook],
              problem: ConfigError | None, review: bool) -> bool:
    """Whether the hooks of the project folder's file ``rel`` may be used
    (:func:`dsh_hooks.config.admit`, kind ``plugin``). A file that cannot be read as hooks
    is an error once trusted (or listed: ``review``), else inert. ``review``: the hooks are
    kept, marked ignored with why (``hooks`` is changed in place)."""
    from dsh_hooks.config import admit

    top, folder = base
    why = admit(top, os.path.join(folder, rel), data, "plugin", hooks, problem, review=review)
    if problem is not None and (review or not why):
        raise problem
    if why and review:
        hooks[:] = [attrs.evolve(h, ignored=h.ignored or why) for h in hooks]
        return True
    return not why


def _locate(root: str, rel: str, key: str, base: tuple[str, str] | None) -> tuple[str, str]:
    """``(path in the folder, full path)`` of a file the folder holds, named by ``key``: an
    absolute path or ``..`` is refused; for the user's folder a link that leads out of it
    too (the project's folder follows no link at all when it is read)."""
    if base is None:
        path = inside(root, rel, key)
        return os.path.relpath(path, root), path
    if os.path.isabs(rel):
        raise ConfigError(f"{key}: {rel!r} is an absolute path; a plugin's paths are "
                          "relative to its folder")
    norm = os.path.normpath(rel)
    if norm == os.pardir or norm.startswith(os.pardir + os.sep):
        raise ConfigError(f"{key}: {rel!r} leads out of the plugin folder {root}")
    return norm, os.path.join(root, norm)


def _read(root: str, rel: str, path: str, base: tuple[str, str] | None,
          named_by: str = "") -> bytes | None:
    """The bytes of the folder's file ``rel`` (None when missing): beneath the project for a
    project folder (no link followed), else by name."""
    from dsh.core import beneath
    from dsh.core import files

    by = f" (named by {named_by})" if named_by else ""
    try:
        if base is None:
            return files.read_regular(path, SETTINGS_CAP)
        top, folder = base
        return beneath.read(top, os.path.join(folder, rel), SETTINGS_CAP)
    except FileNotFoundError:
        return None
    except beneath.Refused as exc:
        raise ConfigError(f"{path}: cannot read: {exc.why}{by}") from None
    except files.NotRegular as exc:
        raise ConfigError(f"{path}: cannot read: it is {exc.kind}, not a regular file"
                          f"{by}") from None
    except files.TooLarge:
        raise ConfigError(f"{path}: cannot read: larger than {SETTINGS_CAP} bytes{by}") \
            from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {files.reason(exc)}{by}") from None


def _json(data: bytes, path: str) -> Any:
    from dsh.core import files

    return files.parse_json(data, path)


def expand(command: str, root: str) -> str:
    """``${CLAUDE_PLUGIN_ROOT}`` (and ``$CLAUDE_PLUGIN_ROOT``) replaced by ``root`` — as
    text when it needs no quoting; else quoted for where it stands: outside quotes as
    ``"${CLAUDE_PLUGIN_ROOT}"`` (the shell expands it from the environment, as one word),
    inside double quotes left to the shell, inside single quotes the path with its single
    quotes escaped."""
    marks = ("${CLAUDE_PLUGIN_ROOT}", "$CLAUDE_PLUGIN_ROOT")
    if _SHELL_SAFE.fullmatch(root):
        return command.replace(marks[0], root)
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(command):
        c = command[i]
        mark = next((m for m in marks if command.startswith(m, i)), None)
        if mark is not None and quote != "'" and not (
                mark == marks[1] and re.match(r"\w", command[i + len(mark):i + len(mark) + 1])):
            out.append(mark if quote == '"' else '"${CLAUDE_PLUGIN_ROOT}"')
            i += len(mark)
            continue
        if mark == marks[0] and quote == "'":
            out.append(root.replace("'", "'\\''"))
            i += len(mark)
            continue
        if c == "\\" and quote != "'" and i + 1 < len(command):
            out.append(command[i:i + 2])
            i += 2
            continue
        if c in "'\"" and quote in ("", c):
            quote = "" if quote == c else c
        out.append(c)
        i += 1
    return "".join(out)


def inside(root: str, rel: str, key: str) -> str:
    """:func:`dsh.core.files.inside_folder`."""
    from dsh.core.files import inside_folder

    return inside_folder(root, rel, key)
