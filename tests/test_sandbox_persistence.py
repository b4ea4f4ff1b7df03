"""Persistence paths read-only inside a writable workspace, by the kernel.

A confined command may write its workspace but not what dsh, git or another agent obeys later
without asking: ``.git/config``, ``.git/hooks``, ``.claude/``, ``.mcp.json``, the instruction
files, dsh's ``.dsh`` folder and the project memory file (``dsh.core.beneath.PERSISTENCE``).
Each test observes the outcome from outside: the digest of a file that must not change, a
hook that must not exist, a marker file that a planted ``core.fsmonitor`` would have made.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import ConfigError
from dsh.sandbox import namespaces
from dsh.sandbox.policy import Policy
from dsh.sandbox.policy import parse_policy
from dsh.sandbox.spawn import Popen
from tests.procs import needs_namespaces
from tests.procs import needs_sandbox

SRC = str(Path(__file__).resolve().parents[1])
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

#: What each persistence file holds before the command runs.
FILES = {".mcp.json": '{"mcpServers": {}}\n', "CLAUDE.md": "# instructions\n",
         "AGENTS.md": "# agents\n", "CLAUDE.local.md": "# local\n",
         ".claude/settings.json": '{"hooks": {}}\n', ".dsh/notes": "dsh's own\n"}


def _git(ws: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(ws.parent)}
    return subprocess.run(["git", "-C", str(ws), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


def _project(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    _git(ws, "init", "-q")
    for rel, text in FILES.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


def _digests(ws: Path) -> dict[str, str]:
    """The digest of every file under the persistence paths (and which exist)."""
    out = {}
    for top in (".git", ".claude", ".dsh", ".mcp.json", "CLAUDE.md", "AGENTS.md",
                "CLAUDE.local.md"):
        path = ws / top
        files = sorted(p for p in path.rglob("*")) if path.is_dir() else [path]
        for f in files:
            if f.is_file() and not f.is_symlink():
                out[str(f.relative_to(ws))] = hashlib.sha256(f.read_bytes()).hexdigest()
            elif f.is_symlink():
                out[str(f.relative_to(ws))] = "-> " + os.readlink(f)
    return out


def _run(ws: Path, script: str, policy: Policy | None = None, **kwargs: Any
         ) -> tuple[Popen, str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(ws), "GIT_CONFIG_NOSYSTEM": "1",
           "LANG": "C.UTF-8"}
    proc = Popen(["sh", "-c", textwrap.dedent(script)], policy or Policy(), workspace=str(ws),
                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                 env=env, **kwargs)
    out, _ = proc.communicate(timeout=120)
    return proc, out.decode(errors="replace")


#: Every way a command might plant persistence, each its own line (``|| true``: the next one
#: still runs), then ordinary work in the same workspace, which must still succeed.
ATTACKS = """
    git config core.fsmonitor "touch $PWD/../pwned-fsmonitor" || true
    echo '[core] hooksPath = ../evil' >> .git/config || true
    printf '#!/bin/sh\\ntouch ../pwned-hook\\n' > .git/hooks/pre-commit || true
    chmod +x .git/hooks/pre-commit || true
    rm -rf .git/hooks || true
    mv .git/config .git/config.old || true
    ln .git/config hardlink-to-config || true
    mv .git .g && mkdir .git && echo '[core] fsmonitor = evil' > .git/config || true
    mv .claude .c || true
    rm -f CLAUDE.md || true
    echo '{"mcpServers": {"x": {"command": "evil"}}}' > .mcp.json || true
    echo evil > CLAUDE.md || true
    echo evil >> AGENTS.md || true
    echo evil > CLAUDE.local.md || true
    echo '{"hooks": {"PreToolUse": []}}' > .claude/settings.json || true
    mkdir -p .claude/agents && echo evil > .claude/agents/default.md || true
    echo evil > .dsh/notes || true
    mv CLAUDE.md elsewhere.md || true
    echo ok > notes.txt && mkdir -p src && echo 'print(1)' > src/app.py && echo made-files
    git add notes.txt src && git -c user.email=a@b -c user.name=a commit -qm work \\
        && echo committed || true
