"""The kernel sandbox (issue 22): hostile commands under the default policy, observed from
outside — a file that must not appear, a listener that must receive nothing, a signal that
must not arrive, a secret that must not be in the output.

These run real processes under real Landlock and seccomp; they skip where the kernel cannot
confine (``dsh sandbox check`` says why), except the fail-closed tests, which simulate that.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import ConfigError
from dsh.sandbox.policy import Policy
from dsh.sandbox.policy import parse_policy
from dsh.sandbox.spawn import Popen
from dsh.sandbox.spawn import SandboxUnavailable
from dsh.sandbox.spawn import check
from tests.procs import alive_with as _alive_with

MARK = "S3CR3T-b5e1"
_CHECK = check()
needs_sandbox = pytest.mark.skipif(not _CHECK.get("backend"),
                                   reason=f"no sandbox on this machine: {_CHECK.get('why')}")


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Path]:
    """A workspace, a home with secrets next to it, and dsh's own files (protected)."""
    ws, home, dsh_home, outside = (tmp_path / n for n in ("ws", "home", "dshdata", "outside"))
    for d in (ws, home / ".ssh", home / ".aws", dsh_home / "sessions", outside):
        d.mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(f"{MARK}-ssh")
    (home / ".aws" / "credentials").write_text(f"{MARK}-aws")
    (dsh_home / "sessions" / "other.jsonl").write_text(f'{{"text": "{MARK}-ledger"}}\n')
    (dsh_home / "keys.json").write_text(f'{{"openai": "{MARK}-key"}}')
    return {"ws": ws, "home": home, "dsh": dsh_home, "outside": outside}


def run(argv: list[str], box: dict[str, Path], policy: Policy | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = Popen(argv, policy or Policy(), workspace=str(box["ws"]),
                 protected=[str(box["dsh"])], stdin=subprocess.DEVNULL,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode(), err.decode())


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code), *args]


#: Tries to read each path given; prints {path: "ok <first bytes>" | "ERR <errno name>"}.
READER = """
    import errno, json, os, sys
    out = {}
    for p in sys.argv[1:]:
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                out[p] = "ok " + ",".join(os.listdir(p))
            else:
                with open(p, "rb") as f:
                    out[p] = "ok " + f.read(200).decode(errors="replace")
        except OSError as exc:
            out[p] = "ERR " + errno.errorcode.get(exc.errno, str(exc.errno))
    print(json.dumps(out))
"""


@needs_sandbox
def test_reads_of_secrets_fail_directly_and_through_links_and_proc(box: dict[str, Path]) -> None:
    ws = box["ws"]
    keys = box["dsh"] / "keys.json"
    (ws / "via-symlink").symlink_to(keys)
    (ws / "ssh-dir").symlink_to(box["home"] / ".ssh")
    os.link(box["home"] / ".aws" / "credentials", box["outside"] / "hard")  # outside the ws
    targets = [str(keys), str(box["dsh"] / "sessions" / "other.jsonl"),
               str(box["home"] / ".ssh" / "id_rsa"), str(box["home"] / ".aws" / "credentials"),
               str(box["home"]), str(box["dsh"]), "via-symlink", "ssh-dir/id_rsa",
               str(box["outside"] / "hard"), f"/proc/self/root{keys}",
               f"/proc/{os.getpid()}/environ", f"/proc/{os.getpid()}/mem",
               f"/proc/{os.getpid()}/cwd/{keys.name}", f"/proc/{os.getpid()}/root{keys}",
               f"/proc/{os.getpid()}/fd/0"]
    result = run(python(READER, *targets), box)
    report = json.loads(result.stdout)
    assert MARK not in result.stdout + result.stderr
    for path in targets:
        assert report[path].startswith("ERR"), (path, report[path])
    # the denial is the command's own error, as any program sees it
    assert {report[str(keys)], report["via-symlink"]} == {"ERR EACCES"}


@needs_sandbox
def test_the_system_and_the_workspace_stay_readable(box: dict[str, Path]) -> None:
    (box["ws"] / "notes.txt").write_text("hello")
    result = run(python(READER, "notes.txt", "/etc/hostname", "/usr/bin"), box)
    report = json.loads(result.stdout)
    assert report["notes.txt"] == "ok hello"
    assert all(v.startswith("ok") for v in report.values()), report


