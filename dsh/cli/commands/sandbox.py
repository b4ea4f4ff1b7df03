"""``dsh sandbox``: what this machine can confine, and a command run under an agent's policy.

``check`` prints what the kernel supports and which backend a policy would use; ``run`` starts
one command under the policy of an agent (or of a policy file) exactly as ``run_command`` would,
so a user writing a policy sees what it allows: a denied read is the command's own stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from dsh.cli.root import State
from dsh.cli.root import pass_state


@click.group()
def sandbox() -> None:
    """The kernel sandbox of commands the model runs (docs/security.md)."""


@sandbox.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
def sandbox_check(as_json: bool) -> None:
    """Say what this machine supports and which backend would confine commands.

    Exits 0 when commands can be confined, 126 when they cannot (every sandboxed tool would
    then refuse to run, unless its agent's policy is "off").
    """
    from dsh.sandbox.spawn import check

    info = check()
    if as_json:
        import json

        click.echo(json.dumps(info))
    else:
        abi = info.get("landlock_abi")
        click.echo(f"platform: {info.get('platform')} ({info.get('machine', '?')})")
        if abi is not None:
            note = f" ({info['landlock_error']})" if info.get("landlock_error") else ""
            click.echo(f"landlock: ABI {abi}{note}; dsh needs {info.get('min_abi')} or newer")
            click.echo(f"seccomp filter: {'yes' if info.get('seccomp_filter') else 'no'}")
        if info.get("backend"):
            click.echo(f"backend: {info['backend']} — commands are confined")
            click.echo(f"launcher (MCP stdio servers): {info.get('launcher')}")
        else:
            click.echo(f"backend: none — {info.get('why')}; sandboxed tools refuse to run "
                       "(policy = \"off\" runs them unconfined)")
    if not info.get("backend"):
        sys.exit(126)


@sandbox.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--agent", "-a", help="Use this agent's policy (default: the default agent).")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Use the policy in this TOML file (the keys of [sandbox]) instead.")
@click.option("--workspace", "-w", type=click.Path(file_okay=False, path_type=Path),
              help="The workspace directory (default: the current directory).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_state
def sandbox_run(state: State, agent: str | None, policy_file: Path | None,
                workspace: Path | None, command: tuple[str, ...]) -> None:
    """Run COMMAND (after `--`) under an agent's sandbox policy, in the workspace.

    The command's output and exit code are its own. Exits 126 when the policy cannot be
    applied (the command does not run), 127 when the program is not found, 2 for a bad
    policy.
    """
    import os

    from dsh.core.errors import UsageError
    from dsh.sandbox.policy import parse_policy
    from dsh.sandbox.spawn import Popen

    if policy_file is not None:
        policy = parse_policy(_read_policy_file(policy_file), where=str(policy_file))
    else:
        from dsh.sandbox import policy_for

        policy = policy_for(state.app.agent(agent).handle)
    root = os.path.realpath(workspace or os.getcwd())
    if not os.path.isdir(root):
        raise UsageError(f"--workspace: {root} is not a directory")
    try:
        proc = Popen(list(command), policy, workspace=root, stdin=None, env=_env(root))
    except FileNotFoundError:
        click.echo(f"dsh: error: command not found: {command[0]!r}", err=True)
        sys.exit(127)
    except PermissionError:
        click.echo(f"dsh: error: permission denied: cannot execute {command[0]!r}", err=True)
        sys.exit(126)
    click.echo(f"dsh: sandbox: {policy.describe()} ({proc.sandbox.get('backend')})", err=True)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
        raise
    sys.exit(code if code >= 0 else 128 - code)


def _env(root: str) -> dict[str, str]:
    """dsh's environment filtered by the allowlist run_command uses: no key reaches it."""
    import os

    from dsh.sandbox.policy import BASE_ENV

    env = {k: v for k, v in os.environ.items()
           if k in BASE_ENV or (k.startswith("LC_") and "LC_*" in BASE_ENV)}
    env["PWD"] = root
    return env


def _read_policy_file(path: Path) -> object:
    from dsh.core.errors import ConfigError
    from dsh.core.files import read_regular
    from dsh.core.files import reason

    try:
        text = read_regular(path, 1 << 20).decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the policy: {reason(exc)}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: the policy is not UTF-8 text") from None
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return data.get("sandbox", data) if set(data) == {"sandbox"} else data
