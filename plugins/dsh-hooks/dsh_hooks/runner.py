"""Running one hook command: a real process, JSON on stdin, exit code and output back.

The process gets the same hardened environment as dsh-shell's commands (an allowlist: no
API key reaches it, and dsh is made non-dumpable so ``/proc/<dsh>/environ`` is closed to
it), plus ``CLAUDE_PROJECT_DIR`` and ``DSH_PROJECT_DIR``. Its output is read from pipes with
a cap: past ``max_output`` bytes (both streams) it is killed with its process group and its
answer is not used.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import threading
import time

import attrs

try:  # the same allowlist and hardening as dsh-shell's commands, when it is installed
    from dsh_shell.process import BASE_ENV
    from dsh_shell.process import harden_process
except ImportError:  # pragma: no cover - exercised only without dsh-shell
    # A copy of dsh_shell.process.BASE_ENV (keep in step): what every child may see.
    BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*",
                "TERM", "TZ", "TMPDIR")

    def harden_process() -> str:
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            return "" if libc.prctl(4, 0, 0, 0, 0) == 0 else "prctl failed"  # PR_SET_DUMPABLE
        except (OSError, AttributeError) as exc:
            return f"prctl unavailable: {exc}"


@attrs.frozen
class Ran:
    """What one hook process did. ``status``: ``exit`` (it exited with ``code``),
    ``timeout``, ``output`` (printed more than the cap: killed) or ``spawn`` (could not
    start)."""

    status: str
    code: int | None
    stdout: str
    stderr: str
    duration_ms: float


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
        max_output: int) -> Ran:
    """Run ``command`` with ``stdin``; never raises for the command's own failures."""
    harden_process()
    start = time.perf_counter()
    try:
        proc = subprocess.Popen([_shell(), "-c", command], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        return Ran("spawn", None, "", f"cannot start: {exc}", 0.0)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    def feed() -> None:
        try:
            proc.stdin.write(stdin)  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            pass  # a hook need not read its input
        finally:
            try:
                proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass

    writer = threading.Thread(target=feed, daemon=True, name="dsh-hook-stdin")
    writer.start()
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    status = _pump(proc, bufs, time.monotonic() + timeout, max_output)
    if status != "exit":
        _kill(proc)
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL'd group
        code = None
    proc.stdout.close()
    proc.stderr.close()
    out, err = (bytes(b).decode("utf-8", errors="replace") for b in bufs.values())
    return Ran(status, code if status == "exit" else None, out, err,
               round((time.perf_counter() - start) * 1000, 3))


def _pump(proc: subprocess.Popen[bytes], bufs: dict[int, bytearray], deadline: float,
          cap: int) -> str:
    poller = select.poll()
    for fd in bufs:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    open_fds = set(bufs)
    total = 0
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        exited = proc.poll() is not None
        events = poller.poll(0 if exited else int(min(left, 0.1) * 1000) + 1)
        if not events and exited:
            break  # done; a background child may keep a pipe open, it does not hold us
        for fd, _ in events:
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
    left = deadline - time.monotonic()
    try:
        proc.wait(timeout=max(left, 0))
    except subprocess.TimeoutExpired:
        return "timeout"
    return "exit"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
