"""``dsh config``: locate, show, create, change and check the config file.

Imported on demand by :class:`dsh.cli.root.DshGroup`; reading and checking are :mod:`dsh.config`,
editing is :mod:`dsh.config_edit`.
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

    The whole file is validated before it is written; other keys are kept, comments are not.
    A symbolic link is written through; VALUE may start with "-" (-1).
    """
    from dsh.config.edit import set_value

    path = state.config_file()
    dropped = set_value(path, key, value)
    warn(f"set {key} in {path}" + (" (its comments were not kept)" if dropped else ""))


@config.command("validate")
@pass_state
def config_validate(state: State) -> None:
    """Check the config file and assemble every agent; print "ok: FILE" or fail with 2."""
    from dsh.config.loader import load_config

    path = state.config_file()
    cfg = load_config(path, required=True)
    app = state.app
    for name in cfg.agent_names():
        a = app.agent(name)
        prefix = a.model_id.partition(":")[0]
        if a.model_id not in cfg.models and prefix not in app.models:
            from dsh.core.errors import ConfigError

            raise ConfigError(f"{path}: agent {name!r}: unknown model {a.model_id!r} "
                              f"(adapters: {', '.join(sorted(app.models))})")
    state.warn_plugin_errors()  # also those that failed to register while assembling
    click.echo(f"ok: {path}")
