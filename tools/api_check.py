"""Check dsh's public API against the last release: a breaking change must be announced.

    python tools/api_check.py                      # this tree against api/dsh-<last>.json
    python tools/api_check.py --against v0.4.0     # ... against a git tag or commit
    python tools/api_check.py --dump api/dsh-0.5.0.json          # at release time
    python tools/api_check.py --against REF --dump api/dsh-X.json  # a release's baseline

The public API is what plugin authors import: the names in ``dsh.__all__`` (resolved through
the ``_LAZY`` map of ``dsh/__init__.py`` when the static import is not there), ``dsh.sandbox``'s
and ``dsh.testing``'s ``__all__``, the hook specifications of ``dsh.hookspecs``, and the
``__all__`` of each first-party plugin's package (``plugins/*/dsh_*``). Each public object is
read statically by griffe, flattened (a class carries its inherited public members) and
compared with griffe's own rules (``griffe.find_breaking_changes``): a removed name, a removed,
moved or newly required parameter, a changed default, a changed kind, a removed base class.
Adding is never a break.

A break passes when the ``## [Unreleased]`` section of CHANGELOG.md names the object's dotted
path (or a parent's: ```dsh.sandbox.Result``` covers ``dsh.sandbox.Result.code``) in
backticks under ``### Changed``, ``### Removed`` or ``### Deprecated``. Every other break is
printed on stderr, one line each (path, kind, old -> new), and the exit code is 1. Exit code
2: the baseline, the ref or the tree could not be read. Nothing is imported from the tree.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[1]
FORMAT = 1
#: modules whose ``__all__`` is public ("all"), or whose every public member is ("members")
CORE = (("dsh", "all"), ("dsh.sandbox", "all"), ("dsh.testing", "all"),
        ("dsh.hookspecs", "members"))
ANNOUNCING = ("changed", "removed", "deprecated")
DROP = ("docstring", "path", "filepath", "relative_filepath", "relative_package_filepath",
        "source_link", "git_info", "endlineno", "is_public", "is_deprecated", "is_private",
        "is_class_private", "is_special", "is_imported", "is_exported", "is_wildcard_exposed")
MAX_DEPTH = 4
#: Hooks are called with keyword arguments and an implementation names only those it needs:
#: a hook specification may gain arguments, reorder them or change their kind; an
#: implementation breaks only when an argument it names goes (or the hook itself).
HOOK_COMPATIBLE = frozenset({
    griffe.BreakageKind.PARAMETER_ADDED_REQUIRED, griffe.BreakageKind.PARAMETER_MOVED,
    griffe.BreakageKind.PARAMETER_CHANGED_KIND, griffe.BreakageKind.PARAMETER_CHANGED_REQUIRED,
    griffe.BreakageKind.PARAMETER_CHANGED_DEFAULT})


class CheckError(Exception):
    """The check could not run (exit code 2)."""


# -------------------------------------------------------------------------------- surface


def _final(obj: Any) -> Any | None:
    """What ``obj`` stands for: an alias's target, and a module-level assignment of another
    name of its module (``request_approval = request``) followed to that object."""
    for _ in range(MAX_DEPTH):
        try:
            obj = obj.final_target if obj.is_alias else obj
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
        value = str(obj.value) if obj.is_attribute and obj.value is not None else ""
        parent = obj.parent
        if not (value.isidentifier() and parent is not None and parent.is_module
                and value in parent.members and value != obj.name):
            return obj
        obj = parent.members[value]
    return obj


def _plain(obj: Any, name: str, depth: int = 0) -> dict[str, Any]:
    """``obj`` as griffe's JSON, named ``name``, without locations or docstrings; a class's
    members are its own and inherited public ones, flattened (no alias left to resolve)."""
    data = json.loads(obj.as_json(full=True))
    for key in DROP:
        data.pop(key, None)
    data["name"] = name
    data["lineno"] = 0
    data["public"] = True
    if obj.is_class:
        members: dict[str, Any] = {}
        if depth < MAX_DEPTH:
            for member_name, member in sorted(obj.all_members.items()):
                target = _final(member)
                if target is None or not _public_member(member_name, member, target):
                    continue
                members[member_name] = _plain(target, member_name, depth + 1)
        data["members"] = members
    elif "members" in data:
        data["members"] = {}
    _strip(data)
    return data


def _public_member(name: str, member: Any, target: Any) -> bool:
    if target.is_module:
        return False
    if name.startswith("__") and name.endswith("__"):
        return name in ("__init__", "__call__", "__enter__", "__exit__", "__iter__")
    return not name.startswith("_")


def _strip(data: Any) -> None:
    if isinstance(data, dict):
        for key in ("docstring", "source_link", "git_info"):
            data.pop(key, None)
        for value in data.values():
            _strip(value)
    elif isinstance(data, list):
        for value in data:
            _strip(value)


def _lazy_map(module: Any) -> dict[str, str]:
    member = module.members.get("_LAZY")
    if member is None or member.is_alias or not member.is_attribute:
        return {}
    try:
        value = ast.literal_eval(str(member.value))
    except (ValueError, SyntaxError):
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _resolve(loader: griffe.GriffeLoader, module: Any, name: str) -> Any | None:
    member = module.members.get(name)
    target = _final(member) if member is not None else None
    if target is not None:
        return target
    where = _lazy_map(module).get(name)
    if where is None:
        return None
    try:
        return _final(loader.modules_collection[f"{where}.{name}"])
    except KeyError:
        return None


def _module_surface(loader: griffe.GriffeLoader, path: str, how: str,
                    warn: list[str]) -> dict[str, Any]:
    try:
        module = loader.modules_collection[path]
    except KeyError:
        raise CheckError(f"{path}: module not found") from None
    members: dict[str, Any] = {}
    if how == "all":
        names = sorted({str(n) for n in (module.exports or ())})
        if not names:
            raise CheckError(f"{path}: no __all__ to read the public names from")
        for name in names:
            target = _resolve(loader, module, name)
            if target is None:
                warn.append(f"{path}.{name}: listed in __all__ but not found (not checked)")
            elif not target.is_module:  # public modules are surfaces of their own
                members[name] = _plain(target, name)
    else:
        for name, member in sorted(module.members.items()):
            if member.is_alias or name.startswith("_") or not member.is_public:
                continue
            members[name] = _plain(member, name)
    return {"kind": "module", "name": path, "lineno": 0, "members": members}


def _plugin_packages(root: Path) -> list[tuple[Path, str]]:
    found = []
    for init in sorted(root.glob("plugins/*/dsh_*/__init__.py")):
        if "__all__" in init.read_text(encoding="utf-8", errors="replace"):
            found.append((init.parents[1], init.parent.name))
    return found


def surface(root: Path) -> dict[str, Any]:
    """The public API of the tree at ``root``: ``{"format", "modules": {path: module}}``."""
    if not (root / "dsh" / "__init__.py").is_file():
        raise CheckError(f"{root}: no dsh/__init__.py (not a dsh source tree)")
    plugins = _plugin_packages(root)
    loader = griffe.GriffeLoader(search_paths=[str(root), *(str(p) for p, _ in plugins)])
    warn: list[str] = []
    try:
        loader.load("dsh", find_stubs_package=False, try_relative_path=False)
        for _, package in plugins:
            loader.load(package, find_stubs_package=False, try_relative_path=False)
    except (griffe.LoadingError, ModuleNotFoundError, SyntaxError) as exc:
        raise CheckError(f"{root}: griffe could not read the package: {exc}") from None
    loader.resolve_aliases(implicit=False, external=False)
    modules = {path: _module_surface(loader, path, how, warn) for path, how in CORE}
    for _, package in plugins:
        modules[package] = _module_surface(loader, package, "all", warn)
    return {"format": FORMAT, "modules": modules, "warnings": warn}


def _tree_at(ref: str, repo: Path, into: Path) -> Path:
    """The files of ``dsh/`` and ``plugins/`` at git ``ref``, extracted under ``into``
    (``git archive``: the checkout, its index and its worktrees are not touched)."""
    if ref.startswith("-"):
        raise CheckError(f"--against {ref!r}: not a git ref")
    proc = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", ref, "--",
                           "dsh", "plugins"], capture_output=True, timeout=300, check=False)
    if proc.returncode != 0:
        message = proc.stderr.decode(errors="replace").strip().splitlines()
        raise CheckError(f"--against {ref}: git archive failed: "
                         f"{message[-1] if message else proc.returncode}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            tar.extractall(into, filter="data")
        else:  # regular files and folders inside ``into`` only
            safe = [m for m in tar.getmembers() if (m.isfile() or m.isdir())
                    and not m.name.startswith("/") and ".." not in Path(m.name).parts]
            tar.extractall(into, members=safe)
    return into


def _decode(modules: dict[str, Any], where: str) -> dict[str, Any]:
    """griffe objects from a surface's modules; a damaged one is a CheckError naming it."""
    try:
        decoded = json.loads(json.dumps(modules), object_hook=griffe.json_decoder)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckError(f"{where}: a damaged API dump ({type(exc).__name__}: {exc})") from None
    if not isinstance(decoded, dict) or not all(
            isinstance(m, griffe.Module) for m in decoded.values()):
        raise CheckError(f"{where}: a damaged API dump (a module that is not a module)")
    return decoded


