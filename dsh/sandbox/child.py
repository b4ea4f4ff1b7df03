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
"""

from __future__ import annotations

import functools
import os
import struct
from typing import Any

from dsh.sandbox import exec as launcher

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

    def __init__(self, network: bool, rules: tuple[tuple[str, str], ...]) -> None:
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
        self._report = bytearray(2)
        self._write, self._exit = os.write, os._exit

    def __call__(self) -> None:
        """In the child, between ``fork`` and ``execve``: confine this process, or report
        which call failed and ``_exit(126)``. Only prepared calls; see the module's text."""
        for kind, fn, args, tolerated in self._steps:
            if fn(*args) < 0:
                err = self._errno()
                if err in tolerated:
                    continue
                self._report[0] = kind
                self._report[1] = err & 0xFF
                self._write(self._status_w, self._report)
                self._exit(126)

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
            data = os.read(self._status_r, 2)
        except BlockingIOError:
            data = b""
        self.close()
        if len(data) == 2 and data[0] < len(_NAMES):
            return f"{_NAMES[data[0]]} failed: {os.strerror(data[1])}"
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
