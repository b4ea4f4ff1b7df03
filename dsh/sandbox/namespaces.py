"""Namespaces for a confined command: persistence paths read-only, a call's processes gone
with the call (docs/execution.md, "The sandbox of a tool call").

Used in the forked child by :class:`dsh.sandbox.child.Confinement` (everything prepared in
dsh before the fork) and by the launcher (:mod:`dsh.sandbox.exec`, which imports it from its
own directory: like it, this module imports only the standard library, and that lazily).

A command gets a user namespace (the same ids), a mount namespace in which each persistence
path is bound onto itself read-only (``open_tree`` / ``mount_setattr`` / ``move_mount`` on one
descriptor resolved beneath its root through no link), and — for a tool call — a PID
namespace: the child becomes the *relay* (what ``Popen`` waits for and signals), forks the
namespace's *init* (PID 1: forwards signals, reaps orphans), which forks the command (PID 2)
and mounts a fresh ``/proc``. When the command exits the init passes its status to the relay
and exits; the kernel kills whatever is left in the namespace; the relay exits as the
command did. The relay kills the namespace when dsh dies (a pidfd); the init exits when the
relay does (its status pipe polls ``POLLERR``).
"""

from __future__ import annotations

import os
import struct
import sys

TYPE_CHECKING = False  # not `typing`: importing it would cost the launcher ~1 ms
if TYPE_CHECKING:
    from typing import Any

SYS_ADD_RULE, RULE_PATH_BENEATH = 445, 1  # Landlock (dsh.sandbox.exec)

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
OPEN_TREE_CLONE, AT_EMPTY_PATH = 1, 0x1000
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x4, 0x40
MOUNT_ATTR_RDONLY = 1
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 2, 4, 8
#: The same on every architecture (the generic table, past the split): open_tree,
#: move_mount, openat2, mount_setattr.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_OPENAT2, SYS_MOUNT_SETATTR = 428, 429, 437, 442
#: Per architecture: unshare, mount, rt_sigprocmask, rt_sigaction, prlimit64, signalfd4.
NS_CALLS = {"x86_64": (272, 165, 14, 13, 302, 289), "aarch64": (97, 40, 135, 134, 261, 74)}
SIG_BLOCK, SIG_UNBLOCK, SIG_SETMASK = 0, 1, 2
SIGKILL, SIGCHLD = 9, 17
SI_KERNEL = 0x80
PR_SET_DUMPABLE, RLIMIT_CORE = 4, 4
ENOENT, ENOTDIR, EXDEV, EROFS, ELOOP, EINVAL = 2, 20, 18, 30, 40, 22
#: The pauses (seconds) between tries of an ``unshare`` that failed with EINVAL. A full test
#: run on a machine whose probe passed saw it once or twice in a thousand confinements, from
#: a fresh single-threaded child; a short pause and another try is what every later one got.
UNSHARE_RETRIES = (0.001, 0.005, 0.02, 0.1)
_MAXFD = 0x7FFFFFFF
#: What each step is called in a failure's reason (``step_reason``).
NS_STEPS = ("sigprocmask", "unshare", "write /proc/self/setgroups",
            "write /proc/self/uid_map", "write /proc/self/gid_map", "mount(MS_PRIVATE)",
            "open", "bind mount", "chdir", "fork", "mount(/proc)", "landlock_add_rule(/proc)",
            "signalfd")
(S_MASK, S_UNSHARE, S_SETGROUPS, S_UIDMAP, S_GIDMAP, S_PRIVATE, S_OPEN, S_BIND, S_CHDIR,
 S_FORK, S_PROC, S_PROC_RULE, S_SIGNALFD) = range(len(NS_STEPS))


def step_reason(step: int, err: int, arg: int, roots: Any = (), binds: Any = ()) -> str:
    """The one-line reason of a namespace step that failed (both paths give the same)."""
    why = os.strerror(err)
    if step == S_BIND and arg < len(binds):
        return f"read-only bind mount of {binds[arg][1]} failed: {why}"
    if step == S_OPEN and arg < len(roots):
        return f"cannot open {roots[arg]}: {why}"
    name = NS_STEPS[step] if step < len(NS_STEPS) else f"step {step}"
    return f"{name} failed: {why}"