"""


@needs_sandbox
@needs_namespaces
@needs_git
@pytest.mark.parametrize("launcher", [False, True], ids=["in-child", "launcher"])
def test_persistence_paths_are_read_only_and_the_rest_of_the_workspace_is_not(
        tmp_path: Path, launcher: bool) -> None:
    ws = _project(tmp_path)
    before = _digests(ws)
    proc, out = _run(ws, ATTACKS, launcher=launcher)
    assert _digests(ws) == before, out
    assert not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert not (ws / ".g").exists() and not (ws / ".c").exists()
    assert not (ws / "hardlink-to-config").exists()
    assert not (ws / ".claude" / "agents").exists()
    assert "Read-only file system" in out and "Device or resource busy" in out
    # ordinary work: files made; all of .git is read-only (commondir and the index could
    # point git at another config), so committing needs unprotected = [".git"]
    assert "made-files" in out and "committed" not in out, out
    assert (ws / "notes.txt").read_text() == "ok\n" and (ws / "src" / "app.py").exists()
    assert _git(ws, "rev-list", "--all", "--count").strip() == "0"  # nothing committed
    # the user's next git command obeys nothing the sandbox wrote
    _git(ws, "status")
    assert not list(tmp_path.glob("pwned*"))
    assert proc.sandbox["namespaces"] == ["user", "mount", "pid"]
    assert set(proc.sandbox["read_only"]) == {".git", ".claude", ".dsh", ".mcp.json",
                                              "CLAUDE.md", "AGENTS.md", "CLAUDE.local.md"}
    # the person may let commands commit: then git writes its objects, index and refs
    policy = parse_policy({"unprotected": [".git"]}, where="sandbox")
    proc, out = _run(ws, """
        git add notes.txt src && git -c user.email=a@b -c user.name=a commit -qm work \\
            && echo committed
    """, policy, launcher=launcher)
    assert "committed" in out, out
    assert "work" in _git(ws, "log", "--format=%s")


@needs_sandbox
@needs_namespaces
def test_unprotected_makes_that_path_writable_and_only_that(tmp_path: Path) -> None:
    ws = _project(tmp_path)
    policy = parse_policy({"unprotected": ["CLAUDE.md", ".claude/"]}, where="sandbox")
    proc, out = _run(ws, """
        echo new > CLAUDE.md && echo wrote-claude
        echo '{}' > .claude/settings.json && echo wrote-settings
        echo new > AGENTS.md || true
    """, policy)
    assert "wrote-claude" in out and "wrote-settings" in out, out
    assert (ws / "CLAUDE.md").read_text() == "new\n"
    assert (ws / ".claude" / "settings.json").read_text() == "{}\n"
    assert (ws / "AGENTS.md").read_text() == FILES["AGENTS.md"]
    assert proc.sandbox["unprotected"] == ["CLAUDE.md", ".claude"]
    assert "CLAUDE.md" not in proc.sandbox["read_only"]
    assert "AGENTS.md" in proc.sandbox["read_only"]


@pytest.mark.parametrize(("value", "message"), [
    ("CLAUDE.md", "unprotected: expected a list of persistence paths"),
    (["/etc/passwd"], "unprotected[0]: '/etc/passwd' is absolute"),
    (["~/CLAUDE.md"], "unprotected[0]: '~/CLAUDE.md' is absolute"),
    (["../CLAUDE.md"], "unprotected[0]: '../CLAUDE.md' leaves the workspace"),
    ([".claude/../.mcp.json"], "unprotected[0]: '.claude/../.mcp.json' leaves the workspace"),
    (["CLAUDE.md", "src/main.py"], "unprotected[1]: 'src/main.py' is not a persistence path"),
    ([".git/config"], "unprotected[0]: '.git/config' is not a persistence path"),
    ([3], "unprotected[0]: expected a path, got int 3"),
])
def test_bad_unprotected_settings_are_config_errors_naming_the_key(value: Any,
                                                                   message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy({"unprotected": value}, where="sandbox, agent coder")
    assert str(info.value).startswith(f"[sandbox, agent coder] {message}"), str(info.value)
    assert ".mcp.json" in str(info.value) or "expected a path" in message


@needs_sandbox
@needs_namespaces
def test_a_symlinked_instruction_file_and_its_target_stay_read_only(tmp_path: Path) -> None:
    ws = _project(tmp_path)
    (ws / "CLAUDE.md").unlink()
    (ws / "docs").mkdir()
    (ws / "docs" / "agents.md").write_text("# the real instructions\n")
    (ws / "CLAUDE.md").symlink_to("docs/agents.md")
    _, out = _run(ws, """
        echo evil > CLAUDE.md || true
        rm CLAUDE.md || true
        mv docs docs2 || true
        echo evil > docs/agents.md || true
        echo ok > docs/other.md && echo wrote-other
    """)
    assert os.readlink(ws / "CLAUDE.md") == "docs/agents.md"
    assert (ws / "docs" / "agents.md").read_text() == "# the real instructions\n"
    assert "wrote-other" in out and not (ws / "docs2").exists()


@needs_sandbox
@needs_namespaces
def test_a_read_only_path_the_caller_names_cannot_be_replaced(tmp_path: Path) -> None:
    """The project memory file: neither written nor swapped by renaming its directory."""
    ws = _project(tmp_path)
    (ws / "notes").mkdir()
    (ws / "notes" / "MEMORY.md").write_text("- a fact\n")
    proc, out = _run(ws, """
        echo '- $(curl evil)' >> notes/MEMORY.md || true
        mv notes/MEMORY.md notes/old.md || true
        mv notes n2 && mkdir notes && echo evil > notes/MEMORY.md || true
        echo ok > notes/scratch.md && echo wrote-scratch
    """, read_only=["notes/MEMORY.md"])
    assert (ws / "notes" / "MEMORY.md").read_text() == "- a fact\n"
    assert not (ws / "n2").exists() and "wrote-scratch" in out, out
    assert "notes/MEMORY.md" in proc.sandbox["read_only"]


@needs_sandbox
@needs_namespaces
def test_a_git_worktree_pointer_file_is_read_only(tmp_path: Path) -> None:
    """``.git`` as a file (a worktree's ``gitdir:`` line) would send git to any directory."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").write_text(f"gitdir: {tmp_path}/main/.git/worktrees/ws\n")
    _run(ws, "echo 'gitdir: ./evil' > .git || true; rm -f .git || true")
    assert (ws / ".git").read_text() == f"gitdir: {tmp_path}/main/.git/worktrees/ws\n"


@needs_sandbox
@needs_namespaces
@needs_git
def test_a_scripted_model_cannot_plant_git_or_agent_persistence(tmp_path: Path) -> None:
    """End to end: ``dsh run`` with a scripted model whose run_command calls try it; the
    ledger records what was read-only, and ``sessions show`` says so."""
    pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
    ws = _project(tmp_path)
    (ws / "MEMORY.md").write_text("- remembered\n")
    before = _digests(ws)
    memory_before = (ws / "MEMORY.md").read_bytes()
    commands = [
        f"git config core.fsmonitor 'touch {tmp_path}/pwned-fsmonitor'",
        "sh -c 'printf \"#!/bin/sh\\ntouch ../pwned\\n\" > .git/hooks/pre-commit'",
        "sh -c 'mv .git .g && mkdir .git'",
        "sh -c 'echo evil > CLAUDE.md; echo x > .claude/settings.json; echo y > .mcp.json'",
        "sh -c 'echo \"- $(id)\" >> MEMORY.md'",
        "sh -c 'echo ok > made.txt'",
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        *({"tool_calls": [{"name": "run_command", "arguments": {"command": c}}]}
          for c in commands), {"text": "done"}]}))
    sessions = tmp_path / "sessions"
    config = tmp_path / "dsh.toml"
    config.write_text(f'sessions_dir = {json.dumps(str(sessions))}\n'
                      f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\n'
                      'allow = ["git", "sh"]\n'
                      '[plugins."dsh.memory"]\nenabled = true\nfile = "MEMORY.md"\n')
    env = {**os.environ, "NO_COLOR": "1", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)}
    env.pop("DSH_LOAD_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), "run",
                           "-m", f"scripted:{script}", "go"], env=env, cwd=ws,
                          capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n"
    assert _digests(ws) == before
    assert (ws / "MEMORY.md").read_bytes() == memory_before
    assert (ws / "made.txt").read_text() == "ok\n"
    _git(ws, "status")
    assert not list(tmp_path.glob("pwned*"))
    [ledger] = sessions.glob("*.jsonl")
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    records = [e["data"] for e in events if e["type"] == "x/shell/sandbox"]
    assert len(records) == len(commands)
    assert all(r["namespaces"] == ["user", "mount", "pid"] for r in records)
    assert all({".git", "CLAUDE.md", "MEMORY.md"} <= set(r["read_only"])
               for r in records)
    results = [e["output"] for e in events if e["type"] == "tool/result"]
    assert "Read-only file system" in results[1] and "Device or resource busy" in results[2]
    show = subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), "sessions",
                           "show", ledger.stem], env=env, capture_output=True, text=True,
                          timeout=120)
    assert show.returncode == 0, show.stderr
    assert "namespaces user+mount+pid; read-only " in show.stdout
    assert ".git" in show.stdout


