"""``dsh install`` / ``dsh uninstall``: pip into the environment dsh runs in (issue 11).

As ``llm install`` does, pip is run as ``sys.executable -m pip``, so a dsh installed with pipx
or ``uv tool`` gets its plugins in its own environment. pip's output goes to stderr; stdout
gets only dsh's report.

After ``install``, the plugins that appeared or changed (the ``dsh`` entry points before and
after, and those of the distributions named on the command line) are loaded in a *fresh*
interpreter (:func:`probe`): this process has the old versions imported, and a plugin that
crashes its interpreter at import must not take ``dsh`` with it. The report says what each
registered — hooks, tools, model prefixes, commands — or the error it failed with: the
plugin's name and distribution, the exception, and exit code 1.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from dsh.cli.shared import State
from dsh.cli.shared import pass_state
from dsh.cli.shared import warn
from dsh.core import errors

#: The name at the start of a requirement (``dsh-foo>=1``, ``dsh_foo[extra]``); paths and
#: URLs are recognised by :func:`requirement_name` and give none.
_REQ_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: How long the fresh interpreter may take to import and register the new plugins.
PROBE_TIMEOUT = 120.0


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): ``Dsh_Foo`` → ``dsh-foo``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(arg: str) -> str | None:
    """The distribution a pip argument names, or ``None`` for a path, URL or wheel file."""
    if "/" in arg or "\\" in arg or arg.startswith(".") or arg.endswith((".whl", ".zip",
                                                                         ".tar.gz")):
        return None
    m = _REQ_NAME.match(arg)
    return canonical(m.group(0)) if m else None


def not_options(packages: tuple[str, ...]) -> None:
    """Refuse a PKG that pip would read as an option (``--index-url=URL``, ``-r FILE``, what
    ``dsh install -- ARG`` or a script's ``dsh install "$NAME"`` could pass): dsh passes
    packages to pip, and its own options only."""
    for pkg in packages:
        if pkg.startswith("-"):
            raise click.UsageError(f"PKG {pkg[:80]!r} is not a package (it starts with '-', "
                                   "so pip would take it as an option); give pip's options to "
                                   "pip itself: python -m pip ...")


def snapshot() -> dict[str, tuple[str, str]]:
    """``{entry point name: (value, distribution)}`` of the ``dsh`` group, read from disk now
    (no cache: called again after pip, in the same process)."""
    from dsh.host.manager import ENTRY_POINT_GROUP
    from dsh.host.manager import entry_points

    return {name: (value, str(getattr(dist, "_path", dist)))
            for name, value, dist in entry_points(ENTRY_POINT_GROUP)}


def run_pip(args: list[str]) -> int:
    """``sys.executable -m pip ARGS``, its stdout sent to our stderr; its exit code."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("pip") is None:
        raise errors.DshError(
            f"pip is not installed in dsh's environment ({sys.executable}); install it there "
            "(python -m ensurepip), or add the plugin the way that environment was made "
            "(uv tool install --with PKG dsh-agents)")
    cmd = [sys.executable, "-m", "pip", *args]
    try:
        out: Any = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stderr (CliRunner)
        out = None
    if out is not None:
        return subprocess.run(cmd, stdout=out, check=False).returncode
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    click.echo(proc.stdout.decode("utf-8", "replace"), err=True, nl=False)
    return proc.returncode


@click.command()
@click.argument("packages", metavar="PKG...", nargs=-1)
@click.option("-U", "--upgrade", is_flag=True, help="Upgrade the packages to the newest version.")
@click.option("-e", "--editable", "editable", multiple=True, metavar="PATH",
              help="Install the project at PATH in editable mode (repeatable).")
@click.option("--force-reinstall", is_flag=True, help="Reinstall even when up to date.")
@click.option("--no-cache-dir", is_flag=True, help="Do not use pip's cache.")
@click.option("--pre", is_flag=True, help="Include pre-release versions.")
@pass_state
def install(state: State, packages: tuple[str, ...], upgrade: bool, editable: tuple[str, ...],
            force_reinstall: bool, no_cache_dir: bool, pre: bool) -> None:
    """Install plugins (PKG: a name, a requirement, a path) into dsh's own environment.

    Runs `python -m pip install` with the interpreter dsh runs on, then loads the new plugins
    in a fresh process and prints what each registers: hooks, tools, models, commands. A
    plugin that fails to load is named with its error, and the exit code is 1.
    """
    if not packages and not editable:
        raise click.UsageError("nothing to install: give PKG or -e PATH")
    not_options(packages)
    args = ["install"]
    args += ["--upgrade"] * upgrade + ["--force-reinstall"] * force_reinstall
    args += ["--no-cache-dir"] * no_cache_dir + ["--pre"] * pre
    for path in editable:
        args += ["--editable", path]
    args += list(packages)
    before = snapshot()
    code = run_pip(args)
    if code != 0:
        raise errors.DshError(f"pip install failed (exit {code}); nothing was changed by dsh")
    after = snapshot()
    named = {n for n in map(requirement_name, packages) if n}
    changed = sorted(n for n, v in after.items() if before.get(n) != v)
    rows = probe(state, changed, named)
    if not rows:
        warn("installed; no new or changed dsh plugin (the packages have no `dsh` entry "
             "point, or were already installed)")
        return
    text = report_text(rows)
    if sys.stdout.isatty():  # names and errors come from the plugin: controls made visible
        from dsh.cli.escape import escape_controls

        text = escape_controls(text)
    click.echo(text)
    failed = [r for r in rows if r["error"]]
    if failed:
        from dsh.core.redact import redact

        for r in failed:
            warn(redact(f"error: plugin {r['label']} failed to load: {r['error']}"))
        click.get_current_context().exit(errors.EXIT_ERROR)


@click.command()
@click.argument("packages", metavar="PKG...", nargs=-1, required=True)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def uninstall(packages: tuple[str, ...], yes: bool) -> None:
    """Uninstall packages from dsh's own environment (`python -m pip uninstall`).

    Says which dsh plugins went with them.
    """
    not_options(packages)
    if not yes and not _stdin_is_terminal():
        # pip would ask "Proceed (Y/n)?" and end with a traceback on the closed input
        raise click.UsageError("dsh uninstall asks before removing anything and stdin is "
                               "not a terminal: pass -y/--yes to uninstall without asking "
                               f"({' '.join(packages)}); nothing was uninstalled")
    before = snapshot()
    code = run_pip(["uninstall", *(["--yes"] if yes else []), *packages])
    if code != 0:
        raise errors.DshError(f"pip uninstall failed (exit {code})")
    after = snapshot()
    gone = sorted(n for n in before if n not in after)
    for name in gone:
        click.echo(f"removed plugin {name}")
    if not gone:
        warn("uninstalled; no dsh plugin was removed")


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):  # closed
        return False


