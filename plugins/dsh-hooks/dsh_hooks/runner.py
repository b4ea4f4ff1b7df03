"""Running one hook command: a real process, JSON on stdin, exit code and output back.

The process gets the same hardened environment as dsh-shell's commands (an allowlist: no
API key reaches it, and dsh is made non-dumpable so ``/proc/<dsh>/environ`` is closed to
it), plus ``CLAUDE_PROJECT_DIR`` and ``DSH_PROJECT_DIR``. Its output is read from pipes with
a cap: past ``max_output`` bytes (both streams) it is killed with its process group and its
answer is not used. Its wait is bounded by its own ``timeout`` and by the run's cancellation
(an abort, ``--timeout``, SIGTERM): the run's token kills the hook's process group the
moment it fires.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import DshError

try:  # the same allowlist as dsh-shell's commands, when it is installed
    from dsh_shell.process import BASE_ENV
except ImportError:  # pragma: no cover - exercised only without dsh-shell
    # A copy of dsh_shell.process.BASE_ENV (keep in step): what every child may see.
    BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*",
                "TERM", "TZ", "TMPDIR")


def harden_process() -> str:
    """dsh made non-dumpable once, before a hook's first command (shared with every confined
    process of dsh: :func:`dsh.sandbox.environment.harden`)."""
    from dsh.sandbox.environment import harden

    return harden()


if TYPE_CHECKING:
    from dsh.host.runcontext import CancelToken


@attrs.frozen
class Ran:
    """What one hook process did. ``status``: ``exit`` (it exited with ``code``),
    ``timeout``, ``output`` (printed more than the cap: killed), ``aborted`` (the run was
    cancelled while it ran: killed; ``stderr`` says why) or ``spawn`` (could not start)."""

    status: str
    code: int | None
    stdout: str
    stderr: str
    duration_ms: float
    #: Status ``spawn`` because the kernel could not apply its sandbox policy
    #: (:class:`dsh.sandbox.SandboxUnavailable`): why, else "".
    unconfinable: str = ""


def child_env(keep: tuple[str, ...], project_dir: str) -> dict[str, str]:
    from fnmatch import fnmatchcase

    wanted = BASE_ENV + keep
    env = {k: v for k, v in os.environ.items() if any(fnmatchcase(k, w) for w in wanted)}
    env["PWD"] = project_dir
    env["CLAUDE_PROJECT_DIR"] = project_dir
    env["DSH_PROJECT_DIR"] = project_dir
    return env


_SHELL: list[str] = []


def _shell() -> str:
    # Claude Code runs hook commands through a shell; bash when there is one.
    if not _SHELL:
        _SHELL.append(shutil.which("bash") or "/bin/sh")
    return _SHELL[0]


def run(command: str, stdin: bytes, *, timeout: float, cwd: str, env: dict[str, str],
        max_output: int, cancel: CancelToken | None = None, policy: Any = None) -> Ran:
    """Run ``command`` with ``stdin``; never raises for the command's own failures.

    :param cancel: the run's :class:`dsh.host.runcontext.CancelToken`: when it fires, the hook's
        process group is killed at once (from the thread that cancels) and the result's
        status is ``aborted``; a token that has fired already starts nothing.
    :param policy: the hook source's :class:`dsh.sandbox.Policy` (None: unconfined); a policy
        the kernel cannot apply is status ``spawn`` with the one-line reason (fail closed).
    """
    if cancel is not None and cancel.cancelled:
        return Ran("aborted", None, "", f"not started: the run was aborted ({cancel.reason})",
                   0.0)
    harden_process()
    start = time.perf_counter()
    try:
        # Its own process group, so a timeout kills every process it started. Not its own
        # session (start_new_session): with the kernel's autogroup scheduling, a new session
        # is a new scheduling group, measured at +7 ms median per hook on a loaded machine
        # (benchmarks/hooks.py); a process group costs nothing.
        argv = [_shell(), "-c", command]
        if policy is not None:  # confined by the kernel (dsh.sandbox), workspace = cwd
            from dsh.sandbox.spawn import Popen

            proc: subprocess.Popen[bytes] = Popen(
                argv, policy, workspace=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=cwd, env=env, process_group=0)
        else:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=cwd, env=env, process_group=0,
                                    close_fds=True)
    except (OSError, DshError) as exc:
        from dsh.sandbox.spawn import SandboxUnavailable

        why = str(exc) if isinstance(exc, SandboxUnavailable) else ""
        return Ran("spawn", None, "", f"cannot start: {exc}", 0.0, unconfinable=why)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    if len(stdin) <= _PIPE_ROOM:
        _feed(proc, stdin)  # fits in the empty pipe: never blocks
    else:  # a large tool_response: written while the output is read
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True,
                         name="dsh-hook-stdin").start()
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    # The run's abort kills the group from the cancelling thread: the pump below then sees
    # the hook exit (its pidfd, its pipes closing) and returns at once.
    forget = cancel.on_cancel(lambda: _kill(proc, alive_only=True)) if cancel is not None \
        else None
    try:
        status = _pump(proc, bufs, time.monotonic() + timeout, max_output)
    except BaseException:  # Ctrl-C, an abort: the hook's group must not outlive the wait
        _kill(proc)
        raise
    finally:
        if forget is not None:
            forget()
    if cancel is not None and cancel.cancelled:
        _kill(proc)  # whatever is left of its group (a background child)
        status = "aborted"
    if status != "exit":
        _kill(proc)
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL'd group
        code = None
    proc.stdout.close()
    proc.stderr.close()
    out, err = (bytes(b).decode("utf-8", errors="replace") for b in bufs.values())
    if status == "aborted" and cancel is not None:
        err = f"killed: the run was aborted ({cancel.reason})"
    return Ran(status, code if status == "exit" else None, out, err,
               round((time.perf_counter() - start) * 1000, 3))


#: Bytes an empty pipe takes without blocking the writer (Linux: 64 KiB; 4 KiB is POSIX's
#: guaranteed minimum, PIPE_BUF).
_PIPE_ROOM = 65536 if os.uname().sysname == "Linux" else 4096


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
    except OSError:  # BrokenPipeError included: a hook need not read its input
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _pump(proc: subprocess.Popen[bytes], bufs: dict[int, bytearray], deadline: float,
          cap: int) -> str:
    """Read both pipes until the hook has exited and they are empty: ``exit``; or
    ``timeout`` / ``output`` (more than ``cap`` bytes). The hook's exit wakes the poll through
    a pidfd (Linux 5.3+), so no sleep loop adds latency to every hook; without one, it polls
    every 0.1 s."""
    poller = select.poll()
    for fd in bufs:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(proc.pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):  # not Linux 5.3+: poll every 0.1 s instead
        pass
    open_fds = set(bufs)
    total = 0
    try:
        while True:
            exited = proc.poll() is not None
            if exited and not open_fds:
                return "exit"
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            wait = 0 if exited else int(min(left, 0.1 if pidfd is None else 1.0) * 1000) + 1
            events = poller.poll(wait)
            if not events and exited:
                return "exit"  # a background child keeps a pipe open: it does not hold us
            for fd, _ in events:
                if fd == pidfd:
                    poller.unregister(fd)  # exited: reaped by proc.poll() above
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                total += len(data)
                if total > cap:
                    return "output"
                bufs[fd] += data
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _kill(proc: subprocess.Popen[bytes], alive_only: bool = False) -> None:
    """SIGKILL the hook's process group. ``alive_only`` (from the cancelling thread, at any
    moment): not once the hook has been reaped and nothing is left in its group, so that an
    id the kernel has recycled is not signalled."""
    if alive_only and proc.poll() is not None and not _group_alive(proc.pid):
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