# --------------------------------------------------------------------------------------------
# Without user namespaces: Landlock and seccomp as before, and the record says so
# --------------------------------------------------------------------------------------------

#: A seccomp filter in the test's process that makes unshare(2) fail with EPERM, as with
#: kernel.unprivileged_userns_clone = 0 or a container's profile; then the rest of the script.
NO_USERNS = """
    import ctypes, json, os, struct, subprocess, sys
    sys.path.insert(0, {src!r})
    from dsh.sandbox import exec as launcher, namespaces
    arch, _, _ = launcher.ARCHES[os.uname().machine]
    unshare = namespaces.NS_CALLS[os.uname().machine][0]
    prog = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), (0x06, 0, 0, 0x7FFF0000),
            (0x20, 0, 0, 0), (0x15, 0, 1, unshare), (0x06, 0, 0, 0x00050000 | 1),
            (0x06, 0, 0, 0x7FFF0000)]
    code = b"".join(struct.pack("=HBBI", *i) for i in prog)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(code, len(code))
    class P(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    p = P(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(p), 0, 0) == 0
    from dsh.sandbox.policy import Policy, describe_record
    from dsh.sandbox.spawn import Popen
    ws, outside = sys.argv[1], sys.argv[2]
    out = {{}}
    for launcher in (False, True):
        proc = Popen(["sh", "-c", "echo x >> .git/config; echo made > made; "
                      "echo no > " + outside + " 2>/dev/null; grep ^Seccomp: /proc/self/status"],
                     Policy(), workspace=ws, stdout=subprocess.PIPE, launcher=launcher)
        text, _ = proc.communicate(timeout=60)
        out[str(launcher)] = [proc.returncode, text.decode(), proc.sandbox,
                              describe_record(proc.sandbox)]
    print(json.dumps(out))
"""


