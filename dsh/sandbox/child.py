"""The confined child, prepared by the parent: what :class:`dsh.sandbox.spawn.Popen` runs as
``subprocess``'s ``preexec_fn`` between ``fork`` and ``execve`` (docs/security.md, "How the
child is confined").

Everything that can be done before the fork is done in the parent, by :class:`Confinement`:
the kernel checks (:func:`dsh.sandbox.exec.precheck`), the Landlock ruleset — created, every
path opened ``O_PATH|O_NOFOLLOW``, checked and added, so the child only has to restrict itself
with the ruleset's descriptor — the seccomp program and its ``struct sock_fprog``, the
capability structures, and every system call's arguments as C ``long`` objects. What the
child runs, :meth:`Confinement.__call__`, is then one loop over about 45 prepared calls
through ``ctypes`` function pointers resolved in the parent (``syscall(2)``, ``prctl(2)``): no
import, no lookup of a symbol, no lock, no file opened, no Python object built but the ones a
foreign call makes. A call that fails writes two bytes (which call, ``errno``) on a pipe and
the child ``_exit``'s with 126 — it never reaches ``execve``; the parent reads the pipe and
raises :class:`dsh.sandbox.spawn.SandboxUnavailable` with the same one-line reason the
launcher gives.

Order, as in the launcher: ``NO_NEW_PRIVS``; the capability bounding set, then ``capset`` to
nothing; ``landlock_restrict_self``; the seccomp filter. Then ``subprocess`` closes every other
descriptor (the ruleset's among them) and ``execve``'s the command.

With namespaces (where this machine can make them: :func:`namespaces_unavailable`), those
steps are preceded by :class:`dsh.sandbox.namespaces.Namespaces`, prepared here as well: in the
child, a user, mount and PID namespace, the persistence paths bound read-only, then the
command's process forked twice (the namespace's init, then the command; the child itself
becomes the relay ``Popen`` waits for) and a fresh ``/proc``. Those steps are Python code,
not one loop of foreign calls: ``os`` functions (``open``, ``write``, ``pipe``, ``waitpid``,
``kill``, ``read``) and ``select.poll``, which take no lock, besides the prepared calls.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
from typing import Any

from dsh.sandbox import exec as launcher
from dsh.sandbox import namespaces as ns_steps

#: What each kind of call is called in a failure's reason (the launcher's words).
_NAMES = ("prctl(NO_NEW_PRIVS)", "prctl(CAPBSET_DROP)", "capset", "landlock_restrict_self",
          "seccomp")
_EINVAL = 22

_LIBC: launcher._Libc | None = None


def _libc() -> launcher._Libc:
    """The process's ``syscall``/``prctl`` function pointers, resolved once, and called once
    here so that nothing (a lazy PLT binding in ``_ctypes`` or libffi) is left to resolve in
    a child."""
    global _LIBC
    if _LIBC is None:
        libc = launcher._Libc()
        libc.prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS: harmless, warms the call path
        libc.errno()
        _LIBC = libc
    return _LIBC


@functools.lru_cache(maxsize=1)
def _cap_drops() -> tuple[tuple[Any, ...], ...]:
    """The steps that empty the capability bounding set: the same for every command."""
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63  # past the last one, prctl says EINVAL: tolerated
    libc = _libc()
    # EPERM: no CAP_SETPCAP, so the bounding set is not ours to drop (not root)
    return tuple(_call(libc, libc._prctl, 1, launcher.PR_CAPBSET_DROP, cap, 0, 0, 0,
                       tolerated=(launcher.EPERM, _EINVAL)) for cap in range(last + 1))


def _call(libc: launcher._Libc, fn: Any, kind: int, *args: int,
          tolerated: tuple[int, ...] = ()) -> tuple[Any, ...]:
    """One step of the child: ``fn(*args)`` with every argument a C ``long`` made now."""
    return (kind, fn, tuple(libc._long(a) for a in args), tolerated)


@functools.lru_cache(maxsize=2)
def _seccomp_code(machine: str, network: bool) -> bytes:
    return launcher.seccomp_program(machine, network)


class Confinement:
    """The confinement of one command by a plan's ``network`` and ``rules``
    (:class:`dsh.sandbox.policy.Plan`), built in the parent; raises
    :class:`dsh.sandbox.exec.Refused` when the kernel cannot apply it (the launcher's
    reasons). Call it in the child (``preexec_fn``); afterwards call :meth:`outcome` in the
    parent, which also releases what it holds."""

    def __init__(self, network: bool, rules: tuple[tuple[str, str], ...],
                 namespaces: tuple[Any, Any, bool] | None = None) -> None:
        libc = _libc()
        machine, self.abi = launcher.precheck(libc)
        self.ruleset = launcher.build_ruleset(libc, self.abi,
                                              {"network": network, "rules": rules})
        try:
            self._status_r, self._status_w = os.pipe()  # both close-on-exec
        except OSError:
            os.close(self.ruleset)
            raise
        self._open = True
        #: ``(roots, binds, pid)`` of a plan with namespaces (:class:`ns_steps.Namespaces`).
        self._ns: ns_steps.Namespaces | None = None
        self._roots: Any = () if namespaces is None else namespaces[0]
        self._binds: Any = () if namespaces is None else namespaces[1]
        if namespaces is not None:
            roots, binds, pid = namespaces
            rights = launcher.READ_RIGHTS & launcher.FS_BY_ABI.get(self.abi,
                                                                   launcher.FS_BY_ABI[5])
            self._ns = ns_steps.Namespaces(libc, machine, roots, binds, pid, self.ruleset,
                                           rights)
            self._ns.fail = self._fail_namespace
        sys_capset = launcher.ARCHES[machine][2]
        header = libc.buffer(struct.pack("Ii", launcher.CAP_VERSION_3, 0))
        data = libc.buffer(bytes(24))
        code = libc.buffer(_seccomp_code(machine, network))
        fprog = libc.buffer(struct.pack("=HxxxxxxQ", len(code) // 8, libc.address(code)))
        #: Kept alive with this object: the child passes their addresses.
        self._buffers = (header, data, code, fprog)
        self._steps = (
            _call(libc, libc._prctl, 0, launcher.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
            *_cap_drops(),
            _call(libc, libc._syscall, 2, sys_capset, libc.address(header), libc.address(data)),
            _call(libc, libc._syscall, 3, launcher.SYS_RESTRICT_SELF, self.ruleset, 0),
            _call(libc, libc._prctl, 4, launcher.PR_SET_SECCOMP, launcher.SECCOMP_MODE_FILTER,
                  libc.address(fprog), 0, 0),
        )
        self._errno = libc._c.get_errno
        self._report = bytearray(3)
        self._write, self._exit = os.write, os._exit

    def __call__(self) -> None:
        """In the child, between ``fork`` and ``execve``: confine this process, or report
        which call failed and ``_exit(126)``. Only prepared calls; see the module's text."""
        ns = self._ns
        if ns is not None:
            ns.enter()
            ns.spawn()  # with a PID namespace, returns in the command's process only
            ns.inside()
        for kind, fn, args, tolerated in self._steps:
            if fn(*args) < 0:
                err = self._errno()
                if err in tolerated:
                    continue
                self._fail(kind, err, 0)

    def _fail(self, code: int, err: int, arg: int) -> None:
        """Report a call that failed — ``code`` indexes :data:`_NAMES`, then the namespace
        steps (:data:`dsh.sandbox.namespaces.NS_STEPS`) — on the status pipe; ``_exit(126)``."""
        self._report[0] = code
        self._report[1] = err & 0xFF
        self._report[2] = arg & 0xFF
        self._write(self._status_w, self._report)
        self._exit(126)

    def _fail_namespace(self, step: int, err: int, arg: int) -> None:
        self._fail(len(_NAMES) + step, err, arg)

    def outcome(self) -> str | None:
        """In the parent, once ``subprocess`` has returned (the child has exec'd or exited):
        None when the child confined itself, else the reason it did not. Closes the
        ruleset and the pipe."""
        if not self._open:
            return None
        self.close_child_end()
        os.set_blocking(self._status_r, False)
        try:
            # Another thread's child forked meanwhile may hold the write end until its own
            # exec: what our child wrote is there already, so never wait for EOF.
            data = os.read(self._status_r, 3)
        except BlockingIOError:
            data = b""
        self.close()
        if len(data) == 3 and data[0] < len(_NAMES):
            return f"{_NAMES[data[0]]} failed: {os.strerror(data[1])}"
        if len(data) == 3:
            return ns_steps.step_reason(data[0] - len(_NAMES), data[1], data[2], self._roots,
                                        self._binds)
        return None

    def close_child_end(self) -> None:
        if self._status_w >= 0:
            os.close(self._status_w)
            self._status_w = -1

    def close(self) -> None:
        """Release the ruleset and the pipe (idempotent)."""
        if self._open:
            self._open = False
            self.close_child_end()
            os.close(self._status_r)
            os.close(self.ruleset)


