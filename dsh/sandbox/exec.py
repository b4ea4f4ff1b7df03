"""The sandbox launcher: apply a policy to this process, then ``execve`` the command.

Started by :class:`dsh.sandbox.spawn.Popen` as ``python -I -S -c "…import exec…" POLICY_FD
STATUS_FD -- CMD ARGS…`` (imported by a one-line ``-c`` so its bytecode is cached; running
it by path or as ``python -m dsh.sandbox.exec`` works too). ``Popen`` confines its forked
child directly (:mod:`dsh.sandbox.child`, which reuses :func:`precheck`,
:func:`build_ruleset` and :func:`seccomp_program` from here); this separate program serves
what a ``preexec_fn`` cannot: :func:`dsh.sandbox.spawn.wrap` (a process someone else starts),
subinterpreters and ``Popen(…, launcher=True)``. It imports only the standard library (no
``dsh``, no site-packages: ``-S``; ``_ctypes``, not ``ctypes``) so that it starts as fast as
Python can.

What it does, in order:

1. reads the policy (NUL-separated fields, :func:`decode`) from ``POLICY_FD`` (then closes
   it);
2. builds a Landlock ruleset — the filesystem rights of every ABI the kernel has, TCP bind and
   connect when the policy has no network, signal and abstract-socket scoping — and adds one
   rule per granted path (each opened ``O_PATH|O_NOFOLLOW`` and checked to be the path the
   parent resolved, so a symlink swapped in meanwhile is refused), before the capabilities go,
   as the forked-child path builds it in dsh;
3. ``prctl(PR_SET_NO_NEW_PRIVS)``: no set-uid program can gain privileges afterwards;
4. drops every capability (bounding set, then ``capset`` to nothing): a root dsh does not hand
   ``CAP_DAC_OVERRIDE`` or ``CAP_SYS_PTRACE`` to the command; then restricts itself with the
   ruleset;
5. installs a seccomp filter (a BPF program assembled here) for what Landlock cannot say:
   sockets other than Unix stream sockets, ``connect``/``bind``/``listen`` (no network),
   and always ``ptrace``, ``process_vm_*``, ``io_uring_*``, the kernel keyring, ``bpf``,
   ``perf_event_open``;
6. writes ``A <abi>`` on ``STATUS_FD`` (close-on-exec) and ``execvp``'s the command.

When the plan asks for namespaces (:mod:`dsh.sandbox.namespaces`, docs/execution.md "The
sandbox of a tool call"), they come between steps 2 and 3: a user namespace (the same ids), a
mount namespace in which each persistence path is a read-only bind mount, and — for a tool
call — a PID namespace with a fresh ``/proc``, whose steps 3–6 run in the command's own
process, a grandchild: the launcher stays outside as the relay that ``Popen`` waits for, the
namespace's init reaps orphans until the command exits, then the kernel kills whatever the
command left behind.

Any failure before ``exec`` is one line ``E <why>`` on ``STATUS_FD`` and exit status 126
(``N <why>``/127 when the program is not found): the parent turns it into an error and the
command never runs unconfined (fail closed). ``--inline PLAN_BASE64`` in place of the two
descriptors (:func:`dsh.sandbox.spawn.wrap`, for code that starts the process itself) reports
a failure as one ``dsh: sandbox: …`` line on stderr instead. ``--probe`` prints what the
kernel supports as JSON (``dsh sandbox check``).
"""

from __future__ import annotations

import os
import struct
import sys

TYPE_CHECKING = False  # not `typing`: importing it would cost the launcher ~1 ms
if TYPE_CHECKING:
    from typing import Any

# Landlock (include/uapi/linux/landlock.h)
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
#: Filesystem rights handled by each ABI (1: 13 rights; 2: REFER; 3: TRUNCATE; 5: IOCTL_DEV).
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
             5: (1 << 16) - 1}
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_RIGHTS = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
DEVICE_RIGHTS = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
#: The oldest ABI the launcher accepts: 6 scopes signals and abstract Unix sockets, without
#: which a command could signal dsh or talk to an abstract socket outside the sandbox.
MIN_ABI = 6

PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECCOMP = 38, 24, 22
SECCOMP_MODE_FILTER = 2
CAP_VERSION_3 = 0x20080522
EPERM, EACCES, EAFNOSUPPORT = 1, 13, 97
AF_UNIX, SOCK_STREAM, SOCK_SEQPACKET = 1, 1, 5

#: Per architecture: the audit arch, the syscall numbers the filter names, capset.
ARCHES = {
    "x86_64": (0xC000003E, {
        "socket": 41, "connect": 42, "bind": 49, "listen": 50, "socketpair": 53,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "add_key": 248, "request_key": 249, "keyctl": 250, "perf_event_open": 298,
        "bpf": 321}, 126),
    "aarch64": (0xC00000B7, {
        "socket": 198, "socketpair": 199, "bind": 200, "listen": 201, "connect": 203,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "add_key": 217, "request_key": 218, "keyctl": 219, "perf_event_open": 241,
        "bpf": 280}, 91),
}
ALWAYS_DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "io_uring_setup",
                 "io_uring_enter", "io_uring_register", "add_key", "request_key", "keyctl",
                 "perf_event_open", "bpf")
NO_NETWORK_DENIED = ("connect", "bind", "listen")


class Refused(Exception):
    """The policy cannot be applied: the command must not run."""


class _Libc:
    """``syscall(2)`` and ``prctl(2)`` through ``_ctypes``, the C core of ``ctypes``: importing
    ``ctypes`` itself costs ~10 ms more CPU per command (its module body; benchmarks/
    sandbox.py), ``_ctypes`` ~1 ms. Every argument is passed as a C ``long`` or as a pointer
    to a buffer, which is what both calls take."""

    def __init__(self) -> None:
        import _ctypes

        c: Any = _ctypes  # typed loosely: its stubs describe ctypes' own classes

        class Long(c._SimpleCData):
            _type_ = "l"

        class Char(c._SimpleCData):
            _type_ = "c"

        class Fn(c.CFuncPtr):
            _flags_ = c.FUNCFLAG_CDECL | c.FUNCFLAG_USE_ERRNO
            _restype_ = Long

        class Lib:  # what CFuncPtr looks a symbol up in: the process's own libc
            _handle = c.dlopen(None, c.RTLD_LOCAL)

        self._c: Any = c
        self._arrays: dict[int, Any] = {}
        self._long, self._char = Long, Char
        self._syscall = Fn(("syscall", Lib))
        self._prctl = Fn(("prctl", Lib))
        # For the namespaces' relay and init. fork of the libc, not a raw clone: it runs the
        # libc's own fork handlers and keeps its thread data right in the child.
        self._fork = Fn(("fork", Lib))
        self._memset = Fn(("memset", Lib))

    def buffer(self, data: bytes) -> Any:
        """A C array holding a copy of ``data`` (passed as a pointer)."""
        size = max(len(data), 1)
        buf = self._arrays.get(size)
        if buf is None:  # one class per size: building a class costs more than the call
            array: Any = self._c.Array

            class Buf(array):
                _type_ = self._char
                _length_ = size

            buf = self._arrays[size] = Buf
        return buf.from_buffer_copy(data or b"\0")

    def address(self, buf: Any) -> int:
        return int(self._c.addressof(buf))

    def _args(self, args: tuple[Any, ...]) -> list[Any]:
        return [a if isinstance(a, self._c.Array) else self._long(a) for a in args]

    def syscall(self, *args: Any) -> int:
        return int(self._syscall(*self._args(args)))

    def prctl(self, *args: Any) -> int:
        return int(self._prctl(*self._args(args)))

    def errno(self) -> int:
        return int(self._c.get_errno())


