"""The ``dsh`` command (minimal; the full CLI lands with issue 3)."""

from __future__ import annotations

import sys

import click

from dsh._version import __version__


@click.group()
@click.version_option(__version__, prog_name="dsh")
def cli() -> None:
    """dsh: run LLM agents as a tree of pluggy plugins."""


@cli.command()
@click.argument("prompt", required=False)
@click.option("-m", "--model", help="Model id, e.g. echo, scripted:FILE, openai:gpt-4o-mini.")
def run(prompt: str | None, model: str | None) -> None:
    """Run PROMPT as one turn and print the answer."""
    from dsh.app import App

    result = App.from_config().run(prompt or "", model=model)
    click.echo(result.output)
    if result.error is not None:
        click.echo(f"dsh: {result.reason}", err=True)
        sys.exit(1)


def main() -> None:
    cli()
