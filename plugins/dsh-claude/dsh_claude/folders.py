"""Where commands and agents come from: the project's ``.claude/``, the user's
``~/.claude/``, and Claude Code plugin folders (``.claude-plugin/plugin.json``).

A plugin folder is enabled by listing it in ``[plugins.claude] plugins = [...]`` (``dsh
claude add PATH`` does it, docs/claude.md). :func:`load_plugin` reads its manifest: ``name``
(required), ``version``, ``description`` and the optional path overrides ``commands``,
``agents`` (a path or a list of paths), ``hooks`` and ``mcpServers`` (a path, or an inline
object, which dsh-hooks / dsh-mcp read). Every path must be relative, start with ``./`` as
Claude Code requires, and resolve (symlinks followed) inside the folder: a manifest that
lies about its paths is a :class:`~dsh_claude.frontmatter.ClaudeFileError` naming the file
and key. A local marketplace (``.claude-plugin/marketplace.json``) names its plugins and
their ``source`` folders; only local sources (``./…`` inside the marketplace) are supported.

A folder outside the project is the person's own (they listed it): its path is resolved once
and its files are read beneath it. A folder **inside the project** is a place a confined
command may write: it is read beneath the project root (no link followed) and it is used only
while its manifest's bytes are the ones the person trusted (``dsh trust``, kind ``plugin``;
``dsh claude add`` of such a folder approves the manifest it shows).

Nothing here is imported at start-up except through the hooks that need it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dsh_claude.frontmatter import ClaudeFileError
from dsh_claude.frontmatter import decode
from dsh_claude.frontmatter import inside
from dsh_claude.frontmatter import read_file

MANIFEST = ".claude-plugin/plugin.json"
MARKETPLACE = ".claude-plugin/marketplace.json"
#: The largest manifest read.
MAX_MANIFEST = 256 * 1024
#: Files looked at per folder of commands or agents (a folder with more is cut, with a note).
MAX_FILES = 1000
#: Subfolder depth of ``commands/`` (namespaces ``a:b:name``).
MAX_DEPTH = 4


@attrs.frozen
class ClaudePlugin:
    """An enabled Claude Code plugin folder, its manifest checked. ``confine``: the folder
    its files are read beneath (the project root for a folder inside the project, else the
    folder itself); ``manifest``: the manifest's bytes as read (what trust is about)."""

    name: str
    root: Path
    version: str = ""
    description: str = ""
    commands: tuple[Path, ...] = ()
    agents: tuple[Path, ...] = ()
    skills: tuple[Path, ...] = ()
    confine: Path | None = None
    manifest: bytes = attrs.field(default=b"", repr=False)
    in_project: bool = False

    @property
    def base(self) -> Path:
        return self.confine or self.root


def project_root(settings: Mapping[str, Any] | None = None) -> Path:
    """:func:`dsh_claude.settings.project_root` for a raw ``[plugins.claude]`` table."""
    from dsh_claude.settings import Settings
    from dsh_claude.settings import project_root as root_of

    given = (settings or {}).get("root")
    return root_of(Settings(root=given if isinstance(given, str) else ""))


def user_dir() -> Path:
    """``~/.claude``: ``$CLAUDE_CONFIG_DIR`` when set (:func:`dsh_claude.settings.claude_dir`)."""
    from dsh_claude.settings import claude_dir

    return claude_dir()


def _json(path: Path, root: Path) -> tuple[bytes, Any]:
    data = read_file(path, [root], MAX_MANIFEST)
    try:
        return data, json.loads(decode(data, path))
    except json.JSONDecodeError as exc:
        raise ClaudeFileError(path, f"line {exc.lineno}: invalid JSON: {exc.msg}") from None


def _inside_path(root: Path, value: Any, manifest: Path, key: str) -> Path:
    """``value`` (a manifest path) resolved inside ``root``, or a ClaudeFileError."""
    if not isinstance(value, str) or not value.strip():
        raise ClaudeFileError(manifest, f"key {key!r}: expected a path such as "
                                        f"'./{key}/', not {value!r}")
    if os.path.isabs(value) or not value.startswith("./"):
        raise ClaudeFileError(manifest, f"key {key!r}: {value!r} must be a relative path "
                                        "starting with './' (inside the plugin folder)")
    target = (root / value).resolve()
    if not inside(target, [root]):
        raise ClaudeFileError(manifest, f"key {key!r}: {value!r} leads outside the plugin "
                                        f"folder {root}: refused")
    if not target.exists():
        raise ClaudeFileError(manifest, f"key {key!r}: {value!r} does not exist in {root}")
    return target


