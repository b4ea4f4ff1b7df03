"""Starting a confined process: :class:`Popen`, the public way for any tool plugin.

``Popen(argv, policy, workspace=…)`` is :class:`subprocess.Popen` whose forked child confines
itself before ``execve`` (:mod:`dsh.sandbox.child`: a ``preexec_fn`` of system calls prepared
here — the Landlock ruleset is built in this process — and nothing else of dsh), so the
command is confined from its first instruction. ``launcher=True``, a subinterpreter (where
``subprocess`` refuses a ``preexec_fn``) and :func:`wrap` use the launcher instead
(:mod:`dsh.sandbox.exec`, a second interpreter that applies the same policy to itself and
``execve``'s the command). The constructor returns once the command has been exec'd: a policy
the kernel cannot apply raises :class:`SandboxUnavailable` (fail closed) and the command never
runs; a program that is not found raises :class:`FileNotFoundError`, as ``subprocess`` does.

Where this machine can make namespaces (:func:`dsh.sandbox.child.namespaces_unavailable`),
the command also gets its own user, mount and PID namespaces (docs/execution.md, "The sandbox
of a tool call"): the persistence paths of each writable root are read-only bind mounts, it
sees only its own processes in a fresh ``/proc``, and everything it starts is killed when it
exits — ``Popen.pid`` is then the relay outside the namespace, which exits as the command did
once nothing of it is left. Where they cannot be made, the confinement is Landlock and seccomp
alone, as before, and the record says why (``namespaces: []``, ``fallback``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

from dsh.core.errors import DshError
from dsh.sandbox.policy import Plan
from dsh.sandbox.policy import Policy
from dsh.sandbox.policy import build_plan
from dsh.sandbox.policy import protected_paths

#: The launcher, run with ``-I -S``: no site-packages, no ``dsh`` import, so it starts as fast
#: as the interpreter can. Imported as a module by a one-line ``-c`` rather than run as a
#: script: a script is compiled on every run (~6 ms of CPU), a module's bytecode is cached.
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exec.py")
# Appended, not prepended: nothing in that directory may shadow a standard module.
_STUB = (f"import sys; sys.path.append({os.path.dirname(LAUNCHER)!r}); "
         "import exec as launcher; sys.exit(launcher.main(sys.argv))")
#: ``INTERPRETER + LAUNCH + [args…]`` runs :func:`dsh.sandbox.exec.main`.
LAUNCH = ["-I", "-S", "-c", _STUB]
#: The interpreter that runs it: ``sys.executable``, else this very process's binary by
#: ``/proc/self/exe`` (resolved in the child before it execs) where ``sys.executable`` names a
#: path this user cannot execute (a venv whose base lives under another user's home).
INTERPRETER = (sys.executable if sys.executable and os.access(sys.executable, os.X_OK)
               else "/proc/self/exe")


class SandboxUnavailable(DshError, RuntimeError):
    """The kernel could not apply the policy; the command did not run. The message is one
    line: why, and which setting chooses otherwise. ``dsh sandbox run`` exits 126 with it."""

    exit_code = 126


def run_protected() -> tuple[str | None, ...]:
    """The current run's config file and session directory (besides the defaults)."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None:
        return ()
    ledger_path = getattr(getattr(ctx, "ledger", None), "path", None)
    app = getattr(getattr(ctx, "session", None), "app", None)
    source = getattr(getattr(app, "config", None), "source", None)
    return (str(ledger_path.parent) if ledger_path is not None else None, source)