@needs_sandbox
def test_without_user_namespaces_commands_run_confined_as_before_and_say_so(
        tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "config").write_text("")
    outside = tmp_path / "outside"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(NO_USERNS.format(src=SRC)),
                           str(ws), str(outside)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for code, text, record, line in json.loads(proc.stdout).values():
        assert code == 0 and text.split() == ["Seccomp:", "2"]  # still Landlock and seccomp
        assert record["namespaces"] == [] and "read_only" not in record
        assert record["fallback"] == "unshare failed: Operation not permitted"
        assert line.endswith("no namespaces (unshare failed: Operation not permitted): "
                             "persistence paths stay writable, background processes may "
                             "outlive the call")
    assert not outside.exists()  # the workspace is still all it may write
    assert (ws / "made").exists()
    assert (ws / ".git" / "config").read_text() == "x\nx\n"  # the documented fallback


#: Run as another user: dsh made non-dumpable (as dsh-shell does before its first command),
#: then one confined command that tries to plant a hook and reports its record.
AS_USER = """
    import ctypes, json, subprocess, sys
    sys.path[:0] = [{src!r}, *{site!r}]
    assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0
    from dsh.sandbox.policy import Policy
    from dsh.sandbox.spawn import Popen
    proc = Popen(["sh", "-c", "echo evil > .git/hooks/pre-commit; echo ok > made; id -u"],
                 Policy(), workspace=sys.argv[1], stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=60)
    print(json.dumps([out.decode(), proc.sandbox]))
"""


