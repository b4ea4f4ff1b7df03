"""``dsh.sandbox.run``: run one confined program to its end — the safe way for a tool plugin.

:class:`dsh.sandbox.spawn.Popen` is the building block; :func:`run` is what a tool usually
wants, with every part a plugin would otherwise get wrong done once:

* **the agent's policy**: with no ``policy``, the one of the agent whose tool call (or run)
  is current (:func:`dsh.sandbox.policy_for`); narrowed to ``read-only`` when the run's mode
  is ``read-only`` or ``plan``, as dsh-shell does;
* **the environment allowlist** (:func:`dsh.sandbox.environment.allowed_env`): ``env`` adds
  to it (a ``None`` value removes a variable); ``inherit_env=False`` makes ``env`` the whole
  environment. dsh's keys reach the program only when ``env`` names them;
* **its process group is killed** — with the PID namespace, where one is made — on timeout,
  when the output passes ``output_limit``, when the run is aborted (the run's
  :class:`~dsh.host.runcontext.CancelToken`, or ``cancel``), on an exception in dsh (Ctrl-C),
  and once the program has exited (nothing it started outlives the call);
* **output is drained concurrently and bounded**: of each stream, the first and last bytes
  (``max_output`` in all) are kept, whatever the program prints; nothing goes to disk;
* **the record**: inside a tool call, ``x/PLUGIN/sandbox`` — ``PLUGIN`` the plugin that
  registered the tool, as dsh-shell writes ``x/shell/sandbox`` — with the call's id and tool,
  appended before the output is read (``dsh sessions show`` prints it as the call's sandbox
  line). It is also on the result, for a caller outside a tool call to record itself.

The head-and-tail buffer (:class:`Stream`) is the core version of dsh-shell's
``dsh_shell.process.Stream``, which stays in the plugin until dsh-shell moves to :func:`run`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import attrs

from dsh.sandbox.policy import Policy

#: Stopped reasons (:attr:`Result.stopped`).
TIMEOUT, ABORTED, OUTPUT = "timeout", "aborted", "output"


@attrs.frozen
class Result:
    """What :func:`run` saw: how the program ended and what it printed (bounded)."""

    argv: tuple[str, ...]
    #: ``subprocess``'s: the exit code, or ``-N`` when killed by signal N; None when the run
    #: was aborted before the program started.
    returncode: int | None
    #: The output kept (``str`` with ``text=True``, else ``bytes``): all of it, or its first
    #: and last bytes around a ``[… N bytes cut …]`` line when it was longer.
    stdout: str | bytes
    stderr: str | bytes
    #: How many bytes each stream printed (also those not kept).
    stdout_size: int
    stderr_size: int
    #: Whether some output was not kept (a stream printed more than its share).
    cut: bool
    #: ``"timeout"``, ``"aborted"`` or ``"output"`` (printed more than ``output_limit``): dsh
    #: killed it; None when it ended by itself.
    stopped: str | None
    #: Seconds from start to the end of the program (and of everything it started).
    duration: float
    #: The sandbox record (:attr:`Popen.sandbox`): policy, backend, abi, namespaces, … —
    #: ``{}`` when the program did not start.
    sandbox: dict[str, Any]
    #: The ledger event written (``x/PLUGIN/sandbox``), or None (outside a tool call).
    recorded: str | None = None

    @property
    def timed_out(self) -> bool:
        return self.stopped == TIMEOUT

    @property
    def aborted(self) -> bool:
        return self.stopped == ABORTED

    @property
    def exit_code(self) -> int | None:
        """The exit code, or None when it was killed by a signal (or never started)."""
        return self.returncode if self.returncode is not None and self.returncode >= 0 \
            else None

    @property
    def signal(self) -> int | None:
        """The number of the signal that killed it, or None."""
        return -self.returncode if self.returncode is not None and self.returncode < 0 \
            else None

    @property
    def ok(self) -> bool:
        """Exit code 0 and not stopped by dsh."""
        return self.returncode == 0 and self.stopped is None


class Stream:
    """One output stream: its size, its first bytes and its last ``keep // 4`` bytes
    (``keep`` in all, whatever the program prints)."""

    def __init__(self, keep: int) -> None:
        self.tail_keep = keep // 4
        self.head_keep = keep - self.tail_keep
        self.size = 0
        self.head = bytearray()
        self.tail = bytearray()

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        room = self.head_keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_keep:
            self.tail += data[-self.tail_keep:]
            if len(self.tail) > self.tail_keep:
                del self.tail[: len(self.tail) - self.tail_keep]

    @property
    def cut(self) -> int:
        """Bytes printed and not kept."""
        return self.size - len(self.head) - len(self.tail)

    def value(self, text: bool) -> str | bytes:
        """All of it when it was kept whole, else its head, ``[… N bytes cut …]`` and its
        tail; as text, cut on character boundaries (a sequence split at the end of the head
        is held back, continuation bytes at the start of the tail are dropped)."""
        hidden = self.cut
        if not text:
            if not hidden:
                return bytes(self.head + self.tail)
            return bytes(self.head) + f"\n[… {hidden} bytes cut …]\n".encode() + \
                bytes(self.tail)
        if not hidden:
            return bytes(self.head + self.tail).decode("utf-8", errors="replace")
        import codecs

        first = codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(self.head))
        end = bytes(self.tail)
        skip = 0
        while skip < len(end) and skip < 3 and end[skip] & 0xC0 == 0x80:
            skip += 1
        return f"{first}\n[… {hidden} bytes cut …]\n" + end[skip:].decode("utf-8", "replace")


def run(argv: Sequence[str | os.PathLike[str]], *, cwd: str | os.PathLike[str],
        timeout: float, max_output: int = 64 * 1024, policy: Policy | None = None,
        workspace: str | os.PathLike[str] | None = None,
        env: Mapping[str, str | None] | None = None, inherit_env: bool = True,
        stdin: bytes | str | None = None, text: bool = True, cancel: Any = None,
        record: bool = True, output_limit: int | None = None,
        read_only: Sequence[str] = (), protected: Sequence[str | None] = (),
        launcher: bool = False) -> Result:
    """Run ``argv`` confined by ``policy`` (default: the current agent's) in ``cwd`` and wait
    for it, at most ``timeout`` seconds; see the module's docstring for what it does.

    :param workspace: the sandbox's workspace (default ``cwd``; ``cwd`` may lie beneath it).
    :param max_output: bytes kept of each stream (its first ¾ and last ¼).
    :param env: variables added to the allowlisted environment (``None`` removes one);
        with ``inherit_env=False``, the whole environment (``TMPDIR`` is always the
        program's private temp directory).
    :param stdin: bytes (or text, UTF-8) written to its standard input; None: ``/dev/null``.
    :param text: decode the output as UTF-8 (errors replaced); False: ``bytes``.
    :param cancel: a :class:`~dsh.host.runcontext.CancelToken` (default: the current run's):
        when it fires the program is killed and the result is ``stopped="aborted"``; one that
        has fired already starts nothing.
    :param record: append ``x/PLUGIN/sandbox`` inside a tool call.
    :param output_limit: bytes of output (both streams) after which it is killed
        (``stopped="output"``): default 16 × ``max_output``, at least 8 MiB.
    :param read_only, protected, launcher: as :class:`~dsh.sandbox.spawn.Popen`'s.
    :raises SandboxUnavailable: the kernel cannot apply the policy (nothing ran).
    :raises FileNotFoundError, PermissionError: the program is missing, or not executable.
    :raises ConfigError: the policy would grant one of dsh's own files.
    :raises UsageError: no ``policy`` outside a run, or a bad argument.
    """
    from dsh.core.errors import UsageError
    from dsh.host.runcontext import current_or_none
    from dsh.sandbox.environment import allowed_env
    from dsh.sandbox.environment import harden
    from dsh.sandbox.spawn import Popen

    args = [os.fspath(a) for a in argv]
    if not args:
        raise UsageError("sandbox.run: argv is empty")
    if not timeout > 0:
        raise UsageError(f"sandbox.run: timeout must be positive seconds, not {timeout!r}")
    if max_output < 0:
        raise UsageError(f"sandbox.run: max_output must be >= 0, not {max_output!r}")
    where = os.path.abspath(os.fspath(cwd))
    root = os.path.abspath(os.fspath(workspace)) if workspace is not None else where
    call = _current_call()
    ctx = current_or_none()
    policy = _narrowed(policy if policy is not None else _agent_policy(call, ctx), ctx)
    if cancel is None and ctx is not None:
        cancel = ctx.cancel
    if cancel is not None and cancel.cancelled:
        return Result(tuple(args), None, "" if text else b"", "" if text else b"", 0, 0,
                      False, ABORTED, 0.0, {})
    child_env = allowed_env(where) if inherit_env else {}
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[str(key)] = str(value)
    limit = output_limit if output_limit is not None else max(16 * max_output, 8 << 20)
    harden()  # before the first child: it cannot read dsh's memory or environment
    start = time.monotonic()
    proc = Popen(args, policy, workspace=root, cwd=where, env=child_env,
                 stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                 read_only=read_only, protected=protected, launcher=launcher)
    group = _Group(proc)
    forget = None
    try:
        recorded = _record(call, proc.sandbox) if record else None
        if cancel is not None:  # from the cancelling thread, at once if it has fired
            forget = cancel.on_cancel(group.kill)
        if stdin is not None:
            data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
            threading.Thread(target=_feed, args=(proc, data), daemon=True,
                             name="dsh-sandbox-stdin").start()
        assert proc.stdout is not None and proc.stderr is not None
        out, err = Stream(max_output), Stream(max_output)
        stopped = _pump(proc, group, {proc.stdout.fileno(): out, proc.stderr.fileno(): err},
                        start + timeout, limit)
    except BaseException:  # Ctrl-C, SIGTERM: nothing of it outlives dsh's wait
        group.kill()
        group.reap()
        _close(proc)
        raise
    finally:
        if forget is not None:
            forget()
    group.kill()  # ended or stopped: whatever it left in its group goes too
    group.reap()
    _close(proc)
    if cancel is not None and cancel.cancelled:
        stopped = ABORTED
    return Result(tuple(args), proc.returncode, out.value(text), err.value(text), out.size,
                  err.size, bool(out.cut or err.cut), stopped, time.monotonic() - start,
                  dict(proc.sandbox), recorded)


class _Group:
    """The program's process group, killed at most until it is reaped (never a reused pid:
    the kill and the reap take one lock, and the leader is reaped last)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lock = threading.Lock()
        self.reaped = False

    def kill(self) -> None:
        with self.lock:
            if self.reaped:
                return
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def exited(self) -> bool:
        """Whether the leader has exited, without reaping it (its pid stays taken)."""
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None and info.si_pid != 0

    def reap(self) -> None:
        with self.lock:
            self.reaped = True
        self.proc.wait()  # Popen.wait: also removes its temp dir, quarantines what it made


def _pump(proc: subprocess.Popen[bytes], group: _Group, streams: dict[int, Stream],
          deadline: float, limit: int) -> str | None:
    """Read the pipes into ``streams`` until both end, or the program has exited (its group
    is then killed) and nothing more is waiting. ``"timeout"`` at ``deadline``,
    ``"output"`` past ``limit`` bytes, ``"aborted"`` when the group was killed by an abort
    (the pipes then close), else None."""
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
            return TIMEOUT
        exited = group.exited()
        if exited:
            group.kill()  # a background child must not hold the pipes (or the call)
        wait_ms = 0 if exited else int(min(deadline - now, 0.1) * 1000) + 1
        events = poller.poll(wait_ms)
        if not events and exited:
            break
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
                return OUTPUT
    while not group.exited():  # pipes closed (or drained) but the leader still runs
        if time.monotonic() >= deadline:
            return TIMEOUT
        time.sleep(0.01)
    return None


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _close(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _current_call() -> Any:
    """The tool call being executed, or None. dsh.sandbox sits beside dsh.tools, not above
    it (the layer contracts): the registry is looked up, as dsh.ledger.owners does — if it
    is not loaded, no tool call is running."""
    import sys

    registry = sys.modules.get("dsh.tools.registry")
    if registry is None:
        return None
    try:
        return registry.current_call()
    except LookupError:
        return None


def _agent_policy(call: Any, ctx: Any) -> Policy:
    """The policy of the agent whose tool call (or run) is current."""
    from dsh.core.errors import NoRunContext
    from dsh.core.errors import UsageError
    from dsh.sandbox import policy_for

    for owner in (call, ctx):
        if owner is None:
            continue
        try:
            handle = owner.handle
        except (AttributeError, NoRunContext):
            continue
        return policy_for(handle)
    raise UsageError("sandbox.run: no policy given and no agent's run or tool call is "
                     "current: pass policy= (dsh.sandbox.policy_for(agent))")


def _narrowed(policy: Policy, ctx: Any) -> Policy:
    """In a run of mode ``read-only`` or ``plan``, ``workspace-write`` becomes read-only."""
    if ctx is not None and getattr(ctx, "mode", "") in ("read-only", "plan") and \
            policy.mode == "workspace-write":
        return attrs.evolve(policy, mode="read-only")
    return policy


def _record(call: Any, sandbox: dict[str, Any]) -> str | None:
    """``x/PLUGIN/sandbox`` with the call's id and tool (inside a tool call), else None."""
    if call is None:
        return None
    from dsh.core.errors import NoRunContext
    from dsh.ledger.owners import APP
    from dsh.ledger.plugin_events import record_event

    plugin = getattr(call.tool, "plugin", "") or APP
    try:
        record_event(plugin, "sandbox", {"call_id": call.call.id, "tool": call.call.name,
                                         **sandbox})
    except NoRunContext:
        return None
    return f"x/{plugin}/sandbox"
