"""``dsh keys``: API keys kept by dsh, in the OS keyring or an owner-only file (dsh/config/keys.py).

No command prints a key: ``list`` prints names, ``path`` where they are, ``set`` reads the
key without echo from a terminal (or from stdin when it is piped) and says only where it went.
"""

from __future__ import annotations

import sys

import click

from dsh.cli.shared import warn


@click.group()
def keys() -> None:
    """Store API keys for models (`api_key_name` selects one; environment variables win)."""


@keys.command("set")
@click.argument("name")
def keys_set(name: str) -> None:
    """Store the key NAME: typed without echo on a terminal, or read from stdin when piped.

    Surrounding whitespace (the newline of `echo`) is dropped. An existing key is replaced.
    """
    from dsh.config.keys import MAX_KEY_BYTES
    from dsh.config.keys import check_name
    from dsh.config.keys import check_value
    from dsh.config.keys import store
    from dsh.core.errors import UsageError

    check_name(name)
    stdin = sys.stdin
    if stdin is not None and stdin.isatty():
        import getpass

        value = getpass.getpass(f"Key for {name} (not shown): ", stream=sys.stderr)
    else:
        # bounded: `dsh keys set x < /dev/zero` must end; surrounding whitespace is allowed
        value = stdin.read(4 * MAX_KEY_BYTES + 1) if stdin is not None else ""
        if len(value) > 4 * MAX_KEY_BYTES:
            check_value(value)
    value = check_value(value.strip())
    if not value:
        raise UsageError("no key given (type it at the prompt, or pipe it on stdin)")
    if "\n" in value or "\r" in value:
        raise UsageError("the key has more than one line; give one key")
    from dsh.llm.http.settings import header_value_problem

    problem = header_value_problem(value)
    if problem:  # it could never be sent: say so now, not at the first request
        raise UsageError(f"the key {problem}; it was not stored (the key is not shown)")
    target = store()
    target.set(name, value)
    warn(f"stored key {name} in {target.where()}")


@keys.command("list")
def keys_list() -> None:
    """Print the names of the stored keys, one a line (never the keys)."""
    from dsh.config.keys import store

    names = store().names()
    for name in names:
        click.echo(name)
    if not names:
        warn("no stored keys")


@keys.command("remove")
@click.argument("name")
def keys_remove(name: str) -> None:
    """Remove the stored key NAME."""
    from dsh.config.keys import check_name
    from dsh.config.keys import store
    from dsh.core.errors import UsageError

    target = store()
    if not target.remove(check_name(name)):
        raise UsageError(f"no stored key {name!r} (dsh keys list shows them)")
    warn(f"removed key {name} from {target.where()}")


@keys.command("path")
def keys_path() -> None:
    """Print where keys are kept: the keys file's path, or the keyring backend."""
    from dsh.config.keys import store

    click.echo(store().where())