def _paths(root: Path, data: Mapping[str, Any], key: str, default: str,
           manifest: Path) -> tuple[Path, ...]:
    value = data.get(key)
    if value is None:
        folder = root / default
        return (folder,) if folder.is_dir() and inside(folder.resolve(), [root]) else ()
    items = value if isinstance(value, list) else [value]
    return tuple(_inside_path(root, v, manifest, key) for v in items)


def load_plugin(path: str | os.PathLike[str], project: Path | None = None) -> ClaudePlugin:
    """The plugin folder at ``path``, its ``.claude-plugin/plugin.json`` checked. Inside
    ``project`` (the project root) the folder is taken by name, never through a link, and
    read beneath the project root; elsewhere its path is resolved once."""
    given = Path(os.path.normpath(os.path.abspath(os.path.expanduser(os.fspath(path)))))
    if project is not None and inside(given, [project]):
        root, confine = given, Path(os.path.normpath(os.path.abspath(project)))
    else:
        root = given.resolve()
        confine = (Path(os.path.normpath(os.path.abspath(project)))
                   if project is not None and inside(root, [project]) else root)
    if not root.is_dir():
        raise ClaudeFileError(root, "is not a folder (a Claude Code plugin folder holds "
                                    f"{MANIFEST})")
    manifest = root / MANIFEST
    raw, data = _json(manifest, confine)
    if not isinstance(data, dict):
        raise ClaudeFileError(manifest, "expected a JSON object")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or any(c in name for c in "/\\: \t\n"):
        raise ClaudeFileError(manifest, f"key 'name': expected a plugin name (kebab-case, "
                                        f"no spaces, ':' or '/'), not {name!r}")
    for key in ("version", "description"):
        if key in data and not isinstance(data[key], str):
            raise ClaudeFileError(manifest, f"key {key!r}: expected a string")
    for key in ("hooks", "mcpServers"):  # read by dsh-hooks / dsh-mcp; checked here too
        value = data.get(key)
        for item in (value if isinstance(value, list) else [value]):
            if isinstance(item, str):
                _inside_path(root, item, manifest, key)
            elif item is not None and not isinstance(item, dict):
                raise ClaudeFileError(manifest, f"key {key!r}: expected a path or an object")
    return ClaudePlugin(
        name=name, root=root, version=str(data.get("version", "")),
        description=str(data.get("description", "")),
        commands=_paths(root, data, "commands", "commands", manifest),
        agents=_paths(root, data, "agents", "agents", manifest),
        skills=_paths(root, data, "skills", "skills", manifest),
        confine=confine, manifest=raw,
        in_project=project is not None and inside(root, [project]),
    )


def plugin_summary(plugin: ClaudePlugin) -> str:
    """What trusting a plugin folder's manifest lets in (the trust question's lines)."""
    lines = [f"plugin {plugin.name} {plugin.version}".rstrip(),
             *([plugin.description[:200]] if plugin.description else [])]
    for what, folders in (("commands", plugin.commands), ("agents", plugin.agents),
                          ("skills", plugin.skills)):
        if folders:
            lines.append(f"{what}: " + ", ".join(str(f) for f in folders))
    return "\n".join(lines)