WRITER = """
    import json, os, sys
    out = {}
    for p in sys.argv[1:]:
        try:
            with open(p, "w") as f:
                f.write("x")
            out[p] = "ok"
        except OSError as exc:
            out[p] = type(exc).__name__
    for src, dst in (("ws-file", sys.argv[1] + ".renamed"),):
        open(src, "w").close()
        try:
            os.rename(src, dst); out["rename"] = "ok"
        except OSError as exc:
            out["rename"] = type(exc).__name__
    try:
        os.link("ws-file", os.path.join(os.path.dirname(sys.argv[1]), "linked"))
        out["link"] = "ok"
    except OSError as exc:
        out["link"] = type(exc).__name__
    print(json.dumps(out))
"""


@needs_sandbox
def test_writes_outside_the_workspace_do_not_happen(box: dict[str, Path]) -> None:
    ws, outside = box["ws"], box["outside"]
    (ws / "planted").symlink_to(outside / "through-symlink")
    (ws / "dir-link").symlink_to(outside)
    targets = [str(outside / "direct"), "planted", "dir-link/through-dir", "../outside/dotdot",
               str(box["home"] / ".bashrc"), str(box["dsh"] / "sessions" / "forged.jsonl"),
               "inside.txt"]
    result = run(python(WRITER, *targets), box)
    report = json.loads(result.stdout)
    assert report.pop("inside.txt") == "ok" and (ws / "inside.txt").read_text() == "x"
    assert set(report.values()) == {"PermissionError"}, report
    assert sorted(p.name for p in outside.iterdir()) == []
    assert not (box["home"] / ".bashrc").exists()
    assert sorted(p.name for p in (box["dsh"] / "sessions").iterdir()) == ["other.jsonl"]


@needs_sandbox
def test_a_cwd_outside_the_workspace_gives_no_write_there(box: dict[str, Path]) -> None:
    code = "open('x-in-parent', 'w')"
    result = run(python(code), box, cwd=str(box["ws"] / ".."))
    assert "PermissionError" in result.stderr
    assert not (box["ws"].parent / "x-in-parent").exists()


@needs_sandbox
def test_a_symlink_swap_race_never_writes_outside(box: dict[str, Path]) -> None:
    """One thread swaps ws/d between a directory and a symlink to outside while another
    writes ws/d/f: Landlock checks the resolved path at each open, so nothing lands outside."""
    code = """
        import os, threading, time
        os.mkdir("real")
        stop = time.monotonic() + 1.5
        def swap():
            while time.monotonic() < stop:
                for target in ("real", OUT):
                    try:
                        os.symlink(target, "tmp-link"); os.replace("tmp-link", "d")
                    except OSError:
                        pass
        t = threading.Thread(target=swap); t.start()
        wrote = 0
        while time.monotonic() < stop:
            try:
                with open("d/f", "w") as f:
                    f.write("x")
                wrote += 1
            except OSError:
                pass
        t.join(); print(wrote)
    """.replace("OUT", repr(str(box["outside"])))
    result = run(python(code), box)
    assert result.returncode == 0, result.stderr
    assert list(box["outside"].iterdir()) == []
    assert int(result.stdout) > 0  # the race ran: writes through the real directory happened