def _python_for_anyone() -> str | None:
    """An interpreter of this Python version that any user may run (the test's own may live
    in a home directory closed to others)."""
    for exe in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if exe and all(os.stat(p).st_mode & 0o001 for p in Path(exe).resolve().parents) \
                and subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"],
                                   capture_output=True, text=True).stdout.strip() \
                == str(sys.version_info[:2]):
            return exe
    return None


@needs_sandbox
@needs_namespaces
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_a_user_that_is_not_root_gets_the_same_protection() -> None:
    python = _python_for_anyone()
    if python is None:
        pytest.skip("no interpreter that another user may run")
    site = [p for p in sys.path if p.endswith("site-packages")]
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="dsh-test-user-"))  # pytest's is closed to others
    try:
        _as_nobody(python, site, tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _as_nobody(python: str, site: list[str], tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("")
    for path in (tmp_path, ws, ws / ".git", ws / ".git" / "hooks", ws / ".git" / "config"):
        os.chown(path, 65534, 65534)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "DSH_HOME": str(tmp_path / "home")}
    proc = subprocess.run([python, "-c", textwrap.dedent(AS_USER.format(src=SRC, site=site)),
                           str(ws)], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path, user=65534, group=65534, extra_groups=[])
    assert proc.returncode == 0, proc.stderr
    out, record = json.loads(proc.stdout)
    assert "Read-only file system" in out and out.endswith("65534\n"), out
    assert record["namespaces"] == ["user", "mount", "pid"], record
    assert not (ws / ".git" / "hooks" / "pre-commit").exists() and (ws / "made").exists()


@needs_sandbox
@needs_namespaces
@needs_git
def test_persistence_a_command_creates_is_moved_aside_when_it_ends(tmp_path: Path) -> None:
    """A path that did not exist cannot be a read-only mount: `git init` with a planted
    core.fsmonitor (or a new .mcp.json, .claude) is renamed aside once the command ends, so the
    user's next `git status` there obeys nothing the sandbox wrote."""
    ws = tmp_path / "plain"
    ws.mkdir()
    proc, out = _run(ws, f"""
        git init -q . && git config core.fsmonitor "touch {tmp_path}/pwned" && echo inited
        echo '{{"mcpServers": {{}}}}' > .mcp.json
        mkdir -p .claude/agents && echo evil > .claude/agents/default.md
        echo ok > notes.txt
        (sleep 1; mkdir .dsh) &
    """)
    assert "inited" in out, out
    assert not (ws / ".git").exists() and not (ws / ".mcp.json").exists()
    assert not (ws / ".claude").exists() and not (ws / ".dsh").exists()
    assert (ws / "notes.txt").read_text() == "ok\n"
    moved = {m["path"] for m in proc.sandbox["quarantined"]}
    assert moved == {".git", ".mcp.json", ".claude"}  # .dsh: its maker died with the call
    subprocess.run(["git", "status"], cwd=ws, capture_output=True,
                   env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert not (tmp_path / "pwned").exists()
    policy = parse_policy({"unprotected": [".git"]}, where="sandbox")
    proc, out = _run(ws, "git init -q . && echo inited", policy)
    assert (ws / ".git").is_dir() and "quarantined" not in proc.sandbox


@needs_sandbox
@needs_namespaces
def test_run_command_tells_the_model_what_was_moved_aside(dsh_make_app: Any,
                                                          tmp_path: Path) -> None:
    pytest.importorskip("dsh_shell", reason="pip install ./plugins/dsh-shell")
    ws = tmp_path / "ws"
    ws.mkdir()
    app = dsh_make_app({"agents": {"default": {"plugins": ["shell"]}}, "plugins": {"shell": {
        "workspace": str(ws), "allow": ["sh"]}}}, script=[
        {"tool_calls": [{"name": "run_command", "arguments": {
            "command": "sh -c 'echo {} > .mcp.json'"}}]}, {"text": "done"}])
    run = app.run("go")
    [result] = [e for e in run.events if e.type == "tool/result"]
    assert "created .mcp.json (now .mcp.json.dsh-quarantined-" in result.output
    assert "[sandbox] unprotected" in result.output and not (ws / ".mcp.json").exists()


def _user_git(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The user's own git afterwards: unconfined, never looking above the test's folder."""
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(ws.parent),
           "GIT_CEILING_DIRECTORIES": str(ws.parent)}
    return subprocess.run(["git", *args], cwd=ws, capture_output=True, text=True, env=env)


@needs_sandbox
@needs_namespaces
@needs_git
def test_a_nested_repository_is_read_only_so_git_status_runs_nothing_planted(
        tmp_path: Path) -> None:
    """`git status` recurses into a gitlink (no .gitmodules needed) and obeys that repository's
    own config: each nested git directory is read-only — found by a shallow scan, at a
    `.gitmodules` path, and where a `gitdir:` file points inside the workspace."""
    ws = _project(tmp_path)
    (ws / "lib").mkdir()
    _git(ws / "lib", "init", "-q")
    (ws / "lib" / "a.txt").write_text("a\n")
    _git(ws / "lib", "add", "a.txt")
    _git(ws / "lib", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "a")
    _git(ws, "add", "lib")  # an embedded repository: a gitlink (mode 160000) in the index
    assert _git(ws, "ls-files", "-s", "lib").startswith("160000")
    (ws / "deep" / "a" / "b").mkdir(parents=True)
    _git(ws / "deep" / "a" / "b", "init", "-q")
    (ws / "store").mkdir()
    _git(ws, "init", "-q", f"--separate-git-dir={ws}/store/vendored", str(ws / "vendored"))
    (ws / ".gitmodules").write_text('[submodule "far"]\n\tpath = x/y/z/w/far\n')
    (ws / "x" / "y" / "z" / "w" / "far").mkdir(parents=True)
    _git(ws / "x" / "y" / "z" / "w" / "far", "init", "-q")
    before = {rel: (ws / rel).read_bytes() for rel in (
        "lib/.git/config", "deep/a/b/.git/config", "vendored/.git", "store/vendored/config",
        "x/y/z/w/far/.git/config")}
    proc, out = _run(ws, f"""
        git -C lib config core.fsmonitor "touch {tmp_path}/pwned-nested" || true
        echo '[core] fsmonitor = evil' >> deep/a/b/.git/config || true
        echo '[core] fsmonitor = evil' >> store/vendored/config || true
        echo 'gitdir: ../elsewhere' > vendored/.git || true
        git -C x/y/z/w/far config core.fsmonitor evil || true
        mv lib/.git lib/.g || true
        echo ok > lib/b.txt && echo ok > deep/a/b/c.txt && echo wrote-files
    """)
    assert {rel: (ws / rel).read_bytes() for rel in before} == before, out
    assert not (ws / "lib" / ".g").exists() and "wrote-files" in out, out
    assert (ws / "lib" / "b.txt").read_text() == "ok\n"
    assert {"lib/.git", "deep/a/b/.git", "vendored/.git", "store/vendored",
            "x/y/z/w/far/.git"} <= set(proc.sandbox["read_only"])
    assert "read_only_scan" not in proc.sandbox
    _user_git(ws, "status")
    assert not list(tmp_path.glob("pwned*"))
    # `.git` unprotected: the nested repositories are git's too, and writable
    policy = parse_policy({"unprotected": [".git"]}, where="sandbox")
    proc, out = _run(ws, "git -C lib config user.name me && echo configured", policy)
    assert "configured" in out and "lib/.git" not in proc.sandbox["read_only"], out


def _hooked_project(tmp_path: Path, config: str) -> Path:
    ws = _project(tmp_path)
    with (ws / ".git" / "config").open("a") as f:
        f.write(textwrap.dedent(config))
    return ws


@needs_sandbox
@needs_namespaces
@needs_git
def test_hooks_path_and_included_configs_in_the_workspace_are_read_only(
        tmp_path: Path) -> None:
    """husky's `core.hooksPath = .husky` and the files `.git/config` includes (relative to
    `.git`, absolute, conditional, included by an included file) cannot be rewritten, so the
    user's next commit runs no planted hook; other files stay writable."""
    ws = _hooked_project(tmp_path, f"""\
        [core] hooksPath = .husky
        [include]
        \tpath = ../extra.gitconfig
        [includeIf "gitdir:{tmp_path}/"]
        \tpath = "{tmp_path}/ws/cond.gitconfig"
    """)
    (ws / ".husky").mkdir()
    (ws / ".husky" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (ws / ".husky" / "pre-commit").chmod(0o755)
    (ws / "extra.gitconfig").write_text("[include]\n\tpath = conf/nested.gitconfig\n")
    (ws / "cond.gitconfig").write_text("[user]\n\tname = me\n")
    (ws / "conf").mkdir()
    (ws / "conf" / "nested.gitconfig").write_text("[user]\n\temail = me@example.com\n")
    kept = (".husky/pre-commit", "extra.gitconfig", "cond.gitconfig", "conf/nested.gitconfig")
    before = {rel: (ws / rel).read_bytes() for rel in kept}
    proc, out = _run(ws, f"""
        printf '#!/bin/sh\\ntouch {tmp_path}/pwned-hook\\n' > .husky/pre-commit || true
        printf '#!/bin/sh\\ntouch {tmp_path}/pwned-hook\\n' > .husky/post-commit || true
        mv .husky .h || true
        echo '[core] fsmonitor = "touch {tmp_path}/pwned-fs"' >> extra.gitconfig || true
        echo '[core] fsmonitor = "touch {tmp_path}/pwned-fs"' >> cond.gitconfig || true
        echo '[core] fsmonitor = "touch {tmp_path}/pwned-fs"' >> conf/nested.gitconfig || true
        echo ok > notes.txt && echo ok > conf/other.txt && echo wrote-files
    """)
    assert {rel: (ws / rel).read_bytes() for rel in kept} == before, out
    assert not (ws / ".husky" / "post-commit").exists() and not (ws / ".h").exists()
    assert "wrote-files" in out and (ws / "conf" / "other.txt").read_text() == "ok\n", out
    assert {".husky", "extra.gitconfig", "cond.gitconfig", "conf/nested.gitconfig"} <= set(
        proc.sandbox["read_only"]), proc.sandbox["read_only"]
    assert "conf" not in proc.sandbox["read_only"]
    done = _user_git(ws, "commit", "-q", "--allow-empty", "-m", "mine")
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("pwned*"))


@needs_sandbox
@needs_namespaces
@needs_git
def test_a_hooks_path_outside_the_workspace_is_left_alone_and_a_missing_one_is_moved_aside(
        tmp_path: Path) -> None:
    (tmp_path / "outside-hooks").mkdir()
    ws = _hooked_project(tmp_path, f"""\
        [core]
        \thooksPath = {tmp_path}/outside-hooks
        \thooksPath = ../outside-hooks
        \thooksPath = .githooks
    """)
    proc, out = _run(ws, """
        mkdir .githooks && printf '#!/bin/sh\\nexit 1\\n' > .githooks/pre-commit && echo made
    """)
    assert "made" in out, out
    assert not any("outside" in p or p.startswith("/") for p in proc.sandbox["read_only"])
    assert not (ws / ".githooks").exists()
    assert [m["path"] for m in proc.sandbox["quarantined"]] == [".githooks"]


@needs_sandbox
@needs_namespaces
def test_a_scan_that_hits_its_bound_says_so_in_the_record(tmp_path: Path) -> None:
    from dsh.sandbox import gitpaths
    from dsh.sandbox import policy

    ws = _project(tmp_path)
    (ws / "big").mkdir()
    for n in range(gitpaths.GIT_SCAN_ENTRIES + 10):
        (ws / "big" / f"f{n}").touch()
    proc, _ = _run(ws, "true")
    assert f"stopped after {gitpaths.GIT_SCAN_ENTRIES} entries" in proc.sandbox["read_only_scan"]
    assert "nested git repositories" in policy.describe_record(proc.sandbox)


@pytest.mark.parametrize(("text", "expected"), [
    ("[core] hooksPath = .husky\n", [("core.hookspath", ".husky")]),
    ('[CORE]\n\tHooksPath = "a b" ; comment\n', [("core.hookspath", "a b")]),
    ('[includeIf "gitdir:~/w/"]\n path = x\\\ny # c\n', [("includeif.gitdir:~/w/.path", "xy")]),
    ("[core]\n\tbare\n[a.B]\nk = v\\tw\n", [("core.bare", "true"), ("a.b.k", "v\tw")]),
    ("[core]\n\tfsmonitor = \"x\n[core] hooksPath = h\n", []),  # malformed: git refuses it
])
def test_git_config_is_parsed_as_git_reads_it(text: str, expected: list[Any]) -> None:
    from dsh.sandbox.gitpaths import parse_git_config

    assert parse_git_config(text) == expected


#: The sandbox's libc with ``unshare`` failing EINVAL ``sys.argv[2]`` times in each child
#: (a count in the child's own memory), the rest of the script runs one command.
FLAKY_UNSHARE = """
    import json, os, subprocess, sys
    sys.path.insert(0, {src!r})
    from dsh.sandbox import child, namespaces
    from dsh.sandbox.policy import Policy
    from dsh.sandbox.spawn import Popen, SandboxUnavailable
    real = child._libc()
    unshare = namespaces.NS_CALLS[os.uname().machine][0]
    class Flaky:
        failures = int(sys.argv[2])
        def __getattr__(self, name):
            return getattr(real, name)
        def syscall(self, number, *args):
            if number == unshare and Flaky.failures > 0:
                Flaky.failures -= 1
                self.refused = True
                return -1
            self.refused = False
            return real.syscall(number, *args)
        def errno(self):
            return 22 if self.refused else real.errno()
    assert child.namespaces_unavailable() == ""  # probed (once per process) before
    child._libc = lambda: Flaky()
    try:
        proc = Popen(["readlink", "/proc/self/ns/user"], Policy(), workspace=sys.argv[1],
                     stdout=subprocess.PIPE)
        text, _ = proc.communicate(timeout=60)
        print(json.dumps([proc.returncode, text.decode().strip(), os.readlink(
            "/proc/self/ns/user"), proc.sandbox["namespaces"]]))
    except SandboxUnavailable as exc:
        print(json.dumps(str(exc)))
"""


def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


@needs_namespaces
@pytest.mark.parametrize("failures", [1, len(namespaces.UNSHARE_RETRIES)])
def test_a_transient_einval_from_unshare_is_tried_again(tmp_path: Path, failures: int) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(FLAKY_UNSHARE.format(src=SRC)),
                           str(ws(tmp_path)), str(failures)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    code, inside, outside, spaces = json.loads(proc.stdout)
    assert code == 0 and spaces == ["user", "mount", "pid"]
    assert inside.startswith("user:[") and inside != outside  # in its own user namespace


@needs_namespaces
def test_an_unshare_that_keeps_failing_is_a_refusal_not_a_loop(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(FLAKY_UNSHARE.format(src=SRC)),
                           str(ws(tmp_path)), "1000"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "cannot confine the command (unshare failed: Invalid argument); it was not run" \
        in json.loads(proc.stdout)