# -------------------------------------------------------------------------------- changelog


def announced(changelog: str) -> set[str]:
    """Dotted paths named in backticks under Changed / Removed / Deprecated of Unreleased."""
    paths: set[str] = set()
    in_unreleased = False
    heading = ""
    for line in changelog.splitlines():
        if line.startswith("## "):
            in_unreleased = line[3:].strip().lower().startswith("[unreleased]")
            heading = ""
            continue
        if not in_unreleased:
            continue
        if line.startswith("### "):
            heading = line[4:].strip().lower()
            continue
        if heading in ANNOUNCING:
            for span in re.findall(r"`([^`]+)`", line):
                paths.update(re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+", span))
    return paths


def is_announced(path: str, paths: set[str]) -> bool:
    return any(path == p or path.startswith(p + ".") or path.startswith(p + "(")
               for p in paths)


# -------------------------------------------------------------------------------- compare


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, griffe.Parameter):
        text = value.name if value.annotation is None else f"{value.name}: {value.annotation}"
        text = text if value.default is None else f"{text} = {value.default}"
        return f"{text} ({value.kind.value})"
    if isinstance(value, griffe.Kind):
        return value.value
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(getattr(value, "path", value))


def _path(breakage: griffe.Breakage, module: str) -> str:
    path = breakage.obj.path
    path = path if path == module or path.startswith(module + ".") else f"{module}.{path}"
    param = breakage.old_value if isinstance(breakage.old_value, griffe.Parameter) else \
        breakage.new_value if isinstance(breakage.new_value, griffe.Parameter) else None
    return f"{path}({param.name})" if param is not None else path