class Listener:
    """TCP (IPv4, IPv6), UDP and Unix listeners the test owns; counts what reaches them."""

    def __init__(self, ws: Path) -> None:
        self.hits: list[str] = []
        self.socks: list[tuple[str, socket.socket]] = []
        for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                s = socket.socket(fam, socket.SOCK_STREAM)
                s.bind((host, 0))
            except OSError:
                continue
            s.listen(8)
            self.socks.append((f"tcp {host}", s))
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("127.0.0.1", 0))
        self.socks.append(("udp", u))
        path = ws.parent / "unix.sock"
        x = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        x.bind(str(path))
        x.listen(8)
        self.socks.append(("unix", x))
        a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        a.bind(f"\0dsh-test-{os.getpid()}")
        a.listen(8)
        self.socks.append(("abstract", a))
        self.unix_path = str(path)
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def addresses(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, s in self.socks:
            out[name] = list(s.getsockname()[:2]) if name.startswith(("tcp", "udp")) else (
                self.unix_path if name == "unix" else s.getsockname().decode("latin-1"))
        return out

    def _serve(self) -> None:
        import select

        by_fd = {s.fileno(): (name, s) for name, s in self.socks}
        while not self.stop:
            ready, _, _ = select.select(list(by_fd), [], [], 0.05)
            for fd in ready:
                name, s = by_fd[fd]
                try:
                    if name == "udp":
                        s.recvfrom(100)
                    else:
                        s.accept()[0].close()
                    self.hits.append(name)
                except OSError:
                    pass

    def close(self) -> list[str]:
        time.sleep(0.5)
        self.stop = True
        self.thread.join()
        for _, s in self.socks:
            s.close()
        return self.hits


CONNECTOR = """
    import json, socket, sys
    addrs = json.loads(sys.argv[1]); out = {}
    for name, addr in addrs.items():
        try:
            if name == "udp":
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", tuple(addr))
            elif name.startswith("tcp"):
                fam = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
                socket.socket(fam).connect(tuple(addr))
            else:
                socket.socket(socket.AF_UNIX).connect(addr.replace("\\x00", "\\0"))
            out[name] = "ok"
        except OSError as exc:
            out[name] = type(exc).__name__
    try:
        socket.getaddrinfo("example.com", 80); out["dns"] = "ok"
    except OSError as exc:
        out["dns"] = type(exc).__name__
    print(json.dumps(out))
"""


@needs_sandbox
def test_no_network_reaches_loopback_listeners(box: dict[str, Path]) -> None:
    listener = Listener(box["ws"])
    try:
        result = run(python(CONNECTOR, json.dumps(listener.addresses())), box)
    finally:
        hits = listener.close()
    assert hits == [], f"reached: {hits}"
    report = json.loads(result.stdout)
    assert all(v != "ok" for v in report.values()), report


@needs_sandbox
def test_network_true_opens_tcp_and_is_recorded(box: dict[str, Path]) -> None:
    listener = Listener(box["ws"])
    tcp = {k: v for k, v in listener.addresses().items() if k == "tcp 127.0.0.1"}
    try:
        proc = Popen(python(CONNECTOR, json.dumps(tcp)), Policy(network=True),
                     workspace=str(box["ws"]), protected=[str(box["dsh"])],
                     stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=60)
    finally:
        hits = listener.close()
    assert json.loads(out)["tcp 127.0.0.1"] == "ok" and hits == ["tcp 127.0.0.1"]
    assert proc.sandbox["network"] is True and proc.sandbox["backend"] == "landlock"


@needs_sandbox
def test_signals_and_ptrace_do_not_reach_dsh_or_its_other_children(
        box: dict[str, Path]) -> None:
    got: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
    sibling = Popen(["sleep", "30"], Policy(), workspace=str(box["ws"]),
                    protected=[str(box["dsh"])])
    try:
        code = f"""
            import ctypes, os, signal
            out = []
            for pid, sig in ((os.getppid(), signal.SIGUSR1), ({sibling.pid}, signal.SIGKILL)):
                try:
                    os.kill(pid, sig); out.append("sent")
                except OSError as exc:
                    out.append(type(exc).__name__)
            libc = ctypes.CDLL(None, use_errno=True)
            out.append(libc.ptrace(16, os.getppid(), 0, 0))  # PTRACE_ATTACH
            print(out)
        """
        result = run(python(code), box)
        time.sleep(0.2)
        assert got == [] and sibling.poll() is None, result.stdout
        # dsh is the init's parent, outside the command's PID namespace: the signal is
        # refused; the sibling is not even there (or, without namespaces, refused)
        assert result.stdout.strip() in ("['PermissionError', 'ProcessLookupError', -1]",
                                         "['PermissionError', 'PermissionError', -1]")
    finally:
        signal.signal(signal.SIGUSR1, old)
        sibling.kill()
        sibling.wait()


@needs_sandbox
def test_no_descriptor_and_no_capability_is_inherited(box: dict[str, Path]) -> None:
    secret = box["outside"] / "open-secret"
    secret.write_text(MARK)
    fd = os.open(secret, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        code = """
            import os
            print(sorted(int(f) for f in os.listdir("/proc/self/fd")))
            print([l for l in open("/proc/self/status") if l.startswith(("CapEff", "CapPrm",
                   "CapBnd", "NoNewPrivs", "Seccomp:"))])
        """
        result = run(python(code), box)
    finally:
        os.close(fd)
    fds, status = result.stdout.splitlines()
    assert set(json.loads(fds)) <= {0, 1, 2, 3}  # 3: the directory listdir opened
    assert "CapEff:\\t0000000000000000" in status and "CapBnd:\\t0000000000000000" in status
    assert "NoNewPrivs:\\t1" in status and "Seccomp:\\t2" in status


@needs_sandbox
def test_policy_off_runs_unconfined_and_says_so(box: dict[str, Path]) -> None:
    result = Popen(python(READER, str(box["home"] / ".ssh" / "id_rsa")), Policy(mode="off"),
                   workspace=str(box["ws"]), stdout=subprocess.PIPE)
    out, _ = result.communicate(timeout=60)
    assert f"ok {MARK}-ssh" in out.decode()
    assert result.sandbox == {"policy": "off", "workspace": str(box["ws"]), "backend": "none"}


def test_a_workspace_holding_dshs_files_is_refused(box: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="holds dsh's own files"):
        Popen(["true"], Policy(), workspace=str(box["dsh"].parent),
              protected=[str(box["dsh"])])
    with pytest.raises(ConfigError, match="inside dsh's own files"):
        Popen(["true"], Policy(read=(str(box["dsh"] / "sessions"),)),
              workspace=str(box["ws"]), protected=[str(box["dsh"])])


# --------------------------------------------------------------------------------------------
# Fail closed: a kernel that cannot apply the policy, simulated by a seccomp filter that makes
# landlock_create_ruleset fail as on a kernel without Landlock (ENOSYS).
# --------------------------------------------------------------------------------------------

NO_LANDLOCK = """
    import ctypes, os, struct, sys
    sys.path.insert(0, {src!r})
    from dsh.sandbox import exec as launcher
    arch, nrs, _ = launcher.ARCHES[os.uname().machine]
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, 0x7FFF0000),
            (0x20, 0, 0, 0), (0x15, 0, 1, 444), (0x06, 0, 0, 0x00050000 | 38),
            (0x06, 0, 0, 0x7FFF0000)]
    code = b"".join(struct.pack("=HBBI", *i) for i in prog)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(code, len(code))
    class P(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    p = P(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(p), 0, 0) == 0
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def without_landlock(*argv: str) -> list[str]:
    src = str(Path(__file__).resolve().parents[1])
    return [sys.executable, "-c", textwrap.dedent(NO_LANDLOCK.format(src=src)), *argv]


def test_without_landlock_dsh_sandbox_run_refuses_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    marker = tmp_path / "ws" / "ran"
    proc = subprocess.run(without_landlock("-m", "dsh", "sandbox", "run", "--", "touch",
                                           str(marker)),
                          capture_output=True, text=True, cwd=tmp_path / "ws", timeout=120)
    assert proc.returncode == 126, proc.stderr
    assert not marker.exists()
    [line] = proc.stderr.splitlines()
    assert line.startswith("dsh: error: sandbox: cannot confine the command (the kernel has "
                           "no Landlock (ENOSYS)); it was not run.")
    assert 'policy = "off"' in line
    check = subprocess.run(without_landlock("-m", "dsh", "sandbox", "check"),
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 126
    assert "backend: none — the kernel has no Landlock (ENOSYS)" in check.stdout


def test_without_landlock_policy_off_still_runs(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('policy = "off"\n')
    marker = tmp_path / "ran"
    proc = subprocess.run(without_landlock("-m", "dsh", "sandbox", "run", "--policy",
                                           str(tmp_path / "p.toml"), "--", "touch",
                                           str(marker)),
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()
    assert "dsh: sandbox: off (unconfined) (none)" in proc.stderr


def test_sandbox_unavailable_is_exit_code_126() -> None:
    assert SandboxUnavailable.exit_code == 126


# --------------------------------------------------------------------------------------------
# Policies in TOML
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "message"), [
    ({"polcy": "off"}, "unknown key 'polcy'; did you mean 'policy'"),
    ({"policy": "none"}, "policy: expected one of 'workspace-write', 'read-only', 'off'"),
    ({"network": float("nan")}, "network: expected true or false, got the number nan"),
    ({"network": "yes"}, "network: expected true or false"),
    ({"read": ["relative/dir"]}, "read[0]: 'relative/dir' is relative"),
    ({"write": ["/no/such/dir-dsh"]}, "write[0]: '/no/such/dir-dsh' does not exist"),
    ({"read": "/etc"}, "read: expected a list of absolute paths"),
    ({"policy": "read-only", "write": ["/tmp"]}, "a read-only policy writes nowhere"),
    (3, "expected a policy name"),
])
def test_bad_policies_are_config_errors_naming_the_key(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(raw, where="sandbox, agent coder")
    assert message in str(info.value)
    assert str(info.value).startswith("[sandbox, agent coder]")


def test_a_policy_string_is_its_mode_and_defaults_are_workspace_write() -> None:
    assert parse_policy("off").mode == "off"
    default = parse_policy(None)
    assert (default.mode, default.network, default.confined) == ("workspace-write", False, True)


# --------------------------------------------------------------------------------------------
# End to end: a scripted model's run_command under `dsh run`, the ledger, `dsh sessions show`
# --------------------------------------------------------------------------------------------


def _dsh_run(tmp_path: Path, commands: list[str], sandbox: str | None = None,
             ) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]], str, Path]:
    """``dsh run --yes`` whose scripted model runs ``commands``; the ledger's events and the
    whole ledger text."""
    ws, home, cfg_home, data = (tmp_path / n for n in ("ws", "home", "cfg", "data"))
    for d in (ws, home / ".ssh", home / ".aws", cfg_home / "dsh" / "keys", data):
        d.mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "id_rsa").write_text(f"{MARK}-ssh")
    (home / ".aws" / "credentials").write_text(f"{MARK}-aws")
    (home / "notes.txt").write_text("plain notes")
    keys = cfg_home / "dsh" / "keys" / "keys.json"
    keys.write_text(json.dumps({"openai": f"sk-{MARK}-stored"}))
    keys.chmod(0o600)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        *({"tool_calls": [{"name": "run_command", "arguments": {"command": c}}]}
          for c in commands), {"text": "done"}]}))
    config = cfg_home / "dsh" / "config.toml"
    config.write_text(
        (f"sandbox = {json.dumps(sandbox)}\n" if sandbox else "")
        + f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\n'
        + f'[models.x]\napi_key = "sk-{MARK}-config"\n')
    other = data / "dsh" / "sessions" / "20200101-000000.000-aaaaaa.jsonl"
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps({"text": f"{MARK}-other-session"}) + "\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": str(cfg_home),
           "XDG_DATA_HOME": str(data), "DSH_KEYS_BACKEND": "file", "LANG": "C.UTF-8",
           "NO_COLOR": "1", "DSH_LOAD_PLUGINS": os.environ.get("DSH_LOAD_PLUGINS", "")}
    if not env["DSH_LOAD_PLUGINS"]:
        env.pop("DSH_LOAD_PLUGINS")
    proc = subprocess.run([sys.executable, "-m", "dsh", "run", "--yes", "-m",
                           f"scripted:{script}", "go"], env=env, cwd=ws, capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)
    [ledger] = (data / "dsh" / "sessions").glob("2026*.jsonl") or list(
        p for p in (data / "dsh" / "sessions").glob("*.jsonl") if p != other)
    text = ledger.read_text()
    show = subprocess.run([sys.executable, "-m", "dsh", "sessions", "show", ledger.stem],
                          env=env, capture_output=True, text=True, timeout=120)
    assert show.returncode == 0, show.stderr
    return proc, [json.loads(line) for line in text.splitlines()], text + show.stdout, home


@needs_sandbox
def test_a_scripted_model_cannot_reach_secrets_network_or_dsh(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    home = tmp_path / "home"
    cfg = tmp_path / "cfg" / "dsh"
    commands = [
        f"cat {cfg}/keys/keys.json", f"cat {cfg}/config.toml",
        f"cat {tmp_path}/data/dsh/sessions/20200101-000000.000-aaaaaa.jsonl",
        f"cat {home}/.ssh/id_rsa", f"cat {home}/.aws/credentials",
        f"{sys.executable} -c \"open('{tmp_path}/escaped', 'w')\"",
        f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', {port}))\"",
        f"{sys.executable} -c \"import os, signal; os.kill(os.getppid(), signal.SIGTERM)\"",
        "touch made-in-workspace",
    ]
    proc, events, text, _ = _dsh_run(tmp_path, commands)
    try:
        conn = listener.accept()
        pytest.fail(f"the listener was reached: {conn}")
    except TimeoutError:
        pass
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr  # not killed by the SIGTERM; the run completed
    assert proc.stdout == "done\n"
    assert MARK not in text + proc.stdout + proc.stderr
    assert not (tmp_path / "escaped").exists()
    assert (tmp_path / "ws" / "made-in-workspace").exists()
    results = [e["output"] for e in events if e["type"] == "tool/result"]
    assert len(results) == len(commands)
    for output in results[:5]:
        assert "Permission denied" in output and output.startswith("exit code: 1")
    assert "PermissionError" in results[5]
    assert "Address family not supported" in results[6] or "PermissionError" in results[6]
    assert "PermissionError" in results[7]
    records = [e for e in events if e["type"] == "x/shell/sandbox"]
    assert [r["data"]["call_id"] for r in records] == [
        e["call_id"] for e in events if e["type"] == "tool/call"]
    assert {(r["data"]["policy"], r["data"]["network"], r["data"]["backend"])
            for r in records} == {("workspace-write", False, "landlock")}
    assert "⛨ sandbox of call_0_0 (run_command): workspace-write, no network in " in text
    assert "landlock ABI" in text


def test_with_sandbox_off_the_same_command_runs_and_the_ledger_says_unconfined(
        tmp_path: Path) -> None:
    proc, events, text, home = _dsh_run(tmp_path, [f"cat {tmp_path}/home/notes.txt"],
                                        sandbox="off")
    assert proc.returncode == 0, proc.stderr
    [result] = [e["output"] for e in events if e["type"] == "tool/result"]
    assert "plain notes" in result
    [record] = [e["data"] for e in events if e["type"] == "x/shell/sandbox"]
    assert record["policy"] == "off" and record["backend"] == "none"
    assert "sandbox of call_0_0 (run_command): off — ran unconfined" in text


def test_without_landlock_run_command_refuses_and_the_run_completes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "touch ran"}}]},
        {"text": "done"}]}))
    config = tmp_path / "c.toml"
    config.write_text(f'sessions_dir = {json.dumps(str(tmp_path / "s"))}\n'
                      f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\nallow = ["touch"]\n')
    proc = subprocess.run(without_landlock("-m", "dsh", "--config", str(config), "run",
                                           "--json", "-m", f"scripted:{script}", "go"),
                          capture_output=True, text=True, timeout=180, cwd=ws,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert not (ws / "ran").exists()
    [ledger] = (tmp_path / "s").glob("*.jsonl")
    [result] = [json.loads(line) for line in ledger.read_text().splitlines()
                if '"tool/result"' in line]
    assert result["status"] == "error"
    assert result["output"].startswith("sandbox: cannot confine the command (the kernel has no "
                                       "Landlock (ENOSYS)); it was not run.")
    assert '"off" in [sandbox, agent default]' in result["output"]


def test_dsh_sandbox_run_passes_no_secret_and_reports_the_policy(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "p.toml").write_text('[sandbox]\npolicy = "off"\n')
    proc = subprocess.run([sys.executable, "-m", "dsh", "sandbox", "run", "--policy",
                           str(tmp_path / "p.toml"), "--", "env"], capture_output=True,
                          text=True, cwd=ws, timeout=120,
                          env={**os.environ, "OPENAI_API_KEY": f"sk-{MARK}",
                               "DATABASE_URL": f"postgres://u:{MARK}@h/db"})
    assert proc.returncode == 0, proc.stderr
    assert MARK not in proc.stdout and f"PWD={ws}" in proc.stdout
    assert proc.stderr == "dsh: sandbox: off (unconfined) (none)\n"


@pytest.mark.parametrize(("text", "message"), [
    ('policy = "of"\n', "policy: expected one of"),
    ("network = nan\n", "network: expected true or false, got the number nan"),
    ('read = ["rel"]\n', "read[0]: 'rel' is relative"),
    ('[sandbox]\nwrit = []\n', "unknown key 'writ'; did you mean 'write'"),
    ("not toml = = 3\n", "not valid TOML"),
])
def test_a_bad_policy_file_is_one_line_exit_2(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "p.toml").write_text(text)
    proc = subprocess.run([sys.executable, "-m", "dsh", "sandbox", "run", "--policy",
                           str(tmp_path / "p.toml"), "--", "true"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("dsh: error: ") and message in line and str(tmp_path) in line


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def test_no_plan_ever_grants_a_protected_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Whatever the workspace, the lists and dsh's own paths, a plan never grants a rule at
    or below a protected path, nor write above one: it is a PlanError instead."""
    from hypothesis import given
    from hypothesis import settings
    from hypothesis import strategies as st

    from dsh.sandbox.policy import PlanError
    from dsh.sandbox.policy import build_plan

    base = tmp_path_factory.mktemp("plan")
    tree = ["ws", "ws/a", "ws/a/b", "home", "home/.config", "home/.config/dsh", "data",
            "data/sessions", "etc-like", "etc-like/x"]
    for rel in tree:
        (base / rel).mkdir(parents=True, exist_ok=True)
    paths = [str(base / rel) for rel in tree] + ["/etc", "/usr/lib"]
    pick = st.sampled_from(paths)

    @settings(max_examples=150, deadline=None)
    @given(ws=st.sampled_from(paths[:-2]), protected=st.lists(pick, min_size=1, max_size=3),
           read=st.lists(pick, max_size=2), write=st.lists(pick, max_size=2),
           read_only=st.booleans())
    def check_plan(ws: str, protected: list[str], read: list[str], write: list[str],
                   read_only: bool) -> None:
        policy = Policy(mode="read-only" if read_only else "workspace-write",
                        read=tuple(read), write=() if read_only else tuple(write))
        try:
            plan = build_plan(policy, ws, None, protected)
        except PlanError:
            return
        for path, kind in plan.rules:
            for p in protected:
                assert not _within(path, p), (path, p)
                if kind == "write":
                    assert not _within(p, path), (path, p)

    check_plan()


def test_run_command_in_a_workspace_holding_dshs_data_is_a_tool_error(dsh_env: Any) -> None:
    """The plan is refused before anything runs, and the model reads why."""
    from dsh.core.errors import ToolError
    from dsh.run.app import App

    pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
    app = App.from_config({"plugins": {"shell": {"workspace": str(dsh_env.root)}}})
    with pytest.raises(ToolError, match="holds dsh's own files"):
        app.agent().tools["run_command"].fn(command="ls")


@needs_sandbox
def test_a_fork_flood_in_the_sandbox_dies_with_its_group_at_the_timeout(
        dsh_env: Any, tmp_path: Path) -> None:
    """Resource exhaustion inside the sandbox: the timeout still kills the whole tree."""
    from dsh.core.errors import ToolError
    from dsh.run.app import App

    pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "pids").mkdir()
    mark = f"300.{os.getpid()}{time.monotonic_ns() % 10**6}"  # a duration no other sleep has
    flood = (f"i=0; while [ $i -lt 40 ]; do sleep {mark} & echo $! > pids/$i; i=$((i+1)); "
             "done; wait")
    app = App.from_config({"plugins": {"shell": {"workspace": str(ws), "timeout": 3,
                                                 "allow": ["sh"],
                                                 "tty": str(tmp_path / "no-tty")}}})
    with pytest.raises(ToolError, match="timed out after 3s"):
        app.agent().tools["run_command"].fn(command=f"sh -c '{flood}'")
    assert len(list((ws / "pids").iterdir())) > 0  # some were started
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive_with(f"sleep\0{mark}"):
        time.sleep(0.1)
    assert _alive_with(f"sleep\0{mark}") == []