class Popen(subprocess.Popen[bytes]):
    """A process confined by ``policy`` with ``workspace`` as its workspace.

    Keyword arguments are :class:`subprocess.Popen`'s (``cwd`` defaults to the workspace;
    ``close_fds`` is always true; ``env`` is passed as given — without it, or ``None``, the
    allowlisted environment (:func:`dsh.sandbox.environment.allowed_env`: ``PATH``,
    ``HOME``, the locale…, never a key), not dsh's — with ``TMPDIR`` set to the command's
    private temp directory; a ``preexec_fn`` runs first, unconfined).
    ``read_only``: more paths (absolute, or relative to the workspace) kept read-only inside
    the writable roots, besides the persistence paths (a project memory file).
    ``launcher=True`` confines through the launcher rather than in the forked child (same
    confinement, errors and record). ``self.sandbox`` is the record of what was applied:
    the policy, ``backend`` (``landlock`` or ``none``), the kernel's ``abi``,
    ``namespaces`` (``["user", "mount", "pid"]``, or ``[]`` with the ``fallback`` reason)
    and ``read_only`` (the paths made read-only, relative to the workspace; with
    ``read_only_scan`` when the scan for nested git repositories stopped early).
    """

    def __init__(self, args: Sequence[str], policy: Policy, *, workspace: str,
                 protected: Iterable[str | None] = (), launcher: bool = False,
                 read_only: Iterable[str] = (), **kwargs: Any) -> None:
        argv = [os.fspath(a) for a in args]
        kwargs.setdefault("cwd", workspace)
        kwargs["close_fds"] = True
        if kwargs.get("env") is None:  # never dsh's whole environment (its keys)
            from dsh.sandbox.environment import allowed_env

            kwargs["env"] = allowed_env(kwargs["cwd"])
        self.sandbox: dict[str, Any] = {**policy.record(), "workspace": workspace}
        self._tmp: str | None = None
        #: Persistence paths missing when the command started (it could create them): any
        #: it made is moved aside when it ends (:meth:`_quarantine`).
        self._absent: tuple[str, ...] = ()
        if not policy.confined:
            self.sandbox["backend"] = "none"
            super().__init__(argv, **kwargs)
            return
        if not sys.platform.startswith("linux"):
            raise SandboxUnavailable(_refusal(policy, f"no sandbox backend on {sys.platform}"))
        protect = protected_paths([*protected, *run_protected()])
        self._tmp = tmp = tempfile.mkdtemp(prefix="dsh-sandbox-")
        self._cleanup = weakref.finalize(self, _remove, tmp)
        try:
            why = _namespaces_unavailable()
            plan = build_plan(policy, workspace, tmp, protect,
                              namespaces=None if why else "pid",
                              read_only=_absolute(read_only, workspace))
        except Exception:
            self._cleanup()
            raise
        if why:
            self.sandbox.update(namespaces=[], fallback=why)
        else:
            self.sandbox.update(namespaces=["user", "mount", "pid"],
                                read_only=plan.read_only())
            if plan.scan:
                self.sandbox["read_only_scan"] = plan.scan
        if policy.mode == "workspace-write":
            self._absent = tuple(p for p in policy.persistence()
                                 if not os.path.lexists(os.path.join(workspace, p)))
            self._absent += plan.absent
        env = dict(kwargs.pop("env"))
        env["TMPDIR"] = tmp
        if not launcher:
            try:
                self._confine_in_child(argv, policy, plan, env, kwargs)
                return
            except _NoPreexec:  # a subinterpreter: subprocess refuses preexec_fn there
                pass
        self._launch(argv, policy, plan, env, kwargs)

    def _confine_in_child(self, argv: list[str], policy: Policy, plan: Plan,
                          env: dict[str, str], kwargs: dict[str, Any]) -> None:
        """The default path: the forked child confines itself by system calls prepared here
        (:mod:`dsh.sandbox.child`) and ``subprocess`` exec's the command."""
        from dsh.sandbox.child import Confinement
        from dsh.sandbox.exec import Refused

        kwargs = dict(kwargs)  # preexec_fn is set here; a fallback to the launcher is clean
        spaces = None if plan.namespaces is None else (
            plan.roots, plan.binds, plan.namespaces == "pid")
        try:
            confinement = Confinement(plan.network, plan.rules, spaces)
        except (Refused, OSError) as exc:
            self._cleanup()
            why = str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"
            raise SandboxUnavailable(_refusal(policy, why)) from None
        own = kwargs.get("preexec_fn")
        if own is not None:  # the caller's runs first (unconfined, as it always did)
            def child() -> None:
                own()
                confinement()
            kwargs["preexec_fn"] = child
        else:
            kwargs["preexec_fn"] = confinement
        try:
            super().__init__(argv, env=env, **kwargs)
        except subprocess.SubprocessError:  # the child raised before exec: the caller's
            failed = confinement.outcome()   # preexec_fn, or a signal handler in ours
            self._cleanup()
            if failed is None and own is not None:
                raise
            why = failed or "the child failed before exec"
            raise SandboxUnavailable(_refusal(policy, why)) from None
        except RuntimeError as exc:
            confinement.close()
            if "subinterpreter" in str(exc):  # refused before any fork
                # subprocess keeps the /dev/null it opened (and closed) for a retry: drop it
                self.__dict__.pop("_devnull", None)
                raise _NoPreexec from None
            self._cleanup()
            raise
        except BaseException:  # FileNotFoundError, PermissionError: exec failed, confined;
            confinement.close()  # or a signal's KeyboardInterrupt after the fork
            self._kill_orphan()
            self._cleanup()
            raise
        failure = confinement.outcome()
        self.sandbox.update(backend="landlock")
        if failure is not None:
            self._abandon()
            raise SandboxUnavailable(_refusal(policy, failure))
        self.sandbox["abi"] = confinement.abi

    def _launch(self, argv: list[str], policy: Policy, plan: Plan, env: dict[str, str],
                kwargs: dict[str, Any]) -> None:
        """The launcher path: a second interpreter (:mod:`dsh.sandbox.exec`) confines itself
        and exec's the command."""
        spec = os.memfd_create("dsh-sandbox-policy", os.MFD_CLOEXEC)
        status_r, status_w = os.pipe()
        try:
            os.write(spec, plan.encode())
            os.lseek(spec, 0, os.SEEK_SET)
            kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), spec, status_w)
            launcher = [INTERPRETER, *LAUNCH, str(spec), str(status_w), "--", *argv]
            super().__init__(launcher, env=env, **kwargs)
        except BaseException:
            os.close(status_r)
            self._kill_orphan()
            self._cleanup()
            raise
        finally:
            os.close(spec)
            os.close(status_w)
        try:
            with os.fdopen(status_r, "rb") as f:
                status = f.read(65536).decode(errors="replace").splitlines()
        except BaseException:  # a signal's KeyboardInterrupt: nobody would own the process
            self._kill_orphan()
            self._cleanup()
            raise
        self.sandbox.update(backend="landlock")
        for line in status:
            tag, _, text = line.partition(" ")
            if tag == "A":
                self.sandbox["abi"] = int(text)
                continue
            self._abandon()
            if tag == "N":
                raise FileNotFoundError(errno.ENOENT, "command not found", argv[0])
            if tag == "X":
                raise PermissionError(errno.EACCES, text, argv[0])
            raise SandboxUnavailable(_refusal(policy, text))
        if "abi" not in self.sandbox:  # the launcher died before saying anything
            self._abandon()
            raise SandboxUnavailable(_refusal(policy, "the sandbox launcher failed"))

    def _kill_orphan(self) -> None:
        """The constructor is failing after the fork (an interrupt): the caller gets no
        handle, so the child — maybe the command already, with its group — must not be left
        running. A child ``subprocess`` has reaped (exec failed) is left alone."""
        pid = getattr(self, "pid", None)
        if not getattr(self, "_child_created", False) or pid is None or \
                self.returncode is not None:
            return
        import signal

        try:
            if os.getpgid(pid) == pid:  # its own group (start_new_session, process_group=0)
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        except ProcessLookupError:
            pass
        self.returncode = -signal.SIGKILL

    def _abandon(self) -> None:
        """The command did not start: reap the launcher, close our ends, drop the temp dir."""
        super().wait()
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self._cleanup()

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        if self._tmp is not None:
            self._cleanup()
        if self._absent:
            self._quarantine()
        return code

    def _quarantine(self) -> None:
        """A persistence path (``.git``, ``.mcp.json``, ``.claude``…) that did not exist when
        the command started cannot be made read-only by a mount, so the command could create
        one (``git init`` with a ``core.fsmonitor``): once it has ended — and every process
        it started with it — each such path it made is renamed aside (``NAME.dsh-quarantined-
        …``), by descriptor, and listed in the record as ``quarantined``; so is a missing
        path git would obey (a ``core.hooksPath`` folder, an ``include.path`` file:
        :attr:`dsh.sandbox.policy.Plan.absent`). ``[sandbox] unprotected`` names the ones a
        command may create (``.git``: all of git's)."""
        from dsh.core import beneath

        absent, self._absent = self._absent, ()
        workspace = self.sandbox["workspace"]
        moved = []
        for rel in absent:
            parent, name = os.path.split(rel)
            try:
                dfd = beneath.open_dir(workspace, parent)
            except OSError:
                continue
            try:
                os.stat(name, dir_fd=dfd, follow_symlinks=False)
                aside = f"{name}.dsh-quarantined-{os.urandom(4).hex()}"
                os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
                moved.append({"path": rel, "moved_to": os.path.join(parent, aside)})
            except OSError:
                continue
            finally:
                os.close(dfd)
        if moved:
            self.sandbox["quarantined"] = moved


