"""Running one command: what it may see of dsh, and how much of its output is kept.

* **Environment from an allowlist.** A command gets :data:`BASE_ENV` (``PATH``, ``HOME``,
  the locale, …) and the variables ``env_keep`` names, nothing else: no API key, no
  ``DATABASE_URL``, no proxy URL with a password, whatever the variable is called.
* **dsh's own memory is closed to it.** Before the first command starts, dsh makes itself
  non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``, Linux): ``/proc/<dsh pid>/environ``, ``mem``,
  ``fd/`` and ``maps`` then belong to root, so a command running as the same (non-root) user
  cannot read dsh's environment or memory, nor attach a debugger. Root can (docs: security).
* **Output is read from pipes, incrementally**, and at most ``max_output`` bytes of each
  stream (its beginning and its end) are kept in memory; nothing is spooled to disk. A
  command that prints more than :func:`drain_limit` bytes is killed with its process group.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    import subprocess

#: Variables every command gets (when dsh has them); ``LC_*`` is a prefix. Anything else
#: reaches a command only when ``[plugins.shell] env_keep`` names it.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM",
            "TZ", "TMPDIR")

def harden_process() -> str:
    """Make this process non-dumpable, once, before the first command starts; return ``""``
    when done, else why not (not Linux, or prctl failed): :func:`dsh.sandbox.environment.harden`,
    the one every confined process of dsh shares.

    Non-dumpable (``PR_SET_DUMPABLE`` = 0): the kernel makes ``/proc/PID/{environ,mem,fd,maps,
    …}`` owned by root and refuses ``ptrace`` attach from processes without
    ``CAP_SYS_PTRACE``, so a command running as dsh's (non-root) user cannot read dsh's
    environment or memory. Importing ctypes takes 2-20 ms, more than start-up can spend, so it
    is done when the first command is about to run. Commands are not affected: ``execve``
    makes each program dumpable again.
    """
    from dsh.sandbox.environment import harden

    return harden()


def child_env(keep: tuple[str, ...], cwd: str) -> dict[str, str]:
    """The environment of a command: :data:`BASE_ENV` and ``keep`` (names, or patterns with
    ``*``), taken from dsh's environment; ``PWD`` is the directory it runs in."""
    wanted = BASE_ENV + keep
    exact = {w for w in wanted if not _is_pattern(w)}
    patterns = [w for w in wanted if _is_pattern(w)]
    env = {k: v for k, v in os.environ.items() if k in exact}
    if patterns:
        from fnmatch import fnmatchcase

        env.update((k, v) for k, v in os.environ.items()
                   if any(fnmatchcase(k, p) for p in patterns))
    env["PWD"] = cwd
    return env


#: ``RunContext.data`` key of variables other plugins set for the run's commands (dsh-hooks:
#: what SessionStart hooks wrote to ``CLAUDE_ENV_FILE``, recorded as ``x/dsh-hooks/env``).
SESSION_ENV = "dsh_shell.env"


def session_env() -> dict[str, str]:
    """The variables set for this run's commands (the nearest run up the sub-agent chain
    that has any), added over :func:`child_env`'s."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    while ctx is not None:
        env = ctx.data.get(SESSION_ENV)
        if env:
            return {str(k): str(v) for k, v in env.items()}
        ctx = ctx.parent
    return {}


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def record_sandbox(record: dict[str, Any]) -> None:
    """Write what confined the current tool call — ``x/shell/sandbox`` with the call's id,
    the policy, the backend and the kernel's ABI — into the session ledger, so a reader knows
    what the command could have done. Nothing outside a run (the tool called directly)."""
    from dsh.tools.registry import current_call

    try:
        call = current_call()
    except LookupError:
        return
    from dsh.core.errors import NoRunContext
    from dsh.ledger.plugin_events import record_event

    try:
        record_event("shell", "sandbox", {"call_id": call.call.id, "tool": call.call.name,
                                          **record})
    except NoRunContext:
        return


def drain_limit(max_output: int) -> int:
    """Bytes a command may print (both streams) before it is killed: 16 × ``max_output``,
    at least 8 MiB. Only ``max_output`` of them are kept; the rest is read and dropped, so
    a long build or test run still ends with its exit code and its last lines."""
    return max(16 * max_output, 8 * 1024 * 1024)


class Stream:
    """One output stream of a command: its size, its first ``keep`` bytes and its last
    ``keep`` bytes (memory stays under 2 × ``keep`` whatever the command prints)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.size = 0
        self.head = bytearray()
        self.tail = bytearray()

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.keep:
                del self.tail[: len(self.tail) - self.keep]

    def text(self, take: int) -> tuple[str, str]:
        """``(header note, text)`` showing at most ``take`` bytes: all of it when it fits,
        else its beginning and its end."""
        import codecs

        if self.size <= take:
            return "", bytes(self.head + self.tail).decode("utf-8", errors="replace")
        tail_n = take // 4
        head = bytes(self.head[: take - tail_n])
        # head + tail is the whole output when it is short, else its first and last ``keep``
        # bytes: either way it ends with the last ``tail_n`` bytes (``tail_n`` <= ``keep``).
        end = bytes((self.head + self.tail)[len(self.head) + len(self.tail) - tail_n:])
        # Cut on character boundaries: an incremental decoder holds back a sequence split at
        # the end of the head; continuation bytes at the start of the tail are dropped.
        first = codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=False)
        skip = 0
        while skip < len(end) and skip < 3 and end[skip] & 0xC0 == 0x80:
            skip += 1
        last = end[skip:].decode("utf-8", errors="replace")
        note = (f"cut: {self.size} bytes, showing the first {len(head)} and the last "
                f"{len(end)}" if tail_n else f"cut: first {len(head)} of {self.size} bytes")
        if not tail_n:
            return note, first
        hidden = self.size - len(head) - len(end)
        return note, f"{first}\n[… {hidden} bytes cut …]\n{last}"


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group (it has its own: ``start_new_session``)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


def pump(proc: subprocess.Popen[bytes], streams: dict[int, Stream], deadline: float,
         limit: int) -> str | None:
    """Read the command's pipes into ``streams`` until both end or the command has exited
    and nothing more is waiting (a background child may keep a pipe open: it does not hold
    the call). Returns ``"timeout"`` at ``deadline``, ``"output"`` once more than ``limit``
    bytes came, else None. Never blocks longer than 0.1 s without checking the clock."""
    import select

    poller = select.poll()
    for fd in streams:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    open_fds = dict(streams)
    total = 0
    while open_fds:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        exited = proc.poll() is not None
        wait_ms = 0 if exited else int(min(deadline - now, 0.1) * 1000) + 1
        events = poller.poll(wait_ms)
        if not events and exited:
            break  # the command is done and its pipes are empty
        for fd, _ in events:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                poller.unregister(fd)
                del open_fds[fd]
                continue
            open_fds[fd].feed(data)
            total += len(data)
            if total > limit:
                return "output"
    return None
