"""``run_command``: one program, no shell, in the workspace, with approval for unknown names.

Whether a command runs is the approval service's decision (:mod:`dsh.tools.approval`): the
permission mode, ``--yes``, a grant, or the person asked on the terminal (``/dev/tty``, or
the ``tty`` setting), never on stdin: stdin may carry the prompt or data piped into ``dsh
run``, and an answer must come from a person. With no terminal a command that would ask is
refused. While the question waits, ``dsh run``'s status line is paused (it would redraw over
it); the wait ends, as no answer, when the run is aborted or its time limit passes.

How a command runs — its environment, dsh made non-dumpable, output read from pipes and
capped — is in :mod:`dsh_shell.process`.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from typing import TYPE_CHECKING

from dsh.core.errors import ConfigError
from dsh.core.errors import ToolError
from dsh.host.runcontext import current_or_none
from dsh_shell import process
from dsh_shell.settings import ShellSettings
from dsh_shell.workspace import workspace_root

if TYPE_CHECKING:
    from dsh.sandbox.policy import Policy

#: Tokens that mean the model expected a shell. Without one they would reach the program as
#: plain arguments (``ls | wc`` would list files named ``|`` and ``wc``), so they are refused.
SHELL_OPERATORS = frozenset(
    {"|", "||", "|&", "&", "&&", ";", ";;", "<", "<<", "<<<", ">", ">>", "2>", "2>>", "&>",
     "2>&1", ">&", "(", ")"}
)
#: Commands a model may try that are shell builtins, so they are not found as programs.
_BUILTINS = frozenset({"cd", "export", "source", ".", "set", "alias", "ulimit", "umask"})


def run_command(settings: ShellSettings, command: str, policy: Policy | None = None) -> str:
    """Parse, approve and run ``command`` confined by ``policy`` (default: the default
    policy, ``workspace-write``); return its exit code and output as text."""
    if policy is None:
        from dsh.sandbox.policy import Policy

        policy = Policy()
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ToolError(f"cannot parse the command: {exc} (quote as a POSIX shell would)") from None
    if not argv:
        raise ToolError("the command is empty")
    operators = [a for a in argv if a in SHELL_OPERATORS]
    if operators:
        raise ToolError(
            f"shell syntax is not supported ({operators[0]!r}): commands run without a shell, "
            "so pipes, redirection, '&&' and ';' do not work. Run one program per call; "
            "to save output to a file, use write_file."
        )
    root = workspace_root(settings.workspace_path())
    reason = _needs_approval(argv[0], settings.allow, root)
    outside = not policy.confined or policy.network
    if reason is None and outside:
        # The sandbox is what makes the allowlist safe to run without asking: a command
        # that may reach the network or runs unconfined is always asked about.
        reason = f"the sandbox policy is {policy.describe()}"
    policy = _decide(argv, reason, outside, root, settings, policy)
    return _execute(argv, root, settings, policy)


def _decide(argv: list[str], reason: str | None, outside: bool, root: str,
            settings: ShellSettings, policy: Policy) -> Policy:
    """The approval service's say on the command (:mod:`dsh.tools.approval`): allowlisted
    programs are reads, any other a command, one leaving the sandbox ``outside``; the mode,
    ``--yes``, a grant or the person (asked on ``settings.tty``) decide, and it is recorded.
    Outside any run the person is still asked about a command that is not a read. In mode
    ``read-only`` the sandbox is read-only too. Returns the policy to run under."""
    from dsh.tools import approval

    action = "outside" if outside else "read" if reason is None else "command"
    ask = approval.Ask(tool="run_command", action=action, subject=shlex.join(argv), root=root,
                       program=os.path.basename(argv[0]), reason=reason or "",
                       detail=f"sandbox: {policy.describe()}", terminal=settings.tty)
    ctx = current_or_none()
    if ctx is None:  # outside any run: the program's own call, asked about as before
        if reason is not None:
            decision = approval.question(ask)
            if not decision.allowed:
                raise approval.refusal(ask, decision)
        return policy
    approval.request(ask)
    if ctx.mode in ("read-only", "plan") and policy.mode == "workspace-write":
        import attrs

        policy = attrs.evolve(policy, mode="read-only")
    return policy


def _needs_approval(argv0: str, allow: tuple[str, ...], root: str) -> str | None:
    """Why ``argv0`` needs approval, or None when it may run at once."""
    name = os.path.basename(argv0)
    if name not in allow:
        return "not on the allowlist (plugins.shell.allow)"
    if "/" not in argv0:
        return None
    # The allowlist names programs found on PATH; a path names some particular file, which
    # is the allowlisted program only if it is the one PATH finds (./ls written by the model
    # is not).
    import shutil  # imported when a command runs, not when dsh starts

    found = shutil.which(name)
    real = os.path.realpath(os.path.join(root, argv0))
    if found is not None and real == os.path.realpath(found):
        return None
    return f"{argv0!r} is a path, not the {name!r} on PATH that the allowlist names"


def _execute(argv: list[str], root: str, settings: ShellSettings, policy: Policy) -> str:
    # Imported here: dsh imports this plugin on every start-up.
    import subprocess

    from dsh.sandbox.spawn import Popen
    from dsh.sandbox.spawn import SandboxUnavailable

    # Before the first command exists: it must not be able to read dsh's environment.
    process.harden_process()
    try:
        # The command runs confined by the agent's sandbox policy (dsh.sandbox: Landlock and
        # seccomp applied by a launcher before exec; nothing if the policy says "off").
        # start_new_session: the command gets its own process group (killed as a whole on
        # timeout) and no controlling terminal, so it cannot prompt the user behind dsh's
        # back (sudo, ssh) — it fails instead of hanging. close_fds (always) keeps every
        # descriptor of dsh (the ledger, sockets) away from it.
        proc = Popen(argv, policy, workspace=root, cwd=root, stdin=subprocess.DEVNULL,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                     env={**process.child_env(settings.env_keep, root),
                          **process.session_env()})
    except (SandboxUnavailable, ConfigError) as exc:  # cannot confine, or a plan refused
        raise ToolError(str(exc)) from None
    except FileNotFoundError:
        workspace_root(root)  # the workspace itself vanished: say so, not "not found"
        hint = (" (it is a shell builtin; commands always run in the workspace, so give "
                "paths relative to it)" if argv[0] in _BUILTINS else "")
        raise ToolError(f"command not found: {argv[0]!r}{hint}") from None
    except PermissionError:
        raise ToolError(f"permission denied: cannot execute {argv[0]!r}") from None
    except OSError as exc:
        raise ToolError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
    ctx = current_or_none()
    try:
        process.record_sandbox(proc.sandbox)
        # Aborting the run (Ctrl-C, SIGTERM, RunHandle.abort) kills the command instead of
        # waiting (at once if it has fired already).
        forget = (ctx.cancel.on_cancel(lambda: process.kill_group(proc)) if ctx is not None
                  else None)
    except BaseException:  # SIGTERM's KeyboardInterrupt before the kill was registered
        process.kill_group(proc)
        proc.wait()
        raise
    assert proc.stdout is not None and proc.stderr is not None
    out = process.Stream(settings.max_output)
    err = process.Stream(settings.max_output)
    limit = process.drain_limit(settings.max_output)
    deadline = time.monotonic() + settings.timeout
    try:
        stop = process.pump(proc, {proc.stdout.fileno(): out, proc.stderr.fileno(): err},
                            deadline, limit)
        if stop is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop = "timeout"
        if stop is not None:
            process.kill_group(proc)
            proc.wait()
    except BaseException:
        # Ctrl-C or SIGTERM reaches dsh, not the command (it has its own session): kill it
        # too, rather than leave it running after dsh is gone.
        process.kill_group(proc)
        proc.wait()
        raise
    finally:
        if forget is not None:
            forget()
        proc.stdout.close()
        proc.stderr.close()
    moved = proc.sandbox.get("quarantined")
    if moved:  # persistence paths the command created: moved aside by the sandbox
        shown = ", ".join(f"{m['path']} (now {m['moved_to']})" for m in moved)
        err.feed(f"\ndsh-shell: the command created {shown}: a path that shapes later runs "
                 "(git, dsh and Claude Code obey it), so it was moved aside; the person may "
                 "allow it with [sandbox] unprotected\n".encode())
    if ctx is not None and ctx.cancel.cancelled:
        raise ToolError("the command was killed: the run was aborted")
    if stop == "timeout":
        partial = _format(None, out, err, settings.max_output)
        raise ToolError(f"command timed out after {settings.timeout:g}s and was killed: "
                        f"{shlex.join(argv)}\n{partial}") from None
    if stop == "output":
        head = (f"killed: the command printed more than {limit} bytes (output is kept up to "
                f"max_output = {settings.max_output} bytes), so it was stopped before it "
                "finished")
        return head + "\n" + _format(None, out, err, settings.max_output)
    return _format(proc.returncode, out, err, settings.max_output)


def _format(code: int | None, out: process.Stream, err: process.Stream, limit: int) -> str:
    """``exit code: N`` then each non-empty stream, cut so both fit in ``limit`` bytes."""
    # Share the budget: a stream under half of it leaves the rest to the other one.
    out_take = min(out.size, max(limit // 2, limit - err.size))
    err_take = min(err.size, limit - out_take)
    lines = []
    if code is not None:
        if code < 0:
            try:
                lines.append(f"killed by signal {signal.Signals(-code).name}")
            except ValueError:
                lines.append(f"killed by signal {-code}")
        else:
            lines.append(f"exit code: {code}")
    for label, stream, take in (("stdout", out, out_take), ("stderr", err, err_take)):
        if stream.size == 0:
            continue
        note, text = stream.text(take)
        lines.append(f"--- {label} ({note}) ---" if note else f"--- {label} ---")
        lines.append(text.rstrip("\n"))
    if out.size == 0 and err.size == 0:
        lines.append("(no output)")
    return "\n".join(lines)