class _NoPreexec(Exception):
    """``subprocess`` cannot run a ``preexec_fn`` here: use the launcher."""


def wrap(argv: Sequence[str], policy: Policy, *, workspace: str,
         protected: Iterable[str | None] = (),
         read_only: Iterable[str] = ()) -> tuple[list[str], dict[str, str], Any]:
    """For code that starts the process itself (the MCP SDK's ``stdio_client``): the argv
    that runs ``argv`` through the launcher under ``policy``, the environment to add
    (``TMPDIR``: a private directory) and a ``finalize`` that removes that directory. The
    plan travels on the command line; if the kernel cannot apply it the launcher writes
    ``dsh: sandbox: cannot confine the command (WHY); it was not run`` on stderr and exits
    126 (fail closed). With policy ``off`` it is ``argv`` itself, no environment. Where
    namespaces can be made, the process gets a user and a mount namespace (the persistence
    paths read-only), not a PID namespace: a server outlives any one call, and its process
    is the one its client waits for and signals."""
    if not policy.confined:
        return list(argv), {}, None
    import base64

    protect = protected_paths([*protected, *run_protected()])
    tmp = tempfile.mkdtemp(prefix="dsh-sandbox-")
    try:
        plan = build_plan(policy, workspace, tmp, protect,
                          namespaces=None if _namespaces_unavailable() else "mount",
                          read_only=_absolute(read_only, workspace))
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    holder = type("SandboxTemp", (), {})()
    cleanup = weakref.finalize(holder, _remove, tmp)
    cleanup.atexit = True
    launcher = [INTERPRETER, *LAUNCH, "--inline",
                base64.b64encode(plan.encode()).decode(), "--", *argv]
    return launcher, {"TMPDIR": tmp}, (holder, cleanup)