class Namespaces:
    """The namespaces of one command, prepared before the fork: every buffer and constant the
    steps need is made here (in dsh for :class:`dsh.sandbox.child.Confinement`, in the
    launcher otherwise). ``libc`` is a :class:`dsh.sandbox.exec._Libc`; ``roots`` are the
    writable roots (resolved), ``binds`` ``(root index, relative path, read_only)`` in mount
    order (a directory before what lies in it); ``pid``: a PID namespace too (a tool call),
    not only user and mount (an MCP server); ``ruleset`` the command's Landlock ruleset, to
    which a rule granting ``rights`` on the fresh ``/proc`` is added.

    In the forked child: :meth:`enter` (signals blocked — the relay and the init read them
    from a ``signalfd`` —, ``unshare``, the id maps, mounts made private, the bind mounts, the
    working directory entered again through them), :meth:`spawn` (with ``pid``: returns only
    in the command's process, the grandchild; the child becomes the relay and never returns),
    then :meth:`inside` (a fresh ``/proc`` and its Landlock rule, the signal mask restored).
    ``fail(step, errno, arg)`` is set by the caller and never returns.
    """

    def __init__(self, libc: Any, machine: str, roots: Any, binds: Any, pid: bool,
                 ruleset: int = -1, rights: int = 0) -> None:
        import select
        import time

        (self._unshare, self._mount, self._sigmask, self._sigaction, self._prlimit,
         self._signalfd) = NS_CALLS[machine]
        self._libc = libc
        self.flags = CLONE_NEWUSER | CLONE_NEWNS | (CLONE_NEWPID if pid else 0)
        self.pid = pid
        uid, gid = os.geteuid(), os.getegid()
        self.maps = ((S_SETGROUPS, b"/proc/self/setgroups", b"deny"),
                     (S_UIDMAP, b"/proc/self/uid_map", b"%d %d 1\n" % (uid, uid)),
                     (S_GIDMAP, b"/proc/self/gid_map", b"%d %d 1\n" % (gid, gid)))
        self.roots = tuple(os.fsencode(r) for r in roots)
        self.binds = tuple((i, libc.buffer(os.fsencode(rel) + b"\0"), ro)
                           for i, rel, ro in binds)
        self._how = libc.buffer(struct.pack("QQQ", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
                                            0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
                                            | RESOLVE_NO_MAGICLINKS))
        self._rdonly = libc.buffer(struct.pack("QQQQ", MOUNT_ATTR_RDONLY, 0, 0, 0))
        self._empty, self._slash = libc.buffer(b"\0"), libc.buffer(b"/\0")
        self._proc, self._proc_dir = libc.buffer(b"proc\0"), libc.buffer(b"/proc\0")
        self._all = libc.buffer(struct.pack("Q", (1 << 64) - 1))
        self._old_mask = libc.buffer(bytes(8))
        self._zero = libc.buffer(bytes(32))  # a struct sigaction of SIG_DFL; an rlimit of 0
        self._unblock = libc.buffer(bytes(8))
        self.ruleset = ruleset
        self._rights = rights
        self._rule = libc.buffer(struct.pack("=Qi", self._rights, -1))
        self._argv = _argv_area() if pid else None
        self._fork = libc._fork
        self._memset = libc._memset
        self._poll, self._POLLIN = select.poll, select.POLLIN
        self._sleep = time.sleep
        self.ppid = 0
        self.cwd: bytes | None = None
        self.fail: Any = None

    def _sys(self, step: int, *args: Any, arg: int = 0) -> int:
        result = self._libc.syscall(*args)
        if result < 0:
            self.fail(step, self._libc.errno(), arg)
        return result

    def enter(self) -> None:
        """Block every signal, enter the new namespaces and make the bind mounts."""
        libc = self._libc
        self._sys(S_MASK, self._sigmask, SIG_BLOCK, self._all, self._old_mask, 8)
        self.ppid = os.getppid()
        try:
            self.cwd = os.getcwdb()
        except OSError:
            self.cwd = None
        for pause in (*UNSHARE_RETRIES, None):
            if libc.syscall(self._unshare, self.flags) >= 0:
                break
            err = libc.errno()
            if err != EINVAL or pause is None:
                self.fail(S_UNSHARE, err, 0)
            self._sleep(pause)  # a transient refusal: every signal is blocked meanwhile
        # The maps are /proc/self files: a non-dumpable process's belong to root, so a user
        # that is not root writes them dumpable (dsh-shell makes dsh non-dumpable); for the
        # few system calls that takes, a process of that user outside every sandbox could
        # read this copy of dsh, as it could any dsh before it is hardened.
        user = os.geteuid() != 0
        if user:
            libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        for step, path, data in self.maps:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
            except OSError as exc:
                self.fail(step, exc.errno or 0, 0)
        # A copy of dsh until the command's execve (which makes it dumpable again) — and the
        # relay and the init stay one: never dumped, their /proc files closed to others.
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        self._sys(S_PRIVATE, self._mount, 0, self._slash, 0, MS_REC | MS_PRIVATE, 0)
        dirs = []
        for i, root in enumerate(self.roots):
            try:
                dirs.append(os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            except OSError as exc:
                self.fail(S_OPEN, exc.errno or 0, i)
        for n, (i, rel, read_only) in enumerate(self.binds):
            # Resolved once, beneath its root, through no symbolic link: the mount's source
            # and its target are this one descriptor, so a path swapped meanwhile cannot
            # make the mount show one place at another.
            fd = libc.syscall(SYS_OPENAT2, dirs[i], rel, self._how, 24)
            if fd < 0:
                if libc.errno() in (ENOENT, ENOTDIR, ELOOP, EXDEV):
                    continue  # gone, or changed since the plan: nothing there to keep
                self.fail(S_BIND, libc.errno(), n)
            tree = libc.syscall(SYS_OPEN_TREE, fd, self._empty,
                                OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH)
            ok = tree >= 0 and (not read_only or libc.syscall(
                SYS_MOUNT_SETATTR, tree, self._empty, AT_EMPTY_PATH, self._rdonly, 32) >= 0) \
                and libc.syscall(SYS_MOVE_MOUNT, tree, self._empty, fd, self._empty,
                                 MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) >= 0
            err = libc.errno()
            if tree >= 0:
                os.close(tree)
            os.close(fd)
            if not ok:
                self.fail(S_BIND, err, n)
        for fd in dirs:
            os.close(fd)
        if self.cwd is not None:  # a working directory under a bind: enter it through it
            try:
                os.chdir(self.cwd)
            except OSError as exc:
                self.fail(S_CHDIR, exc.errno or 0, 0)

    def spawn(self) -> None:
        """With a PID namespace: fork its init, which forks the command's process; return in
        that one. This process becomes the relay (:meth:`_relay`), the init reaps."""
        if not self.pid:
            return
        r, w = os.pipe()  # the init writes the command's wait status; the relay reads it
        init = self._fork()
        if init < 0:
            self.fail(S_FORK, self._libc.errno(), 0)
        if init == 0:
            os.close(r)
            child = self._fork()
            if child < 0:
                self.fail(S_FORK, self._libc.errno(), 1)
            if child == 0:
                os.close(w)
                return
            self._init(child, w)
        os.close(w)
        self._relay(init, r)

    def inside(self) -> None:
        """In the command's process: a fresh ``/proc`` (only this namespace's processes),
        readable under Landlock; then the signal mask it had."""
        libc = self._libc
        if self.pid:
            self._sys(S_PROC, self._mount, self._proc, self._proc_dir, self._proc,
                      MS_NOSUID | MS_NODEV | MS_NOEXEC, 0)
            if self.ruleset >= 0:
                try:
                    fd = os.open(b"/proc", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                                 | os.O_CLOEXEC)
                except OSError as exc:
                    self.fail(S_PROC_RULE, exc.errno or 0, 0)
                struct.pack_into("=Qi", self._rule, 0, self._rights, fd)
                result = libc.syscall(SYS_ADD_RULE, self.ruleset, RULE_PATH_BENEATH,
                                      self._rule, 0)
                err = libc.errno()
                os.close(fd)
                if result < 0:
                    self.fail(S_PROC_RULE, err, 0)
        self._sys(S_MASK, self._sigmask, SIG_SETMASK, self._old_mask, 0, 8)

    def _signals(self) -> int:
        return self._sys(S_SIGNALFD, self._signalfd, -1, self._all, 8, os.O_CLOEXEC)

    def _init(self, child: int, w: int) -> None:
        """PID 1 of the namespace: forwards signals to the command, reaps every orphan, and
        when the command exits writes its status for the relay and exits — the kernel then
        kills what is left in the namespace. Exits too when the relay is gone (``w`` then
        polls ``POLLERR``: no reader)."""
        sfd = self._signals()
        _close_except(sfd, w)
        if self._argv is not None:  # this copy of dsh shows no command line in /proc/1
            self._memset(self._libc._long(self._argv[0]), self._libc._long(0),
                         self._libc._long(self._argv[1]))
        poller = self._poll()
        poller.register(sfd, self._POLLIN)
        poller.register(w, 0)
        while True:
            for fd, _ in poller.poll():
                if fd == w:
                    os._exit(0)
                info = os.read(sfd, 128)
                signo, code = _siginfo(info)
                if signo != SIGCHLD:
                    if code != SI_KERNEL:  # the terminal signals the whole group itself
                        _kill(child, signo)
                    continue
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    if pid == child:
                        try:
                            os.write(w, status.to_bytes(4, "little"))
                        except OSError:  # EPIPE: the relay is gone
                            pass
                        os._exit(0)

    def _relay(self, init: int, r: int) -> None:
        """Outside the namespace, the process ``Popen`` waits for: forwards signals to the
        init, kills the namespace when dsh is gone, and once the init has exited (the
        namespace is empty) exits the way the command did."""
        sfd = self._signals()
        try:
            pfd = os.pidfd_open(self.ppid)
        except OSError:
            pfd = -1
        _close_except(r, sfd, pfd)
        poller = self._poll()
        poller.register(sfd, self._POLLIN)
        if pfd >= 0 and os.getppid() == self.ppid:
            poller.register(pfd, self._POLLIN)
        else:
            _kill(init, SIGKILL)  # dsh is gone already
        status = -1
        while status < 0:
            for fd, _ in poller.poll():
                if fd == pfd:  # dsh exited: what its call started goes with it
                    poller.unregister(pfd)
                    _kill(init, SIGKILL)
                    continue
                signo, code = _siginfo(os.read(sfd, 128))
                if signo == SIGCHLD:
                    pid, got = os.waitpid(init, os.WNOHANG)
                    if pid:
                        status = got
                elif code != SI_KERNEL:
                    _kill(init, signo)
        data = os.read(r, 4)
        self._exit_as(int.from_bytes(data, "little") if len(data) == 4 else status)

    def _exit_as(self, status: int) -> None:
        """Exit with the command's status: its code, or killed by its signal (no core)."""
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            libc = self._libc
            libc.syscall(self._prlimit, 0, RLIMIT_CORE, self._zero, 0)
            libc.syscall(self._sigaction, sig, self._zero, 0, 8)
            struct.pack_into("Q", self._unblock, 0, 1 << (sig - 1))
            libc.syscall(self._sigmask, SIG_UNBLOCK, self._unblock, 0, 8)
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 126)