def from_marketplace(path: str | os.PathLike[str], name: str) -> Path:
    """The folder of plugin ``name`` of the local marketplace at ``path``."""
    root = Path(os.path.expanduser(os.fspath(path))).resolve()
    manifest = root / MARKETPLACE
    _, data = _json(manifest, root)
    plugins = data.get("plugins") if isinstance(data, dict) else None
    if not isinstance(plugins, list):
        raise ClaudeFileError(manifest, "key 'plugins': expected a list of plugins")
    names = []
    for i, entry in enumerate(plugins):
        if not isinstance(entry, dict):
            raise ClaudeFileError(manifest, f"key 'plugins[{i}]': expected an object")
        names.append(str(entry.get("name")))
        if entry.get("name") != name:
            continue
        source = entry.get("source")
        if not isinstance(source, str):
            raise ClaudeFileError(manifest, f"plugin {name!r}: only a local source ('./…' "
                                            "inside the marketplace) is supported, not "
                                            f"{json.dumps(source)[:80]}")
        base = root
        plugin_root = data.get("metadata", {}).get("pluginRoot") if isinstance(
            data.get("metadata"), dict) else None
        if isinstance(plugin_root, str) and not source.startswith("./"):
            source = plugin_root.rstrip("/") + "/" + source
        return _inside_path(base, source, manifest, f"plugins[{i}].source")
    raise ClaudeFileError(manifest, f"no plugin named {name!r} (it lists: "
                                    f"{', '.join(names) or 'none'})")


def configured_plugins(settings: Mapping[str, Any]) -> tuple[list[ClaudePlugin], list[str]]:
    """The plugin folders of ``[plugins.claude] plugins``, and one problem line for each
    that cannot be used (the others still load)."""
    found: list[ClaudePlugin] = []
    problems: list[str] = []
    value = settings.get("plugins") or []
    if not isinstance(value, list):
        return [], [f"[plugins.claude] plugins: expected a list of folders, not {value!r}"]
    from dsh_claude.frontmatter import gate

    project = project_root(settings)
    seen: set[str] = set()
    for item in value:
        if not isinstance(item, str):
            problems.append(f"[plugins.claude] plugins: expected a folder path, not {item!r}")
            continue
        try:
            plugin = load_plugin(item, project)
        except ClaudeFileError as exc:
            problems.append(str(exc))
            continue
        if plugin.in_project and not gate(plugin.base, os.path.relpath(
                plugin.root / MANIFEST, plugin.base), plugin.manifest, "plugin",
                plugin_summary(plugin)):
            continue  # a folder in the project, its manifest not trusted: inert (gate said)
        if plugin.name in seen:
            problems.append(f"{plugin.root}: plugin name {plugin.name!r} is already used by "
                            "another folder in [plugins.claude] plugins: skipped")
            continue
        seen.add(plugin.name)
        found.append(plugin)
    return found, problems


def markdown_files(folder: Path, root: Path, depth: int = MAX_DEPTH) -> list[tuple[str, Path]]:
    """``(namespace, path)`` of the ``*.md`` files under ``folder`` (``""`` at its top,
    ``a:b`` in ``a/b/``), sorted; at most :data:`MAX_FILES`. The folder is listed from its
    descriptor, opened beneath ``root`` with no symbolic link followed (a folder that is a link
    lists nothing; subfolders that are links are not entered). A file that is a link is
    returned: the reader refuses it, with a line naming it."""
    from dsh.core import beneath
    from dsh_claude.frontmatter import locate

    out: list[tuple[str, Path]] = []
    found = locate(folder, [root])
    if found is None:
        return out

    def walk(dfd: int, d: Path, ns: tuple[str, ...]) -> None:
        try:
            entries = sorted(os.scandir(dfd), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if len(out) >= MAX_FILES:
                return
            if e.name.startswith("."):
                continue
            if e.is_dir(follow_symlinks=False):
                if len(ns) < depth:
                    try:
                        sub = beneath.open_dir(dfd, e.name)
                    except OSError:
                        continue
                    try:
                        walk(sub, d / e.name, (*ns, e.name))
                    finally:
                        os.close(sub)
            elif e.name.endswith(".md"):
                out.append((":".join(ns), d / e.name))

    try:
        top = beneath.open_dir(found[0], found[1])
    except OSError:
        return out
    try:
        walk(top, Path(found[0]) / found[1], ())
    finally:
        os.close(top)
    return out


def plugin_skill_roots(settings: Mapping[str, Any]) -> list[Any]:
    """The ``skills/`` folders of the enabled plugin folders, as
    :class:`dsh_claude.skills.SkillRoot` (origin ``plugin NAME``, read beneath the folder, or
    beneath the project root for a folder inside it), for :func:`dsh_claude.skill_roots`."""
    from dsh_claude.skills import SkillRoot

    plugins, _ = configured_plugins(settings)
    return [SkillRoot(folder, f"plugin {p.name}", p.base) for p in plugins for folder in p.skills]