def landlock_abi(libc: _Libc | None = None) -> tuple[int, str]:
    """``(abi, why)``: the kernel's Landlock ABI version (0 when none, with the reason)."""
    libc = libc or _Libc()
    abi = libc.syscall(SYS_CREATE_RULESET, 0, 0, CREATE_RULESET_VERSION)
    if abi < 0:
        err = libc.errno()
        why = {38: "the kernel has no Landlock (ENOSYS)",
               95: "Landlock is disabled at boot (EOPNOTSUPP: not in lsm=)",
               1: "Landlock is forbidden here (EPERM: a seccomp filter or container)"}
        return 0, why.get(err, f"landlock_create_ruleset failed: {os.strerror(err)}")
    return int(abi), ""


def _check(libc: _Libc, result: int, what: str) -> None:
    if result < 0:
        raise Refused(f"{what} failed: {os.strerror(libc.errno())}")


def namespaces_module() -> Any:
    """:mod:`dsh.sandbox.namespaces`: by its package in dsh, from this directory (which the
    launcher puts on ``sys.path``) in the launcher."""
    if __package__:
        from dsh.sandbox import namespaces
    else:
        import namespaces  # type: ignore[import-not-found,no-redef]
    return namespaces


def apply(policy: dict[str, Any], fail: Any = None) -> int:
    """Confine this process by ``policy``; return the Landlock ABI used. With namespaces in
    the policy, first :class:`dsh.sandbox.namespaces.Namespaces` (``fail(step, errno, arg)``
    reports a step that failed and never returns): with a PID namespace this returns only in
    the command's process, a grandchild, this one becoming its relay."""
    libc = _Libc()
    machine, abi = precheck(libc)
    # Built before the capabilities go, as the forked-child path builds it in dsh.
    ruleset = build_ruleset(libc, abi, policy)
    try:
        ns = policy.get("ns")
        if ns is not None:
            fs = FS_BY_ABI.get(abi, FS_BY_ABI[5])
            spaces = namespaces_module().Namespaces(
                libc, machine, policy["roots"], policy["binds"], ns == "pid", ruleset,
                READ_RIGHTS & fs)
            spaces.fail = fail
            spaces.enter()
            spaces.spawn()
            spaces.inside()
        _check(libc, libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        _drop_capabilities(libc, ARCHES[machine][2])
        _check(libc, libc.syscall(SYS_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    _seccomp(libc, machine, bool(policy.get("network")))
    return abi


def precheck(libc: _Libc | None = None) -> tuple[str, int]:
    """``(machine, abi)`` when this kernel can apply a policy, else :class:`Refused` saying
    why (no seccomp filter for the architecture, no Landlock, too old an ABI)."""
    machine = os.uname().machine
    if machine not in ARCHES:
        raise Refused(f"no seccomp filter for this architecture ({machine})")
    abi, why = landlock_abi(libc)
    if abi == 0:
        raise Refused(why)
    if abi < MIN_ABI:
        raise Refused(f"the kernel's Landlock ABI is {abi}; dsh needs {MIN_ABI} or newer "
                      "(signal and abstract-socket scoping)")
    return machine, abi


def _drop_capabilities(libc: _Libc, sys_capset: int) -> None:
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = libc.errno()
            if err == 22:  # EINVAL: past the last capability this kernel knows
                break
            if err != EPERM:  # EPERM: no CAP_SETPCAP, so there is nothing to drop
                raise Refused(f"prctl(CAPBSET_DROP) failed: {os.strerror(err)}")
    header = libc.buffer(struct.pack("Ii", CAP_VERSION_3, 0))
    data = libc.buffer(bytes(24))
    _check(libc, libc.syscall(sys_capset, header, data), "capset")


def build_ruleset(libc: _Libc, abi: int, policy: dict[str, Any]) -> int:
    """A Landlock ruleset (a close-on-exec descriptor) holding ``policy``'s rules, every
    path opened and checked now; the caller restricts itself with it and closes it."""
    fs = FS_BY_ABI.get(abi, FS_BY_ABI[5])
    net = 0 if policy.get("network") else NET_BIND_TCP | NET_CONNECT_TCP
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    attr = struct.pack("QQQ", fs, net, scoped)
    ruleset = libc.syscall(SYS_CREATE_RULESET, libc.buffer(attr), len(attr), 0)
    _check(libc, ruleset, "landlock_create_ruleset")
    try:
        for path, kind in policy.get("rules", ()):
            rights = {"read": READ_RIGHTS, "write": fs, "device": DEVICE_RIGHTS,
                      "list": FS_READ_DIR}[kind]
            _add_path(libc, ruleset, path, rights & fs)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def _add_path(libc: _Libc, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"cannot open {path}: {exc.strerror}") from None
    try:
        # The parent resolved every path; one swapped for a symlink (or moved) since then is
        # not the path the policy names.
        real = os.readlink(f"/proc/self/fd/{fd}")
        if real != path:
            raise Refused(f"{path} changed before the sandbox was applied (now {real})")
        import stat

        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FS_FILE_RIGHTS
        rule = libc.buffer(struct.pack("=Qi", rights, fd))
        _check(libc, libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, rule, 0),
               f"landlock_add_rule({path})")
    finally:
        os.close(fd)


# Classic BPF, as seccomp reads it.
_LD_ABS, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000


def seccomp_program(machine: str, network: bool) -> bytes:
    """The filter for ``machine``: a list of ``struct sock_filter`` as bytes."""
    audit_arch, nrs, _ = ARCHES[machine]
    deny_eperm, deny_eacces, deny_family, allow = "eperm", "eacces", "family", "allow"
    prog: list[tuple[int, object, object, int]] = [
        (_LD_ABS, 0, 0, 4),                       # arch
        (_JEQ, 0, deny_eperm, audit_arch),
        (_LD_ABS, 0, 0, 0),                       # syscall number
    ]
    if machine == "x86_64":  # the x32 ABI: same arch, numbers with bit 30 set
        prog.append((_JGE, deny_eperm, 0, 0x40000000))
    for name in ALWAYS_DENIED:
        prog.append((_JEQ, deny_eperm, 0, nrs[name]))
    if not network:
        for name in NO_NETWORK_DENIED:
            prog.append((_JEQ, deny_eacces, 0, nrs[name]))
        prog.append((_JEQ, "sock", 0, nrs["socket"]))
        prog.append((_JEQ, "sock", 0, nrs["socketpair"]))
    prog.append((_RET, 0, 0, _ALLOW))
    labels: dict[str, int] = {}
    if not network:  # socket(AF_UNIX, SOCK_STREAM | SOCK_SEQPACKET [| flags]) only
        labels["sock"] = len(prog)
        prog += [(_LD_ABS, 0, 0, 16), (_JEQ, 0, deny_family, AF_UNIX),
                 (_LD_ABS, 0, 0, 24), (_AND, 0, 0, 0xF),
                 (_JEQ, allow, 0, SOCK_STREAM), (_JEQ, allow, 0, SOCK_SEQPACKET),
                 (_RET, 0, 0, _ERRNO | EACCES)]
        labels[deny_family] = len(prog)
        prog.append((_RET, 0, 0, _ERRNO | EAFNOSUPPORT))
    labels[allow] = len(prog)
    prog.append((_RET, 0, 0, _ALLOW))
    labels[deny_eacces] = len(prog)
    prog.append((_RET, 0, 0, _ERRNO | EACCES))
    labels[deny_eperm] = len(prog)
    prog.append((_RET, 0, 0, _ERRNO | EPERM))
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        out += struct.pack("=HBBI", code, _jump(jt, labels, i), _jump(jf, labels, i), k)
    return bytes(out)


def _jump(target: object, labels: dict[str, int], at: int) -> int:
    """A jump offset: to a label (counted from the next instruction), or a number as is."""
    if isinstance(target, str):
        delta = labels[target] - at - 1
        assert 0 <= delta < 256
        return delta
    return int(target)  # type: ignore[call-overload]


def _seccomp(libc: _Libc, machine: str, network: bool) -> None:
    code = libc.buffer(seccomp_program(machine, network))
    # struct sock_fprog: unsigned short len, (padding), struct sock_filter *filter
    prog = libc.buffer(struct.pack("=HxxxxxxQ", len(code) // 8, libc.address(code)))
    _check(libc, libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0), "seccomp")


def probe() -> dict[str, Any]:
    """What this machine supports, for ``dsh sandbox check``."""
    abi, why = landlock_abi()
    machine = os.uname().machine
    return {"landlock_abi": abi, "landlock_error": why, "min_abi": MIN_ABI,
            "machine": machine, "seccomp_filter": machine in ARCHES,
            "namespaces": namespaces_module().probe_namespaces(_Libc()) or "ok"}


def decode(data: bytes) -> dict[str, Any]:
    """The policy as the parent wrote it (:meth:`dsh.sandbox.policy.Plan.encode`): fields
    separated by NUL (no path holds one), ``network`` then ``0``/``1``, then pairs of a kind
    and a path — a rule (``read``, ``write``, ``device``, ``list``), or the namespaces:
    ``ns`` (``pid`` or ``mount``), ``root`` (a writable root), ``ro``/``rw`` (``INDEX:REL``,
    a bind mount beneath root INDEX). Not JSON: importing ``json`` would double the
    launcher's start-up."""
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    if len(fields) < 2 or fields[0] != "network" or fields[1] not in ("0", "1") or len(
            fields) % 2:
        raise ValueError("malformed policy")
    out: dict[str, Any] = {"network": fields[1] == "1", "rules": [], "roots": [],
                           "binds": []}
    for kind, path in zip(fields[2::2], fields[3::2], strict=True):
        if kind == "ns":
            out["ns"] = path
        elif kind == "root":
            out["roots"].append(path)
        elif kind in ("ro", "rw"):
            index, _, rel = path.partition(":")
            out["binds"].append((int(index), rel, kind == "ro"))
        else:
            out["rules"].append((path, kind))
    return out


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--probe"]:
        import json

        sys.stdout.write(json.dumps(probe()) + "\n")
        return 0
    if len(argv) < 5 or argv[3] != "--":
        sys.stderr.write("usage: exec.py POLICY_FD STATUS_FD -- CMD [ARG…]\n"
                         "       exec.py --inline PLAN_BASE64 -- CMD [ARG…]\n")
        return 2
    inline = argv[1] == "--inline"
    status = 2 if inline else int(argv[2])
    cmd = argv[4:]
    try:
        if inline:  # a program that starts the launcher itself (the MCP SDK): no pipes
            import binascii

            policy = decode(binascii.a2b_base64(argv[2]))
        else:
            os.set_inheritable(status, False)
            with os.fdopen(int(argv[1]), "rb") as f:
                policy = decode(f.read())

        def failed(step: int, err: int, arg: int) -> None:
            text = namespaces_module().step_reason(step, err, arg, policy["roots"],
                                                   policy["binds"])
            _report(status, inline, "E", text)
            os._exit(126)

        abi = apply(policy, failed)
    except (Refused, OSError, ValueError, KeyError, TypeError) as exc:
        text = str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"
        _report(status, inline, "E", text)
        return 126
    if not inline:
        os.write(status, f"A {abi}\n".encode())
    try:
        os.execvp(cmd[0], cmd)
    except FileNotFoundError:
        _report(status, inline, "N", cmd[0])
        return 127
    except OSError as exc:
        _report(status, inline, "X", exc.strerror or str(exc))
        return 126


def _report(status: int, inline: bool, tag: str, text: str) -> None:
    """A failure: ``TAG text`` on the status pipe, or one ``dsh: sandbox:`` line on stderr."""
    line = f"{tag} {text}"
    if inline:
        line = "dsh: sandbox: " + {
            "E": f"cannot confine the command ({text}); it was not run",
            "N": f"command not found: {text}"}.get(tag, f"cannot execute the command: {text}")
    os.write(status, line.encode(errors="replace") + b"\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