def breakages(old: dict[str, Any], new: dict[str, Any],
              where: str = "the baseline") -> Iterator[tuple[str, str, str, str]]:
    """``(path, kind, old, new)`` for each break from surface ``old`` to surface ``new``."""
    old_modules, new_modules = _decode(old["modules"], where), _decode(new["modules"], "ROOT")
    for name, old_module in old_modules.items():
        new_module = new_modules.get(name)
        if new_module is None:
            yield name, "module removed", name, "(none)"
            continue
        for b in griffe.find_breaking_changes(old_module, new_module):
            if name == "dsh.hookspecs" and b.kind in HOOK_COMPATIBLE and \
                    b.obj.path.count(".") == name.count(".") + 1:
                continue
            yield _path(b, name), b.kind.value, _show(b.old_value), _show(b.new_value)


def last_baseline(api: Path) -> Path:
    def key(p: Path) -> tuple[int, ...]:
        digits = re.findall(r"\d+", p.stem.partition("-")[2])
        return tuple(int(d) for d in digits)

    found = sorted(api.glob("dsh-*.json"), key=key)
    if not found:
        raise CheckError(f"{api}: no baseline (dsh-X.Y.Z.json); give --against REF")
    return found[-1]


def read_baseline(path: Path, shown: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckError(f"{shown}: cannot read the baseline: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or \
            not isinstance(data.get("modules"), dict):
        raise CheckError(f"{shown}: not an API baseline of format {FORMAT}")
    return data


def _shown_path(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/api_check.py", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to check")
    parser.add_argument("--against", metavar="REF",
                        help="compare with git REF (tag or commit) instead of the baseline")
    parser.add_argument("--baseline", type=Path,
                        help="baseline JSON (default: the newest api/dsh-*.json)")
    parser.add_argument("--changelog", type=Path, help="default: ROOT/CHANGELOG.md")
    parser.add_argument("--dump", type=Path, metavar="FILE",
                        help="write the API (of --against REF if given, else of ROOT) to FILE")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        with tempfile.TemporaryDirectory(prefix="dsh-api-") as tmp:
            if args.dump:
                tree = _tree_at(args.against, root, Path(tmp)) if args.against else root
                data = surface(tree)
                data.pop("warnings")
                args.dump.parent.mkdir(parents=True, exist_ok=True)
                args.dump.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n",
                                     encoding="utf-8")
                print(f"{args.dump}: {sum(len(m['members']) for m in data['modules'].values())}"
                      f" public names in {len(data['modules'])} modules")
                return 0
            if args.against:
                old = surface(_tree_at(args.against, root, Path(tmp)))
                against = args.against
            else:
                baseline = args.baseline or last_baseline(root / "api")
                against = _shown_path(baseline, root)
                old = read_baseline(baseline, against)
            new = surface(root)
            changelog_path = args.changelog or root / "CHANGELOG.md"
            try:
                changelog = changelog_path.read_text(encoding="utf-8")
            except OSError as exc:
                raise CheckError(f"{changelog_path}: {exc.strerror or exc}") from None
            found = list(breakages(old, new, against))
    except CheckError as exc:
        print(f"api_check: error: {exc}", file=sys.stderr)
        return 2
    for line in new["warnings"]:
        print(f"api_check: warning: {line}", file=sys.stderr)
    paths = announced(changelog)
    unannounced = [b for b in found if not is_announced(b[0], paths)]
    for path, kind, before, after in unannounced:
        print(f"{path}: {kind}: {before} -> {after}", file=sys.stderr)
    if unannounced:
        print(f"api_check: {len(unannounced)} breaking change(s) against {against} not "
              f"announced: name each path in backticks under ### Changed, ### Removed or "
              f"### Deprecated of CHANGELOG.md's [Unreleased]", file=sys.stderr)
        return 1
    print(f"api_check: ok against {against} ({len(found)} announced breaking change(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