# -- loading the new plugins in a fresh interpreter ---------------------------------------------


def probe(state: State, names: list[str], dists: set[str]) -> list[dict[str, Any]]:
    """Run :func:`probe_main` in a fresh interpreter for the plugins ``names`` and those of
    the distributions ``dists``; its rows (see :func:`describe`)."""
    import json
    import os
    import subprocess
    import tempfile

    fd, out = tempfile.mkstemp(prefix="dsh-probe-", suffix=".json")
    os.close(fd)
    try:
        argv = [sys.executable, "-c",
                "from dsh.cli.commands.install import probe_main; probe_main()",
                out, str(state.config_path or ""), ",".join(names), ",".join(sorted(dists))]
        env = dict(os.environ)
        env.pop("DSH_LOAD_PLUGINS", None)  # the new plugins are loaded whatever it allows
        try:
            proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  timeout=PROBE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise errors.DshError(f"loading the new plugins took more than {PROBE_TIMEOUT:g}s "
                                  f"({', '.join(names)}): they are installed") from None
        try:
            with open(out, encoding="utf-8") as f:
                data = f.read()
        except OSError:
            data = ""
        if proc.returncode != 0 or not data:
            tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            from dsh.core.redact import redact

            raise errors.DshError(
                f"loading the new plugins ({', '.join(names) or ', '.join(sorted(dists))}) "
                f"ended the interpreter with exit code {proc.returncode}"
                + (f": {redact(' | '.join(tail))}" if tail else "")
                + "; they are installed (dsh uninstall PKG removes them)")
        result = json.loads(data)
        if isinstance(result, dict):
            raise errors.DshError(f"checking the new plugins: {result['fatal']}; they are "
                                  "installed")
        rows: list[dict[str, Any]] = result
        return rows
    finally:
        os.unlink(out)


