"""The checks of ``dsh doctor`` (:mod:`dsh.cli.commands.doctor`), in the order they print.

Each check is a dict ``{check, status, message, fix}``: ``status`` is ``ok``, ``warning`` or
``fail``; ``fix`` (failures and warnings) is a command to run or the config key to set. No
check prints a key, writes a file or, unless ``check_models``, sends a request.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from dsh.cli.shared import State

Check = dict[str, Any]


def _c(check: str, status: str, message: str, fix: str | None = None) -> Check:
    return {"check": check, "status": status, "message": message, "fix": fix}


def run_checks(state: State, *, check_models: bool = False) -> list[Check]:
    """Every check; a config that does not load stops the ones that need it."""
    from dsh.config.loader import load_config
    from dsh.core.errors import DshError

    path = state.config_file()
    out: list[Check] = []
    try:
        cfg = load_config(state.config_path)
    except DshError as exc:
        out.append(_c("config", "fail", str(exc), _config_fix(str(exc), path)))
        cfg = None
    else:
        out.append(_c("config", "ok", f"{path}" if path.exists()
                      else f"no file at {path}: the defaults apply (`dsh config init` writes "
                           "a commented starter)"))
    _key_store(out)
    if cfg is not None:
        from dsh.run.app import App

        app = App(cfg)
        plugins_ok = _plugins(app, out)
        if plugins_ok:
            models = _agents(app, path, out)
            _models(app, path, models, out, check_models)
        _sessions(app, out)
    _sandbox(out)
    return out


#: Config errors whose "did you mean" is the value to set: a base_url without its scheme, the
#: default agent misspelt.
_SETTABLE = re.compile(r"key '([^']+)': (?:expected an http\(s\) URL|unknown agent).*?"
                       r"did you mean '([^']+)'\?")


def _config_fix(message: str, path: Path) -> str:
    """The command that fixes a config error when the error names the value, else where to
    look; the other checks need a config that loads."""
    m = _SETTABLE.search(message)
    fix = (f"dsh config set '{m.group(1)}' '{m.group(2)}'" if m
           else f"edit {path} (`dsh config validate` checks it)")
    return fix + ", then run `dsh doctor` again for the checks that need the config"


# -- plugins ---------------------------------------------------------------------------------


def _plugins(app: Any, out: list[Check]) -> bool:
    """One line per plugin that failed to import or register; one ok line for the rest.
    False when the plugin manager could not be built at all (strict_plugins)."""
    from dsh.core.errors import DshError

    try:
        _ = app.pm  # imports and registers every plugin, as any command does
    except DshError as exc:
        out.append(_c("plugins", "fail", str(exc),
                      "reinstall or remove the plugin (`dsh uninstall DIST`), or add it to "
                      "`disable = [...]`"))
        return False
    loaded = []
    for rec in app.plugins:
        if rec.error:
            fix = (f"`pip install --force-reinstall {rec.dist}` or `dsh uninstall {rec.dist}`"
                   if rec.dist else f"fix the module or remove {rec.name!r} from `load`")
            out.append(_c(f"plugin {rec.name}", "fail", f"{rec.label} failed to load: "
                          f"{rec.error}", fix + f"; or add {rec.name!r} to `disable = [...]`"))
        else:
            loaded.append(rec.name)
    out.append(_c("plugins", "ok", f"{len(loaded)} loaded" + (f": {', '.join(loaded)}"
                                                              if loaded else "")))
    for note in app.notes:
        out.append(_c("plugins", "warning", note))
    return True


# -- agents and models -----------------------------------------------------------------------


def _agents(app: Any, path: Path, out: list[Check]) -> list[str]:
    """Assemble every agent (as ``dsh config validate`` does); return the model ids to check:
    the agents', then the other ``[models.ID]`` tables."""
    from dsh.core.errors import DshError

    ids: list[str] = []
    names = app.config.agent_names()
    bad = 0
    try:
        app.agent()  # the config's `agent`, which may name no agent at all
    except DshError as exc:
        if app.config.agent not in names:
            bad += 1
            out.append(_c(f"agent {app.config.agent}", "fail", str(exc),
                          _config_fix(str(exc), path).partition(", then")[0]
                          if "did you mean" in str(exc) else
                          f"add [agents.{_key(app.config.agent)}] or fix `agent` in {path}"))
    for name in names:
        try:
            agent = app.agent(name)
        except DshError as exc:
            bad += 1
            out.append(_c(f"agent {name}", "fail", str(exc),
                          f"fix [agents.{_key(name)}] in {path} (`dsh agents` lists them)"))
            continue
        if agent.model_id not in ids:
            ids.append(agent.model_id)
    if not bad:
        out.append(_c("agents", "ok", f"{len(names)} assembled: {', '.join(names)}"))
    return ids + [m for m in app.config.models if m not in ids]


