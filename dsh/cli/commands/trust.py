"""``dsh trust``: which project files that shape execution the person has approved, by content
(dsh/config/trust.py; docs/security.md, "Workspace trust").

``approve`` shows what it approves and records the SHA-256 of the bytes it read (one read, by
descriptor, a symbolic link refused); ``list`` shows each record and whether the file on disk
still has those bytes; ``revoke`` forgets.
"""

from __future__ import annotations

import os

import click

from dsh.cli.shared import warn

#: What a file is, by where it lies (for the record and the messages).
_KINDS = ((".mcp.json", "mcp"), ("settings.json", "hooks"), ("settings.local.json", "hooks"))


def kind_for(path: str) -> str:
    name = os.path.basename(path)
    for suffix, kind in _KINDS:
        if name == suffix:
            return kind
    parent = os.path.basename(os.path.dirname(path))
    if name == "plugin.json" and parent == ".claude-plugin" or (
            name == "hooks.json" and parent == "hooks"):
        return "plugin"
    if parent == "agents" and name.endswith(".md"):
        return "agent"
    if parent == "commands" and name.endswith(".md"):
        return "command"
    if name.lower() in ("claude.md", "agents.md", "claude.local.md"):
        return "instructions"
    return "file"


def _read(path: str) -> tuple[str, str, bytes]:
    from dsh.config.trust import CAP
    from dsh.core import beneath
    from dsh.core import files
    from dsh.core.errors import UsageError

    full = os.path.abspath(path)
    folder, name = os.path.split(full)
    try:
        data = beneath.read(folder, name, CAP)
    except beneath.Refused as exc:
        raise UsageError(f"{path}: not approved: {exc.why}") from None
    except files.NotRegular as exc:
        raise UsageError(f"{path}: not approved: it is {exc.kind}, not a regular file") from None
    except files.TooLarge:
        raise UsageError(f"{path}: not approved: larger than {CAP} bytes") from None
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {files.reason(exc)}") from None
    return folder, name, data


@click.group()
def trust() -> None:
    """Approve project files that shape what dsh runs (.mcp.json, hooks, agent files, ...).

    Such a file takes effect only while its bytes are the ones approved: one changed since (by
    a command, a model, a git pull) is not used until approved again. Records are kept in
    dsh's own config directory, never in the project.
    """


@trust.command("approve")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--kind", default=None, help="What the file is (mcp, hooks, agent, command, "
              "memory, plugin, instructions); guessed from its name by default.")
def trust_approve(paths: tuple[str, ...], kind: str | None) -> None:
    """Trust the current content of each of PATHS."""
    from dsh.config import trust as store
    from dsh.core.escape import escape_controls

    for path in paths:
        folder, name, data = _read(path)
        what = kind or kind_for(os.path.join(folder, name))
        store.approve(folder, name, store.digest(data), what)
        key = store.key_of(folder, name)
        warn(f"trusted {escape_controls(key, newlines=False)} ({what}, sha256 "
             f"{store.digest(data)[:12]}…, {len(data)} bytes)")


@trust.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def trust_list(as_json: bool) -> None:
    """Each approved file: whether its bytes on disk are still the approved ones."""
    import json

    from dsh.config import trust as store
    from dsh.core import beneath
    from dsh.core.escape import escape_controls

    for key, rec in sorted(store.load().items()):
        folder, name = os.path.split(key)
        try:
            data = beneath.read(folder, name, store.CAP)
            now = "trusted" if store.digest(data) == rec.get("sha256") else "changed"
        except FileNotFoundError:
            now = "missing"
        except OSError:
            now = "unreadable"
        if as_json:
            click.echo(json.dumps({"path": key, **rec, "state": now}, ensure_ascii=False))
        else:
            click.echo(f"{now:<10} {rec.get('kind', 'file'):<12} "
                       f"{escape_controls(key, newlines=False)}")


@trust.command("revoke")
@click.argument("paths", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--all", "under", flag_value=".", default=None,
              help="Forget every record under the current directory.")
def trust_revoke(paths: tuple[str, ...], under: str | None) -> None:
    """Forget the approval of PATHS (or, with --all, of every file under this directory)."""
    from dsh.config import trust as store
    from dsh.core.errors import UsageError
    from dsh.core.escape import escape_controls

    if not paths and under is None:
        raise UsageError("name the files to forget, or give --all")
    keys = [os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(p))),
                         os.path.basename(p)) for p in paths]
    gone = store.revoke(keys, under=os.path.abspath(under) if under else None)
    for key in keys:
        if key not in gone:
            warn(f"{escape_controls(key, newlines=False)} was not trusted")
    for key in gone:
        warn(f"no longer trusted: {escape_controls(key, newlines=False)}")