def _namespaces_unavailable() -> str:
    from dsh.sandbox.child import namespaces_unavailable

    return namespaces_unavailable()


def _absolute(paths: Iterable[str], workspace: str) -> tuple[str, ...]:
    return tuple(os.path.join(workspace, os.fspath(p)) for p in paths)


def _remove(tmp: str) -> None:
    """Remove a command's temp directory: usually empty (``rmdir``, a tenth of ``rmtree``)."""
    try:
        os.rmdir(tmp)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _refusal(policy: Policy, why: str) -> str:
    return (f"sandbox: cannot confine the command ({why}); it was not run. "
            f"To run it unconfined, set policy = \"off\" in [{policy.where}]")


def check() -> dict[str, Any]:
    """What this machine supports (the launcher's ``--probe``, run as a child, the way a
    command would be started) and which backend a policy would use; ``launcher`` is ``ok``
    or why the launcher (:func:`wrap`) could not confine a trial command."""
    info: dict[str, Any] = {"platform": sys.platform}
    if not sys.platform.startswith("linux"):
        return {**info, "backend": None, "why": f"no sandbox backend on {sys.platform}"}
    out = subprocess.run([INTERPRETER, *LAUNCH, "--probe"],
                         capture_output=True, text=True, check=False)
    try:
        info.update(json.loads(out.stdout))
    except ValueError:
        return {**info, "backend": None, "why": f"the launcher failed: {out.stderr.strip()}"}
    if info.get("namespaces") == "ok":
        from dsh.sandbox.child import namespaces_unavailable

        # What dsh's own commands get (its trial, in this process): the launcher's said ok.
        info["namespaces"] = namespaces_unavailable() or "ok"
    abi, need = info.get("landlock_abi", 0), info.get("min_abi", 0)
    if not abi:
        info.update(backend=None, why=info.get("landlock_error") or "no Landlock")
    elif abi < need:
        info.update(backend=None, why=f"Landlock ABI {abi} is older than {need}")
    elif not info.get("seccomp_filter"):
        info.update(backend=None, why=f"no seccomp filter for {info.get('machine')}")
    else:
        # A trial: confine `true` under the default policy, as a command would be — in the
        # forked child (Popen) and through the launcher (wrap: MCP stdio servers).
        with tempfile.TemporaryDirectory(prefix="dsh-sandbox-check-") as ws:
            for launcher in (False, True):
                try:
                    proc = Popen(["true"], Policy(), workspace=ws, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, launcher=launcher)
                    proc.wait()
                    why = ""
                except (SandboxUnavailable, OSError) as exc:
                    why = str(exc)
                if launcher:
                    info["launcher"] = why or "ok"
                else:
                    info.update(backend="landlock" if not why else None, why=why)
    return info