def _key(name: str) -> str:
    """``name`` as one segment of a dotted TOML key (quoted unless bare)."""
    import re

    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _models(app: Any, path: Path, ids: list[str], out: list[Check], check: bool) -> None:
    used: dict[str, str] = {}  # model id -> the config key that chose it
    for n in app.config.agent_names():
        if _assembles(app, n):
            own = getattr(app.config.agents.get(n), "model", None)
            used.setdefault(app.agent(n).model_id,
                            f"agents.{_key(n)}.model" if own else "model")
    for model_id in ids:
        where = f"model {model_id}"
        model = _build(app, path, model_id, used.get(model_id), out)
        if model is None:
            continue
        if _key_line(model, where, out, model_id in used) and check:
            out.append(_reach(model, where, f"models.{_key(model_id)}"))


def _assembles(app: Any, name: str) -> bool:
    from dsh.core.errors import DshError

    try:
        app.agent(name)
    except DshError:
        return False
    return True


def _build(app: Any, path: Path, model_id: str, used: str | None, out: list[Check]) -> Any:
    """The adapter for ``model_id`` without its key check, or None (with a line saying why)."""
    from dsh.core.errors import DshError

    where = f"model {model_id}"
    entry, prefix, name, settings = app.adapter_entry(model_id)
    table = f'models.{_key(model_id)}'
    if entry is None:
        from dsh.run.model_names import suggestions

        near = suggestions(model_id, app.config.models, app.models)
        if not used and "adapter" not in settings:  # settings for ids that start with it
            fix = (f'rename [{table}] to [models.{_key(near[0])}]' if near else
                   f'add `adapter = "openai"` (or another) to [{table}] to make it an alias')
            out.append(_c(where, "warning",
                          f"no adapter {prefix!r} serves it: its settings apply to no model",
                          fix))
        else:
            hint = f"did you mean {' or '.join(near)}? " if near else ""
            out.append(_c(where, "fail", f"unknown model: no adapter {prefix!r}",
                          f"{hint}dsh config set {used or 'model'} "
                          f"{near[0] if near else 'PREFIX:NAME'} (`dsh models` lists the "
                          "adapters)"))
        return None
    base = settings.get("base_url")
    if isinstance(base, str) and base.strip() and "://" not in base:
        out.append(_c(where, "fail", f"base_url {base!r} is broken: it has no scheme",
                      f"dsh config set '{table}.base_url' 'http://{base.strip()}'"))
        return None
    try:
        return entry.build(name, settings)
    except DshError as exc:
        env_base = getattr(entry, "prefix", "") == "openai" and os.environ.get("OPENAI_BASE_URL")
        fix = ("set OPENAI_BASE_URL to an http(s) URL (http://HOST:PORT/v1)" if env_base
               and "base_url" in str(exc) else f"fix [{table}] in {path}")
        out.append(_c(where, "fail", str(exc), fix))
        return None


def _key_line(model: Any, where: str, out: list[Check], used: bool) -> bool:
    """Whether the model's API key is found, and where from — never the key. A missing key
    fails for a model an agent uses, and is a warning for one only ``-m`` would pick."""
    from dsh.core.errors import DshError

    api_key = getattr(model, "api_key", None)
    if not callable(api_key):
        try:
            model.check()
        except DshError as exc:
            out.append(_c(where, "fail", str(exc), "see docs/models.md"))
            return False
        out.append(_c(where, "ok", "no API key needed"))
        return True
    env = str(model.settings.get("api_key_env") or getattr(model, "default_key_env", ""))
    name = getattr(model, "key_name", "NAME")
    try:
        key = api_key()
    except DshError:
        out.append(_c(where, "fail" if used else "warning",
                      f"no API key: {env} is not set and no key {name!r} is stored"
                      + ("" if used else " (no agent uses this model)"),
                      f"export {env}=… or run `dsh keys set {name}`"))
        return False
    try:
        model.check()
    except DshError as exc:
        out.append(_c(where, "fail", str(exc),
                      f"set {env} again or run `dsh keys set {name}` (the key is not shown)"))
        return False
    shown = getattr(model, "shown_base_url", "")
    if key is None:
        out.append(_c(where, "ok", f"no API key needed (a local server: {shown})"))
    else:
        out.append(_c(where, "ok", f"API key from {model.key_source}"
                      + (f"; {shown}" if shown else "")))
    return True


#: The smallest answer each built-in HTTP adapter can be asked for.
TINY: dict[str, dict[str, Any]] = {
    "openai": {"max_tokens": 1},
    "anthropic": {"max_tokens": 1},
    "openai-responses": {"max_output_tokens": 16},
}


