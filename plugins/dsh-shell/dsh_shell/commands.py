"""``run_command``: one program, no shell, in the workspace, with approval for unknown names.

Approval is asked on the terminal (``/dev/tty``), never on stdin: stdin may carry the prompt
or data piped into ``dsh run``, and an answer must come from a person. With no terminal the
command is refused unless the run was started with ``--yes`` (``RunContext.approve_all``).
"""

from __future__ import annotations

import codecs
import os
import re
import shlex
import signal
import threading
from typing import IO
from typing import TYPE_CHECKING

from dsh.errors import ToolError
from dsh.runcontext import current_or_none
from dsh_shell.settings import ShellSettings
from dsh_shell.workspace import workspace_root

if TYPE_CHECKING:
    import subprocess

#: Tokens that mean the model expected a shell. Without one they would reach the program as
#: plain arguments (``ls | wc`` would list files named ``|`` and ``wc``), so they are refused.
SHELL_OPERATORS = frozenset(
    {"|", "||", "|&", "&", "&&", ";", ";;", "<", "<<", "<<<", ">", ">>", "2>", "2>>", "&>",
     "2>&1", ">&", "(", ")"}
)
#: Commands a model may try that are shell builtins, so they are not found as programs.
_BUILTINS = frozenset({"cd", "export", "source", ".", "set", "alias", "ulimit", "umask"})

#: Environment variables withheld from commands unless named in ``env_keep``: an allowlisted
#: ``cat /proc/self/environ`` would otherwise hand the model dsh's API keys (DESIGN: keys never
#: reach the ledger).
SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)

# Approval prompts of concurrent runs in one process must not interleave on the terminal.
_tty_lock = threading.Lock()


def run_command(settings: ShellSettings, command: str) -> str:
    """Parse, approve and run ``command``; return its exit code and output as text."""
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
    if reason is not None:
        _approve(argv, reason, root, settings)
    return _execute(argv, root, settings)


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


def _approve(argv: list[str], reason: str, root: str, settings: ShellSettings) -> None:
    ctx = current_or_none()
    if ctx is not None and ctx.approve_all:
        return
    name = os.path.basename(argv[0])
    try:
        # O_NOCTTY: asking must never make the terminal dsh's controlling terminal.
        fd = os.open(settings.tty, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        raise ToolError(
            f"command {name!r} needs approval: {reason}; no terminal to ask on — rerun with "
            "--yes to approve"
        ) from None
    # The command comes from the model: show it quoted and with control characters escaped,
    # so escape sequences cannot redraw the question into something else.
    shown = _printable(shlex.join(argv))
    with _tty_lock, os.fdopen(fd, "r+b", buffering=0) as tty:
        tty.write(f"\ndsh-shell: run `{shown}` in {root}? [y/N] ".encode(errors="replace"))
        answer = tty.readline(1024).strip().lower()
    if answer not in (b"y", b"yes"):
        raise ToolError(f"the user did not approve running {name!r} ({reason}); "
                        "do not retry it, ask the user or find another way")


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def child_env(keep: tuple[str, ...]) -> dict[str, str]:
    """dsh's environment without the variables that look like secrets (except ``keep``)."""
    return {k: v for k, v in os.environ.items() if k in keep or not SECRET_ENV.search(k)}


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def _execute(argv: list[str], root: str, settings: ShellSettings) -> str:
    # Output goes to temporary files, not pipes: memory stays bounded however much a command
    # prints (only max_output bytes are read back), and a background child that keeps a pipe
    # open cannot hang the wait. (Imported here: dsh imports this plugin on every start-up.)
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            # start_new_session: the command gets its own process group (killed as a whole on
            # timeout) and no controlling terminal, so it cannot prompt the user behind dsh's
            # back (sudo, ssh) — it fails instead of hanging.
            proc = subprocess.Popen(argv, cwd=root, shell=False, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True,
                                    env=child_env(settings.env_keep))
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
        # Aborting the run (Ctrl-C, RunHandle.abort) kills the command instead of waiting.
        forget = ctx.cancel.on_cancel(lambda: _kill_group(proc)) if ctx is not None else None
        try:
            code = proc.wait(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
            partial = _format(None, out, err, settings.max_output)
            raise ToolError(f"command timed out after {settings.timeout:g}s and was killed: "
                            f"{shlex.join(argv)}\n{partial}") from None
        except BaseException:
            # Ctrl-C reaches dsh, not the command (it has its own session): kill it too,
            # rather than leave it running after dsh is gone.
            _kill_group(proc)
            proc.wait()
            raise
        finally:
            if forget is not None:
                forget()
        if ctx is not None and ctx.cancel.cancelled:
            raise ToolError("the command was killed: the run was aborted")
        return _format(code, out, err, settings.max_output)


def _format(code: int | None, out: IO[bytes], err: IO[bytes], limit: int) -> str:
    """``exit code: N`` then each non-empty stream, cut so both fit in ``limit`` bytes."""
    out_size = os.fstat(out.fileno()).st_size
    err_size = os.fstat(err.fileno()).st_size
    # Share the budget: a stream under half of it leaves the rest to the other one.
    out_take = min(out_size, max(limit // 2, limit - err_size))
    err_take = min(err_size, limit - out_take)
    lines = []
    if code is not None:
        if code < 0:
            try:
                lines.append(f"killed by signal {signal.Signals(-code).name}")
            except ValueError:
                lines.append(f"killed by signal {-code}")
        else:
            lines.append(f"exit code: {code}")
    for label, f, size, take in (("stdout", out, out_size, out_take),
                                 ("stderr", err, err_size, err_take)):
        if size == 0:
            continue
        f.seek(0)
        data = f.read(take)
        if take < size:
            text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)
            lines.append(f"--- {label} (cut: first {take} of {size} bytes) ---")
        else:
            text = data.decode("utf-8", errors="replace")
            lines.append(f"--- {label} ---")
        lines.append(text.rstrip("\n"))
    if out_size == 0 and err_size == 0:
        lines.append("(no output)")
    return "\n".join(lines)
