"""``run_command``: a command line in the workspace, with approval for what is not a read.

A line without shell syntax runs as one program, without a shell. A line with shell syntax
(pipes, ``&&``, ``;``, redirection, ``$(…)``) runs as ``bash -c`` only under the kernel
sandbox (policy not ``off``, Landlock available) and with ``[plugins.shell] shell = "auto"``;
:mod:`dsh_shell.syntax` parses it and it runs at once only when it is read-only (every
program on the allowlist, no file written, nothing computed). Otherwise shell operators are
refused as before: without the sandbox, the allowlist is all that stands between a line and
the machine, and it names single programs.

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
from typing import Any

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


def run_command(settings: ShellSettings, command: str, policy: Policy | None = None,
                background: bool = False) -> str:
    """Parse, approve and run ``command`` confined by ``policy`` (default: the default
    policy, ``workspace-write``); return its exit code and output as text. With
    ``background``, start it as a job of the run (:mod:`dsh_shell.jobs`) and return at once.

    A line without shell syntax runs as one program, without a shell. A line with shell
    syntax runs as ``bash -c`` when :func:`shell_unavailable` says nothing against it, and
    is classified by :mod:`dsh_shell.syntax`; otherwise it is refused, as it always was."""
    if policy is None:
        from dsh.sandbox.policy import Policy

        policy = Policy()
    if "\0" in command:
        raise ToolError("the command contains a NUL character")
    try:
        command.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise ToolError("the command is not valid text (a lone surrogate)") from None
    try:
        argv: list[str] | None = shlex.split(command)
        problem = ""
    except ValueError as exc:
        argv, problem = None, str(exc)
    if argv == []:
        raise ToolError("the command is empty")
    from dsh_shell import syntax  # when the first command runs, not at start-up

    if syntax.needs_shell(command, argv):
        why_not = shell_unavailable(settings, policy)
        if not why_not:
            return _run_shell(settings, command, policy, background)
        argv = _without_shell(argv, problem, why_not)
    assert argv is not None
    root = workspace_root(settings.workspace_path())
    reason = _needs_approval(argv[0], settings.allow, root)
    outside = not policy.confined or policy.network
    if reason is None and outside:
        # The sandbox is what makes the allowlist safe to run without asking: a command
        # that may reach the network or runs unconfined is always asked about.
        reason = f"the sandbox policy is {policy.describe()}"
    if background:
        _job_room(settings)
    policy = _decide(shlex.join(argv), os.path.basename(argv[0]), reason, outside, root,
                     settings, policy, f"sandbox: {policy.describe()}")
    return _start(argv, root, settings, policy, shlex.join(argv), background, shell=False)


def _without_shell(argv: list[str] | None, problem: str, why_not: str) -> list[str]:
    """The words of a line run without a shell; shell operators in it are refused."""
    if argv is None:
        raise ToolError(f"cannot parse the command: {problem} (quote as a POSIX shell would)")
    operators = [a for a in argv if a in SHELL_OPERATORS]
    if operators:
        raise ToolError(
            f"shell syntax is not supported ({operators[0]!r}): commands run without a shell, "
            "so pipes, redirection, '&&' and ';' do not work. Run one program per call; "
            f"to save output to a file, use write_file. (No shell here: {why_not}.)"
        )
    return argv


def _run_shell(settings: ShellSettings, command: str, policy: Policy, background: bool) -> str:
    """``command`` as ``bash -c``: read-only lines (:mod:`dsh_shell.syntax`) run at once,
    any other is a ``command`` for the approval service, whose question lists the programs
    the line runs."""
    from dsh_shell import syntax

    root = workspace_root(settings.workspace_path())
    analysis = syntax.analyze(command, lambda name: _needs_approval(name, settings.allow, root))
    reason = "; ".join(analysis.problems) or None
    outside = not policy.confined or policy.network
    if reason is None and outside:
        reason = f"the sandbox policy is {policy.describe()}"
    if background:
        _job_room(settings)
    runs = ", ".join(analysis.programs) or "no program"
    shown = command.strip()
    # No ``program``: a grant for one program (any arguments) must not cover a line that
    # runs others, writes files or computes what it runs.
    policy = _decide(shown, None, reason, outside, root, settings, policy,
                     f"runs: {runs}\nsandbox: {policy.describe()}")
    bash = _bash()
    assert bash is not None  # shell_unavailable checked it
    # --norc --noprofile: no startup file (bash -c reads none unless BASH_ENV names one, and
    # the environment of a shell command holds no BASH_ENV: _shell_env). "--": a line that
    # starts with "-" is the command, not an option.
    argv = [bash, "--norc", "--noprofile", "-c", "--", command]
    return _start(argv, root, settings, policy, shown, background, shell=True)


def shell_unavailable(settings: ShellSettings, policy: Policy) -> str:
    """``""`` when a line with shell syntax may run as ``bash -c``, else why not: the
    ``shell`` setting says never, the sandbox policy is off, the kernel cannot confine
    (no Landlock, a platform without a backend) or there is no bash.

    The shell is bash, not ``/bin/sh``: the line is classified with Bash's grammar, and the
    shell that runs it must read it the same way (dash reads ``cmd &> f`` as ``cmd &`` then
    ``> f``, and has no ``<(…)``, ``[[`` or ``|&``). Without bash there is no shell."""
    if settings.shell == "never":
        return 'the setting [plugins.shell] shell = "never"'
    if not policy.confined:
        return "the sandbox policy is off, and a shell runs only inside the kernel sandbox"
    why = _backend_missing()
    if why:
        return f"the kernel sandbox is unavailable ({why})"
    if _bash() is None:
        return "bash is not installed"
    return ""


_BACKEND: list[str] = []  # the cached answer of _backend_missing


def _backend_missing() -> str:
    """``""`` when this kernel can confine a command (Landlock, a seccomp filter for this
    architecture), else why not; asked once per process (one system call)."""
    if not _BACKEND:
        import sys

        if not sys.platform.startswith("linux"):
            _BACKEND.append(f"no sandbox backend on {sys.platform}")
        else:
            from dsh.sandbox.exec import Refused
            from dsh.sandbox.exec import precheck

            try:
                precheck()
                _BACKEND.append("")
            except (Refused, OSError, AttributeError) as exc:
                _BACKEND.append(str(exc) or type(exc).__name__)
    return _BACKEND[0]


def _bash() -> str | None:
    """bash as the commands' PATH finds it (their PATH is dsh's: :data:`process.BASE_ENV`)."""
    import shutil

    return shutil.which("bash")


def _job_room(settings: ShellSettings) -> None:
    """Refuse a background job before asking about it when the run has ``max_jobs``."""
    from dsh_shell import jobs

    jobs.check_room(settings.max_jobs)


def _decide(subject: str, program: str | None, reason: str | None, outside: bool, root: str,
            settings: ShellSettings, policy: Policy, detail: str) -> Policy:
    """The approval service's say on the command (:mod:`dsh.tools.approval`): allowlisted
    programs are reads, any other a command, one leaving the sandbox ``outside``; the mode,
    ``--yes``, a grant or the person (asked on ``settings.tty``) decide, and it is recorded.
    Outside any run the person is still asked about a command that is not a read. In mode
    ``read-only`` the sandbox is read-only too. Returns the policy to run under."""
    from dsh.tools import approval

    action = "outside" if outside else "read" if reason is None else "command"
    ask = approval.Ask(tool="run_command", action=action, subject=subject, root=root,
                       program=program, reason=reason or "", detail=detail,
                       terminal=settings.tty)
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


#: Variables that would change what bash does with a line: a startup file (``BASH_ENV``,
#: ``ENV``), options, word splitting, ``cd`` lookups, traces. Removed from a shell's
#: environment even when ``env_keep`` names them, with every exported function
#: (``BASH_FUNC_name%%``, which would replace a program of that name).
SHELL_UNSAFE_ENV = ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS", "CDPATH", "GLOBIGNORE",
                    "PROMPT_COMMAND", "PS4", "BASH_XTRACEFD", "EXECIGNORE")


def command_env(settings: ShellSettings, root: str, shell: bool) -> dict[str, str]:
    """The environment of a command (:func:`process.child_env` and the run's variables);
    for a shell, without :data:`SHELL_UNSAFE_ENV` and exported functions."""
    env = {**process.child_env(settings.env_keep, root), **process.session_env()}
    if shell:
        env = {k: v for k, v in env.items()
               if k not in SHELL_UNSAFE_ENV and not k.startswith("BASH_FUNC_")}
    return env


def _start(argv: list[str], root: str, settings: ShellSettings, policy: Policy, shown: str,
           background: bool, *, shell: bool) -> str:
    env = command_env(settings, root, shell)
    if background:
        from dsh_shell import jobs

        return jobs.start(argv, root, settings, policy, shown, env)
    return _execute(argv, root, settings, policy, shown, env)


def spawn(argv: list[str], root: str, policy: Policy, env: dict[str, str],
          stderr: int) -> Any:
    """Start ``argv`` confined by ``policy`` in ``root`` (stdout a pipe, ``stderr`` a pipe
    or ``subprocess.STDOUT``); raise :class:`ToolError` saying why it could not start."""
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
        return Popen(argv, policy, workspace=root, cwd=root, stdin=subprocess.DEVNULL,
                     stdout=subprocess.PIPE, stderr=stderr, start_new_session=True, env=env)
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


def _execute(argv: list[str], root: str, settings: ShellSettings, policy: Policy, shown: str,
             env: dict[str, str]) -> str:
    import subprocess

    proc = spawn(argv, root, policy, env, subprocess.PIPE)
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
    note = quarantine_note(proc)
    if note:
        err.feed(f"\n{note}\n".encode())
    if ctx is not None and ctx.cancel.cancelled:
        raise ToolError("the command was killed: the run was aborted")
    if stop == "timeout":
        partial = _format(None, out, err, settings.max_output)
        raise ToolError(f"command timed out after {settings.timeout:g}s and was killed: "
                        f"{shown}\n{partial}") from None
    if stop == "output":
        head = (f"killed: the command printed more than {limit} bytes (output is kept up to "
                f"max_output = {settings.max_output} bytes), so it was stopped before it "
                "finished")
        return head + "\n" + _format(None, out, err, settings.max_output)
    return _format(proc.returncode, out, err, settings.max_output)


def quarantine_note(proc: Any) -> str:
    """What the sandbox moved aside once the command ended (persistence paths it created),
    as a line for the model; ``""`` when nothing."""
    moved = proc.sandbox.get("quarantined")
    if not moved:
        return ""
    shown = ", ".join(f"{m['path']} (now {m['moved_to']})" for m in moved)
    return (f"dsh-shell: the command created {shown}: a path that shapes later runs (git, dsh "
            "and Claude Code obey it), so it was moved aside; the person may allow it with "
            "[sandbox] unprotected")


def describe_exit(code: int) -> str:
    """``exit code: N``, or ``killed by signal NAME`` for a negative returncode."""
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code: {code}"


def _format(code: int | None, out: process.Stream, err: process.Stream, limit: int) -> str:
    """``exit code: N`` then each non-empty stream, cut so both fit in ``limit`` bytes."""
    # Share the budget: a stream under half of it leaves the rest to the other one.
    out_take = min(out.size, max(limit // 2, limit - err.size))
    err_take = min(err.size, limit - out_take)
    lines = []
    if code is not None:
        lines.append(describe_exit(code))
    for label, stream, take in (("stdout", out, out_take), ("stderr", err, err_take)):
        if stream.size == 0:
            continue
        note, text = stream.text(take)
        lines.append(f"--- {label} ({note}) ---" if note else f"--- {label} ---")
        lines.append(text.rstrip("\n"))
    if out.size == 0 and err.size == 0:
        lines.append("(no output)")
    return "\n".join(lines)