def _siginfo(info: bytes) -> tuple[int, int]:
    """``(ssi_signo, ssi_code)`` of a ``struct signalfd_siginfo``."""
    return (int.from_bytes(info[0:4], sys.byteorder),
            int.from_bytes(info[8:12], sys.byteorder, signed=True))


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _close_except(*keep: int) -> None:
    """Close every descriptor but ``keep``: the command's pipes, dsh's status pipes and
    ``subprocess``'s error pipe must not be held open by the relay or the init."""
    low = 0
    for fd in sorted(k for k in keep if k >= 0):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _MAXFD)


_ARGV: list[tuple[int, int] | None] = []  # read once per process (a fork has the same)


def _argv_area() -> tuple[int, int] | None:
    """``(address, length)`` of this process's command line (``/proc/self/stat`` fields 48
    and 49), which ``/proc/PID/cmdline`` shows; None when unknown."""
    if not _ARGV:
        try:
            with open("/proc/self/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            start, end = int(fields[45]), int(fields[46])
            _ARGV.append((start, end - start) if 0 < start < end else None)
        except (OSError, ValueError, IndexError):
            _ARGV.append(None)
    return _ARGV[0]


def probe_namespaces(libc: Any) -> str:
    """``""`` when this process can give a command its namespaces (user, mount with a
    read-only bind, PID with a fresh /proc), else why not — tried in a forked child, the way
    a command would be (the launcher's ``--probe``; dsh itself tries through ``subprocess``:
    :func:`dsh.sandbox.child.namespaces_unavailable`)."""
    import tempfile

    machine = os.uname().machine
    if machine not in NS_CALLS:
        return f"no namespace support for this architecture ({machine})"
    tmp = tempfile.mkdtemp(prefix="dsh-sandbox-ns-")
    try:
        os.close(os.open(os.path.join(tmp, "probe"), os.O_CREAT | os.O_WRONLY, 0o600))
        ns = Namespaces(libc, machine, (tmp,), ((0, "probe", True),), pid=True)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            ns.fail = lambda step, err, arg: _trial_failed(w, step, err, arg)
            trial(ns, os.path.join(tmp, "probe"))
        os.close(w)
        _, status = os.waitpid(pid, 0)
        data = os.read(r, 3)
        os.close(r)
        return trial_outcome(status, data, (tmp,), ns.binds)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def trial(ns: Namespaces, probe: str) -> None:
    """In a forked child: the namespace steps on a trial root, then a check that the kernel
    refuses a write to the read-only bind (EROFS); exits 0 when all held."""
    ns.enter()
    ns.spawn()
    ns.inside()
    try:
        os.close(os.open(probe, os.O_WRONLY))
    except OSError as exc:
        os._exit(0 if exc.errno == EROFS else 3)
    os._exit(4)


def _trial_failed(w: int, step: int, err: int, arg: int) -> None:
    os.write(w, bytes((step, err & 0xFF, arg & 0xFF)))
    os._exit(126)


def trial_outcome(status: int, data: bytes, roots: Any, binds: Any) -> str:
    if len(data) == 3:
        return step_reason(data[0], data[1], data[2], roots,
                           [(i, "the trial file", ro) for i, _, ro in binds])
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return ""
    if code in (3, 4):
        return "a read-only bind mount did not refuse a write"
    return f"the trial exited with status {code}"


