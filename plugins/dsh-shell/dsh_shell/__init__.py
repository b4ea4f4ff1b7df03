"""dsh-shell, dsh's workbench: run commands (a shell inside the kernel sandbox, background
jobs), read, write, edit and patch files (every change recorded as a diff), search them, and
ask the person, all in one workspace directory.

Installed, it is found through the ``dsh`` entry point ``shell`` and reaches only the agents
that enable it (``plugins = ["shell"]``, or every agent that lists no plugins). Its settings
come from ``[plugins.shell]``, overlaid with ``[agents.NAME.plugin_settings.shell]``:

``workspace``
    the directory commands run in and files are confined to (default: the current
    directory at the time of the call);
``allow``
    command names that run without approval (default: ``ls cat echo pwd grep head tail wc``);
``timeout``
    seconds before a command is killed (default 60);
``max_output``
    bytes of command output returned (default 64 KiB);
``max_read``
    bytes of a file ``read_file`` returns per call (default 256 KiB);
``env_keep``
    environment variables passed to commands besides ``PATH``, ``HOME``, ``USER``,
    ``LOGNAME``, ``SHELL``, ``LANG``, ``LANGUAGE``, ``LC_*``, ``TERM``, ``TZ`` and ``TMPDIR``
    (names, or patterns such as ``GIT_*``); nothing else of dsh's environment reaches them.
``shell``
    ``"auto"`` (default: a command line with shell syntax runs in bash when the kernel
    sandbox is active) or ``"never"`` (one program per call, shell operators refused);
``max_jobs``
    background jobs of a run that may be running at once (default 4).

Any other command is asked about on the terminal, or refused when there is none unless the
run was started with ``dsh run --yes``. See README.md for the security model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dsh import sandbox
from dsh.hookspecs import hookimpl
from dsh.tools.registry import parse_docstring
from dsh_shell import commands
from dsh_shell import workbench
from dsh_shell import workspace
from dsh_shell.settings import ShellSettings
from dsh_shell.settings import parse_settings

if TYPE_CHECKING:
    from dsh.host.scope import AgentInfo

__version__ = "0.1.0"
__all__ = ["ShellSettings", "__version__", "register_tools"]


@hookimpl
def register_tools(register: Callable[..., None], agent: AgentInfo) -> None:
    """Register the workbench's tools bound to ``agent``'s settings, so agents with different
    workspaces each get their own (README.md, "Tools")."""
    settings = parse_settings(agent.plugin_settings("shell"),
                              where=f"plugins.shell, agent {agent.name}")
    # The agent's sandbox policy ([sandbox], [agents.NAME] sandbox): every command runs under it.
    policy = sandbox.policy_for(agent)
    # The project's persistence paths stay unwritten unless the person said otherwise.
    unprotected = tuple(getattr(policy, "unprotected", ()))
    memory = agent.plugin_settings("dsh.memory").get("file")
    memory_file = (str(memory),) if memory and not str(memory).startswith(("/", "~")) else ()

    def run_command(command: str, background: bool = False) -> str:
        """Run a command line in the workspace; return its exit code and output.

        A line that only reads, with every program on the allowlist, runs at once; anything
        else needs the user's approval (they may refuse). Output is cut; slow commands are
        killed. background=true starts a job: read it with job_output, stop it with job_kill.

        :param command: the command line, e.g. "grep -rn TODO src" or "python -m pytest -q".
        :param background: run it as a background job (a server, a watcher).
        """
        return commands.run_command(settings, command, policy, background)

    def read_file(path: str, start_line: int = 1) -> str:
        """Read a text file in the workspace and return its content.

        Paths are relative to the workspace; absolute paths and paths that lead outside it
        (through '..' or a symlink) are refused. A long file is cut at a line boundary and the
        result ends with a note giving the start_line to continue from.

        :param path: file path relative to the workspace, e.g. "src/app.py".
        :param start_line: the first line to return (1 is the first line of the file).
        """
        return workspace.read_text(settings.workspace_path(), path, start_line=start_line,
                                   max_bytes=settings.max_read)

    def write_file(path: str, content: str) -> str:
        """Write a text file in the workspace, replacing it if it exists.

        Missing parent directories are created. Paths are relative to the workspace;
        absolute paths and paths that lead outside it (through '..' or a symlink) are refused.

        :param path: file path relative to the workspace, e.g. "notes/todo.md".
        :param content: the complete new content of the file (UTF-8 text).
        """
        root = workspace.workspace_root(settings.workspace_path())
        return workspace.write_text(root, path, content, unprotected, memory_file, ask=True)

    summary, _ = parse_docstring(run_command.__doc__)
    allowed = ", ".join(settings.allow) or "none"
    # The model plans better when it knows which programs run without a question.
    # A shell only inside the kernel sandbox (commands.shell_unavailable, checked per call).
    shell = (
        "Shell: bash (pipes, &&, ;, redirection, $(...)); a line that writes a file needs "
        "approval: prefer write_file or edit_file."
        if policy.confined and settings.shell == "auto" else
        "No shell: ONE program per call, its words split as a POSIX shell would (quotes work); "
        "pipes, redirection, &&, ;, globs, $VARIABLES and cd do not work."
    )
    run_description = (
        f"{summary}\n\n{shell}\n\nSandbox: {policy.describe()}. Runs without approval: "
        f"{allowed}. Output limit: {settings.max_output} bytes. Timeout: {settings.timeout:g}s."
    )
    # Side effects are ordered as the model wrote them: a step's write_file and run_command
    # calls run one after another, never concurrently (an approval question also waits).
    register(run_command, description=run_description, sequential=True)
    register(read_file)
    register(write_file, sequential=True)
    # The workbench: each module registers its own tools (README.md, "Tools").
    workbench.register_edits(register, settings, unprotected, memory_file)
    workbench.register_search(register, settings, policy)

    def job_output(job_id: int) -> str:
        """Return what a background job printed since the last read, and whether it still runs.

        At most the output limit is returned (its beginning and end, with a note when cut).

        :param job_id: the job's number, from run_command's "started job N".
        """
        from dsh_shell import jobs  # not at start-up: only when a job is asked about

        return jobs.output(job_id, settings.max_output)

    def job_kill(job_id: int) -> str:
        """Stop a background job: kill it and every process it started.

        :param job_id: the job's number, from run_command's "started job N".
        """
        from dsh_shell import jobs

        return jobs.kill(job_id)

    register(job_output)
    register(job_kill, sequential=True)
    workbench.register_ask(register, settings)
