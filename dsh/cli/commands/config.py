"""``dsh config``: locate, show, create, change and check the config file.

Imported on demand by :class:`dsh.cli.root.DshGroup`; reading and checking are :mod:`dsh.config`,
editing is :mod:`dsh.config.edit`.
"""

from __future__ import annotations

import click

from dsh.cli.shared import State
from dsh.cli.shared import pass_state
from dsh.cli.shared import warn


@click.group()
def config() -> None:
    """Locate, show, create, change and check the config file."""


@config.command("path")
@pass_state
def config_path(state: State) -> None:
    """Print the config file's path (it may not exist yet)."""
    click.echo(str(state.config_file()))


@config.command("show")
@pass_state
def config_show(state: State) -> None:
    """Print the effective configuration (defaults included) as TOML.

    Secrets are shown as "[redacted]": api_key and other credential-like keys, secret header
    values, and the credentials in URLs (docs/config.md).
    """
    import tomli_w

    from dsh.config.edit import effective
    from dsh.config.loader import load_config
    from dsh.core.redact import redact_settings

    path = state.config_file()
    cfg = load_config(state.config_path)
    click.echo(f"# {path}{'' if path.exists() else ' (not found: defaults)'}")
    click.echo(tomli_w.dumps(redact_settings(effective(cfg))), nl=False)


@config.command("init")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@pass_state
def config_init(state: State, force: bool) -> None:
    """Write a commented starter config file."""
    from dsh.config.edit import init_config

    warn(f"wrote {init_config(state.config_file(), force=force)}")


@config.command("set", context_settings={"ignore_unknown_options": True})
@click.argument("key")
@click.argument("value")
@pass_state
def config_set(state: State, key: str, value: str) -> None:
    """Set KEY (dotted: agents.coder.model) to VALUE (a TOML value, else a string).

    The whole file is validated before it is written. The file is edited in place: comments,
    order and layout are kept and only KEY's line changes (a new key goes after the last key of
    its table, a new table at the end). A symbolic link is written through; VALUE may start
    with "-" (-1).
    """
    from dsh.config.edit import set_value

    path = state.config_file()
    dropped = set_value(path, key, value)
    warn(f"set {key} in {path}" + (" (its comments were not kept)" if dropped else ""))


@config.command("unset")
@click.argument("key")
@pass_state
def config_unset(state: State, key: str) -> None:
    """Remove KEY (dotted: agents.coder.model, or a whole table: models.local) from the file.

    Everything else is kept as written; a table left empty is removed too. A KEY that is not
    set is an error (exit 2); the result is validated before it is written.
    """
    from dsh.config.edit import unset_value

    path = state.config_file()
    unset_value(path, key)
    warn(f"removed {key} from {path}")


@config.command("validate")
@pass_state
def config_validate(state: State) -> None:
    """Check the config file and assemble every agent; print "ok: FILE" or fail with 2.

    Beyond reading the file (keys, types, names): the default agent (`agent = …`) must exist,
    every agent is assembled (its plugins, tools, sub-agents, model adapter) and every model of
    a built-in adapter is built from its settings, without a request or a key lookup.
    """
    from dsh.config.loader import load_config
    from dsh.core.errors import ConfigError

    path = state.config_file()
    load_config(path, required=True)
    app = state.app
    app.agent()  # the config's `agent = …`, once plugins have registered their agents
    model_ids: dict[str, None] = {}
    for name in app.config.agent_names():
        a = app.agent(name)
        entry = app.adapter_entry(a.model_id)[0]
        if entry is None:
            raise ConfigError(f"{path}: agent {name!r}: unknown model {a.model_id!r} "
                              f"(adapters: {', '.join(sorted(app.models))})")
        model_ids[a.model_id] = None
    model_ids.update(dict.fromkeys(app.config.models))
    for model_id in model_ids:
        _build_model(app, path, model_id)
    state.warn_plugin_errors()  # also those that failed to register while assembling
    click.echo(f"ok: {path}")


def _build_model(app: object, path: object, model_id: str) -> None:
    """Build ``model_id``'s adapter from its settings when it is a built-in one (building it
    reads nothing and sends nothing; a plugin's adapter may load a model, so it is left to
    ``dsh run``). The adapter's own checks raise: a base URL that is not http(s), bad
    timeouts or headers."""
    from dsh.core.errors import ConfigError

    entry, _, name, settings = app.adapter_entry(model_id)  # type: ignore[attr-defined]
    if entry is None or not entry.plugin.startswith("dsh."):
        return
    try:
        entry.build(name, settings)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
