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


def load(raw: list[str], where: str, project: str, timeout: float) -> list[Hook]:
    """The hooks of every folder in ``raw`` (paths relative to the project directory)."""
    out: list[Hook] = []
    for i, given in enumerate(raw):
        root = os.path.realpath(os.path.join(project, os.path.expanduser(given)))
        if not os.path.isdir(root):
            raise ConfigError(f"[{where}] claude_plugins[{i}]: {given!r} is not a folder "
                              f"({root})")
        out.extend(_folder(root, timeout))
    return out


def _folder(root: str, timeout: float) -> list[Hook]:
    manifest_path = os.path.join(root, MANIFEST)
    manifest = read_json(manifest_path) if os.path.lexists(manifest_path) else {}
    if not isinstance(manifest, dict):
        raise ConfigError(f"{manifest_path}: expected a JSON object")
    files: dict[str, str] = {}  # path → the manifest key that named it ("" for the default)
    default = os.path.join(root, DEFAULT_HOOKS)
    if os.path.lexists(default):
        files[inside(root, DEFAULT_HOOKS, f"{root}: {DEFAULT_HOOKS}")] = ""
    spec = manifest.get("hooks")
    hooks: list[Hook] = []
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, list):
        for j, rel in enumerate(spec):
            key = f"{manifest_path}: hooks" + (f"[{j}]" if len(spec) > 1 else "")
            if not isinstance(rel, str) or not rel:
                raise ConfigError(f"{key}: expected a path inside the plugin folder")
            files.setdefault(inside(root, rel, key), key)
    elif isinstance(spec, dict):  # inline: the hooks object, or {"hooks": {...}}
        obj = spec["hooks"] if isinstance(spec.get("hooks"), dict) else spec
        hooks.extend(parse_hooks(obj, f"{manifest_path}: hooks", strict=False,
                                 default_timeout=timeout))
    elif spec is not None:
        raise ConfigError(f"{manifest_path}: hooks: expected a path, a list of paths or an "
                          f"object, got {type(spec).__name__}")
    for path, key in files.items():
        try:
            data = read_json(path)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (named by {key})" if key else str(exc)) from None
        if not isinstance(data, dict) or not isinstance(data.get("hooks"), dict):
            raise ConfigError(f"{path}: hooks: expected {{\"hooks\": {{EVENT: [...]}}}}")
        hooks.extend(parse_hooks(data["hooks"], f"{path} hooks", strict=False,
                                 default_timeout=timeout))
    return [attrs.evolve(h, command=expand(h.command, root), plugin_root=root) for h in hooks]


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


def read_json(path: str) -> Any:
    """A JSON file read with a bound (:func:`dsh.core.files.read_json`); FIFOs, devices, huge
    and non-UTF-8 files refused with a :class:`ConfigError` naming it."""
    from dsh.core import files

    try:
        return files.read_json(path, SETTINGS_CAP)
    except FileNotFoundError:
        raise ConfigError(f"{path}: cannot read: no such file") from None