def _reach(model: Any, where: str, table: str) -> Check:
    """One tiny request (``ping``, an answer of a token or so), no retries."""
    from dsh.core.errors import DshError
    from dsh.core.errors import ProviderError

    shown = getattr(model, "shown_base_url", None)
    if shown is None:
        return _c(where, "ok", "not a network model: nothing to reach")
    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.llm import transport

    settings = {**model.settings, "retries": 0, "timeout": 60.0, "connect_timeout": 10.0}
    try:
        probe = type(model)(model.name, settings)
        options = {**probe.default_options(), **TINY.get(getattr(probe, "provider", ""), {})}
        request = ModelRequest(model=probe.effective_id or model.name,
                               messages=(Message(role="user", content="ping"),),
                               options=options)
        transport.send(request, None, model=probe)
    except ProviderError as exc:
        if exc.status is None:
            return _c(where, "fail", f"unreachable: {exc}",
                      f"start the server, or fix the base_url: dsh config set "
                      f"'{table}.base_url' URL")
        if exc.status in (401, 403):
            return _c(where, "fail", f"reachable, but the key was refused: {exc}",
                      "store the right key (`dsh keys set NAME`) or fix the variable")
        if exc.status == 404:
            return _c(where, "fail", f"reachable, but not found: {exc}",
                      "check the model name and the base_url (most servers end in /v1)")
        return _c(where, "warning", f"reachable, but the request failed: {exc}")
    except DshError as exc:
        return _c(where, "fail", f"cannot send: {exc}")
    return _c(where, "ok", f"reachable at {shown}")


# -- keys, sessions, sandbox -----------------------------------------------------------------


def _key_store(out: list[Check]) -> None:
    from dsh.core.errors import DshError

    try:
        from dsh.config.keys import store

        where = store().where()
    except DshError as exc:
        out.append(_c("keys", "fail", str(exc), "the message names the fix (chmod …)"))
        return
    out.append(_c("keys", "ok", f"stored keys (`dsh keys`) are kept in {where}"))


def _sessions(app: Any, out: list[Check]) -> None:
    """Where sessions go and the state of the session index — read only, never rebuilt."""
    from dsh.core.errors import DshError

    try:
        store = app.store
    except DshError as exc:
        out.append(_c("sessions", "fail", str(exc), "re-enable dsh.ledger or install a store"))
        return
    directory = getattr(store, "directory", None)
    if directory is None:
        out.append(_c("sessions", "ok", f"stored by {type(store).__module__}"))
        return
    directory = Path(directory)
    if not directory.exists():
        out.append(_c("sessions", "ok", f"none yet; {directory} is made by the first run"))
        return
    if not os.access(directory, os.W_OK | os.X_OK):
        out.append(_c("sessions", "fail", f"cannot write sessions to {directory}",
                      f"chmod u+rwx {directory}, or set `sessions_dir`"))
        return
    try:
        count = sum(1 for _ in directory.glob("*.jsonl"))
    except OSError as exc:
        out.append(_c("sessions", "fail", f"cannot list {directory}: {exc}",
                      f"chmod u+rx {directory}"))
        return
    out.append(_c("sessions", "ok", f"{count} in {directory}"))
    out.append(_index(directory / ".index" / "sessions.sqlite3"))


def _index(path: Path) -> Check:
    import sqlite3

    from dsh.ledger.index import VERSION

    rebuild = "`dsh sessions list` rebuilds it from the ledgers (or delete the file)"
    if not path.exists():
        return _c("session index", "ok", "not built yet: the next `dsh sessions list` builds it")
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=2)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            rows = conn.execute("SELECT count(*) FROM sessions").fetchone()[0] if version else 0
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return _c("session index", "warning", f"{path} cannot be read ({exc})", rebuild)
    if version != VERSION:
        return _c("session index", "warning",
                  f"{path}: version {version}, this dsh uses {VERSION}", rebuild)
    return _c("session index", "ok", f"version {version}, {rows} sessions ({path})")


def _sandbox(out: list[Check]) -> None:
    from dsh.sandbox.spawn import check

    info = check()
    if info.get("backend"):
        out.append(_c("sandbox", "ok", f"{info['backend']}: commands are confined"
                      + (f"; launcher: {info['launcher']}" if info.get("launcher") != "ok"
                         else "")))
    else:
        out.append(_c("sandbox", "warning",
                      f"no backend ({info.get('why')}): sandboxed tools refuse to run",
                      '`dsh sandbox check` says why; policy = "off" in [sandbox] runs them '
                      "unconfined (docs/security.md)"))
