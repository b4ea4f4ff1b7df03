"""A tiny dsh plugin: a hook, a tool, a model prefix and a command (tests/test_install.py).

With ``DSH_DEMO_BREAK`` set in the environment it raises at import, as a broken plugin would;
with ``DSH_DEMO_EXIT=N`` it ends the interpreter with exit code N at import; with
``DSH_DEMO_TOOLS_FAIL`` its ``register_tools`` raises.
"""

from __future__ import annotations

import os
from typing import Any

import click

from dsh import hookimpl

if os.environ.get("DSH_DEMO_EXIT"):
    os._exit(int(os.environ["DSH_DEMO_EXIT"]))
if os.environ.get("DSH_DEMO_BREAK"):
    raise RuntimeError("demo plugin broken on purpose")


def demo_shout(text: str) -> str:
    """Repeat TEXT in capitals.

    :param text: what to shout
    """
    return text.upper()


@hookimpl
def register_tools(register: Any, agent: Any) -> None:
    if os.environ.get("DSH_DEMO_TOOLS_FAIL"):
        raise ValueError("no tools today")
    register(demo_shout)


@hookimpl
def register_models(register: Any) -> None:
    register("demo", lambda name, settings: None, "a model that is not there")


@hookimpl
def register_commands(cli: click.Group) -> None:
    @cli.command("demo-hello")
    def hello() -> None:
        """Say hello."""
        click.echo("hello from the demo plugin")



@hookimpl
def pre_step(step: Any) -> None:
    return None