_NS_STATE: list[str] = []  # [] not tried yet; [""] usable; [why] not
_ns_lock = threading.Lock()


def namespaces_unavailable() -> str:
    """``""`` when commands can get their own namespaces here, else why not (a user
    namespace refused: ``kernel.unprivileged_userns_clone = 0``, ``user.max_user_namespaces
    = 0``, a container's seccomp or AppArmor profile; a ``/proc`` that cannot be mounted
    again). Tried once per process, in a forked child the way a command is started."""
    if not _NS_STATE:
        with _ns_lock:
            if not _NS_STATE:
                _NS_STATE.append(_try_namespaces())
    return _NS_STATE[0]


def _try_namespaces() -> str:
    import shutil
    import subprocess
    import sys
    import tempfile

    machine = os.uname().machine
    if machine not in ns_steps.NS_CALLS:
        return f"no namespace support for this architecture ({machine})"
    libc = _libc()
    tmp = tempfile.mkdtemp(prefix="dsh-sandbox-ns-")
    r = w = -1
    try:
        probe = os.path.join(tmp, "probe")
        os.close(os.open(probe, os.O_CREAT | os.O_WRONLY, 0o600))
        ns = ns_steps.Namespaces(libc, machine, (tmp,), ((0, "probe", True),), pid=True)
        r, w = os.pipe()
        report = bytearray(3)

        def failed(step: int, err: int, arg: int) -> None:
            report[0], report[1], report[2] = step, err & 0xFF, arg & 0xFF
            os.write(w, report)
            os._exit(126)

        ns.fail = failed
        try:
            # never exec'd: the trial's processes exit from the preexec_fn
            proc = subprocess.Popen([sys.executable or "python3"],
                                    preexec_fn=lambda: ns_steps.trial(ns, probe),
                                    close_fds=True, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    cwd=tmp)
        except RuntimeError:  # a subinterpreter: no preexec_fn; the launcher tries instead
            return _try_in_launcher()
        except (OSError, subprocess.SubprocessError) as exc:
            return f"the trial could not start: {exc}"
        proc.wait()
        os.close(w)
        w = -1
        os.set_blocking(r, False)
        try:
            data = os.read(r, 3)
        except BlockingIOError:
            data = b""
        status = (-proc.returncode if proc.returncode < 0 else proc.returncode << 8)
        return ns_steps.trial_outcome(status, data, (tmp,), ns.binds)
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)


def _try_in_launcher() -> str:
    import json
    import subprocess

    from dsh.sandbox.spawn import INTERPRETER
    from dsh.sandbox.spawn import LAUNCH

    out = subprocess.run([INTERPRETER, *LAUNCH, "--probe"], capture_output=True, text=True,
                         check=False)
    try:
        found = str(json.loads(out.stdout).get("namespaces", "not probed"))
    except ValueError:
        return f"the launcher failed: {out.stderr.strip()}"
    return "" if found == "ok" else found