def probe_main() -> None:
    """The fresh interpreter's side: ``OUT CONFIG NAMES DISTS`` in ``sys.argv``; writes the
    rows as JSON to OUT."""
    import json

    from dsh.core.errors import DshError

    out, config, names, dists = sys.argv[1:5]
    result: Any
    try:
        result = describe(config or None, [n for n in names.split(",") if n],
                          {d for d in dists.split(",") if d})
    except DshError as exc:  # the config cannot be read, a strict plugin failed…
        result = {"fatal": str(exc)}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)


def describe(config: str | None, names: list[str], dists: set[str]) -> list[dict[str, Any]]:
    """Load the config's app and describe the plugins ``names`` and those of ``dists``: one
    row each with ``name``, ``label``, ``dist``, ``version``, ``error`` and what it registers
    (``hooks``, ``tools``, ``models``, ``commands``). A registration hook that raises is that
    plugin's error."""
    import attrs

    from dsh.config.loader import load_config
    from dsh.core.errors import DshError
    from dsh.run.app import App

    cfg = load_config(config)
    # The new plugins are looked at even where the config would not load them.
    app = App(attrs.evolve(cfg, autoload=True, disable=[d for d in cfg.disable
                                                        if d not in names]))
    chosen = [r for r in app.plugins
              if r.name in names or (r.dist and canonical(r.dist) in dists)]
    rows = []
    for rec in chosen:
        row: dict[str, Any] = {"name": rec.name, "label": rec.label, "dist": rec.dist,
                               "version": rec.version, "error": rec.error, "hooks": [],
                               "tools": [], "models": [], "commands": []}
        rows.append(row)
        if rec.error:
            continue
        try:
            pm = app.pm
            obj = pm.get_plugin(rec.name)
            row["hooks"] = sorted(h.name for h in pm.get_hookcallers(obj) or ()) if obj else []
            row.update(registrations(app, rec.name))
        except DshError as exc:
            row["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - whatever a plugin raises is its report
            row["error"] = f"{type(exc).__name__}: {exc}"
    return rows


def registrations(app: Any, plugin: str) -> dict[str, list[str]]:
    """The tools, model prefixes and commands that ``plugin``'s registration hooks add, each
    hook implementation called on its own (a failure names this plugin and the hook)."""
    from dsh.host.manager import call_impl
    from dsh.tools.registry import build_tool

    found: dict[str, list[str]] = {"tools": [], "models": [], "commands": []}
    hook = app.pm.hook

    def impls(name: str) -> list[Any]:
        return [i for i in getattr(hook, name).get_hookimpls() if i.plugin_name == plugin]

    tool_impls = impls("register_tools")
    if tool_impls:
        info = app.agent().info  # the default agent's handle, as `dsh tools` would pass it
        for impl in tool_impls:
            call_impl(impl, "register_tools", agent=info,
                      register=lambda fn, **o: found["tools"].append(
                          build_tool(fn, plugin=plugin, **o).name))
    for impl in impls("register_models"):
        call_impl(impl, "register_models",
                  register=lambda prefix, *a, **k: found["models"].append(f"{prefix}:"))
    for impl in impls("register_commands"):
        scratch = click.Group("dsh")
        call_impl(impl, "register_commands", cli=scratch)
        found["commands"] += sorted(scratch.commands)
    return found


def report_text(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        lines.append(f"plugin {r['label']}" + (": failed to load" if r["error"] else ""))
        for key in ("hooks", "tools", "models", "commands"):
            if r[key]:
                lines.append(f"  {key}: {', '.join(r[key])}")
        if not r["error"] and not any(r[k] for k in ("hooks", "tools", "models", "commands")):
            lines.append("  registers nothing")
    return "\n".join(lines)
