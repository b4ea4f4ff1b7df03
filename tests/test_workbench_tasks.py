"""Coding tasks end to end: each runs through a real ``dsh run`` subprocess with a scripted
model, and its outcome is checked on disk and in the ledger.

Each task is run three ways: in ``full-auto`` (or ``auto-edit``) it does what it says, and
every change it made is in the ledger as a diff that undoes exactly (rewind-ready); in the
default ``ask`` mode without a terminal every write is refused and nothing on disk changes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import pytest

from dsh.core.messages import Change
from dsh.ledger.serialize import raw_changes
from dsh.tools import changes

pytest.importorskip("dsh_shell")

#: The tools that change files: in ``ask`` mode without a terminal, each call is refused.
WRITERS = {"write_file", "edit_file", "multi_edit", "apply_patch"}


@attrs.frozen
class Task:
    name: str
    prompt: str
    #: Files before the run (path -> text).
    files: dict[str, str]
    #: The scripted model's responses.
    responses: tuple[dict[str, Any], ...]
    #: Checks the workspace and the ledger's events after a permitted run.
    check: Callable[[Path, list[dict[str, Any]]], None]
    mode: str = "full-auto"
    #: Needs the kernel sandbox (shell syntax, background jobs).
    sandboxed: bool = False
    #: Needs dsh-web and a loopback page.
    web: bool = False
    #: The person gave the sandbox a network (``[sandbox] network = true``): the commands
    #: leave the sandbox, so they are asked in every mode, and ``--yes`` answers.
    network: bool = False


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def _calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


DONE = {"text": "done"}


def _results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "tool/result"]


def _ok(events: list[dict[str, Any]]) -> list[str]:
    return [r["status"] for r in _results(events)]


# -- the tasks ---------------------------------------------------------------------------------

BIG = "".join(f"line {i}: value = {i * 7}\n" for i in range(1, 5001))


def _one_line(ws: Path, events: list[dict[str, Any]]) -> None:
    want = BIG.replace("line 2500: value = 17500\n", "line 2500: value = 0\n")
    assert (ws / "big.txt").read_text() == want
    [result] = _results(events)
    assert result["status"] == "ok"
    [change] = result["changes"]
    assert (change["added"], change["removed"]) == (1, 1)
    assert "+line 2500: value = 0" in result["output"]  # the model reads its diff


SRC_A = "def fetch_data(url):\n    return url\n\n\nprint(fetch_data('x'))\n"
SRC_B = "from a import fetch_data\n\nfetch_data('y')\nfetch_data('z')\n"


def _renamed(ws: Path, events: list[dict[str, Any]]) -> None:
    assert (ws / "pkg/a.py").read_text() == SRC_A.replace("fetch_data", "load_data")
    assert (ws / "pkg/b.py").read_text() == SRC_B.replace("fetch_data", "load_data")
    grep = _results(events)[0]
    assert grep["name"] == "grep" and "pkg/a.py:1:" in grep["output"] \
        and "pkg/b.py:3:" in grep["output"]
    assert _ok(events) == ["ok", "ok", "ok"]


PATCH = textwrap.dedent("""\
    *** Begin Patch
    *** Add File: docs/new.md
    +# New
    +written by a patch
    *** Update File: src/old_name.py
    *** Move to: src/new_name.py
    @@
     def f():
    -    return 1
    +    return 2
    *** Delete File: obsolete.txt
    *** End Patch
""")


def _patched(ws: Path, events: list[dict[str, Any]]) -> None:
    assert (ws / "docs/new.md").read_text() == "# New\nwritten by a patch\n"
    assert (ws / "src/new_name.py").read_text() == "def f():\n    return 2\n"
    assert not (ws / "src/old_name.py").exists() and not (ws / "obsolete.txt").exists()
    [result] = _results(events)
    assert sorted(c["op"] for c in result["changes"]) == ["add", "delete", "move"]


def _globbed(ws: Path, events: list[dict[str, Any]]) -> None:
    [result] = _results(events)
    assert result["status"] == "ok"
    found = [line for line in result["output"].splitlines() if line.endswith(".py")]
    assert found == ["src/app.py", "src/lib/util.py", "tests/test_app.py"]
    assert "ignored.py" not in result["output"]  # .gitignore'd


def _tested(ws: Path, events: list[dict[str, Any]]) -> None:
    [result] = _results(events)
    assert result["status"] == "ok", result["output"]
    assert "Ran 3 tests" in result["output"] and "OK" in result["output"]
    assert "exit code: 0" in result["output"]


def _refused_protected(ws: Path, events: list[dict[str, Any]]) -> None:
    assert (ws / ".mcp.json").read_text() == '{"mcpServers": {}}\n'
    [result] = _results(events)
    assert result["status"] == "error" and ".mcp.json" in result["output"]
    assert "changes" not in result


def _corrected(ws: Path, events: list[dict[str, Any]]) -> None:
    assert (ws / "conf.ini").read_text() == "[a]\nport = 80\n[b]\nport = 9090\n"
    first, second = _results(events)
    assert first["status"] == "error" and "2" in first["output"]  # how many matched
    assert "lines 2, 4" in first["output"]  # and where
    assert second["status"] == "ok"


def _fetched(ws: Path, events: list[dict[str, Any]]) -> None:
    [result] = _results(events)
    assert result["status"] == "ok", result["output"]
    assert "# Release notes" in result["output"] and "untrusted" in result["output"].lower()


CLIENT = textwrap.dedent("""\
    import sys, time, urllib.request
    for _ in range(200):  # the server may still be starting
        try:
            print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
            break
        except OSError:
            time.sleep(0.05)
""")


def _served(ws: Path, events: list[dict[str, Any]]) -> None:
    started, queried, output, killed = _results(events)
    assert started["status"] == "ok" and "job 1" in started["output"], started["output"]
    assert "served by a background job" in queried["output"], queried["output"]
    assert "GET /index.txt" in output["output"], output["output"]  # the server's own log
    assert killed["status"] == "ok"


def _crlf_fixed(ws: Path, events: list[dict[str, Any]]) -> None:
    assert (ws / "win/setup.bat").read_bytes() == b"@echo off\r\nset MODE=release\r\n"
    listed, read, edited = _results(events)
    assert "win/" in listed["output"] and "setup.bat" in listed["output"]
    assert edited["status"] == "ok" and "changed on disk" not in edited["output"]


def _two_files_patched(ws: Path, events: list[dict[str, Any]]) -> None:
    assert (ws / "one.py").read_text() == "import new_api\nnew_api.run()\n"
    assert (ws / "two.py").read_text() == "import new_api\n"
    found, patched = _results(events)
    assert found["output"].count(":1:") == 2 and patched["status"] == "ok"
    assert sorted(c["path"] for c in patched["changes"]) == ["one.py", "two.py"]


TWO = textwrap.dedent("""\
    *** Begin Patch
    *** Update File: one.py
    @@
    -import old_api
    -old_api.run()
    +import new_api
    +new_api.run()
    *** Update File: two.py
    @@
    -import old_api
    +import new_api
    *** End Patch
""")


TASKS = [
    Task("change one line of a large file", "set line 2500's value to 0",
         {"big.txt": BIG},
         (_call("edit_file", path="big.txt", old="line 2500: value = 17500\n",
                new="line 2500: value = 0\n"), DONE), _one_line, mode="auto-edit"),
    Task("rename a function across files", "rename fetch_data to load_data",
         {"pkg/a.py": SRC_A, "pkg/b.py": SRC_B},
         (_call("grep", pattern=r"fetch_data", path="pkg"),
          _calls(("multi_edit", {"path": "pkg/a.py", "edits": [
              {"old": "def fetch_data(", "new": "def load_data("},
              {"old": "print(fetch_data(", "new": "print(load_data("}]}),
                 ("multi_edit", {"path": "pkg/b.py", "edits": [
                     {"old": "fetch_data", "new": "load_data", "replace_all": True}]})),
          DONE), _renamed, mode="auto-edit"),
    Task("apply a patch that adds, moves and deletes", "apply the patch",
         {"src/old_name.py": "def f():\n    return 1\n", "obsolete.txt": "old\n"},
         (_call("apply_patch", patch=PATCH), DONE), _patched, mode="auto-edit"),
    Task("find files by glob", "list the Python files",
         {"src/app.py": "", "src/lib/util.py": "", "tests/test_app.py": "", "README.md": "",
          "build/ignored.py": "", ".gitignore": "build/\n"},
         (_call("glob", pattern="**/*.py"), DONE), _globbed),
    Task("run the tests through a pipeline", "run the tests",
         {"test_m.py": "import unittest\n\n\nclass T(unittest.TestCase):\n"
                       "    def test_a(self): pass\n    def test_b(self): pass\n"
                       "    def test_c(self): pass\n"},
         (_call("run_command", command=f"{sys.executable} -B -m unittest test_m 2>&1 | tail -n 3"),
          DONE),
         _tested, sandboxed=True),
    Task("start a server in the background, query it, kill it", "check the server answers",
         {"client.py": CLIENT, "index.txt": "served by a background job\n"},
         (_call("run_command", command=f"{sys.executable} -B -m http.server --bind 127.0.0.1 "
                                       "{port}", background=True),
          _call("run_command", command=f"{sys.executable} -B client.py "
                                       "http://127.0.0.1:{port}/index.txt"),
          _call("job_output", job_id=1), _call("job_kill", job_id=1), DONE),
         _served, sandboxed=True, network=True),
    Task("look around, read, fix a line in a CRLF file", "make the build a release build",
         {"win/setup.bat": "@echo off\r\nset MODE=debug\r\n"},
         (_call("list_dir", path=".", depth=2), _call("read_file", path="win/setup.bat"),
          _call("edit_file", path="win/setup.bat", old="set MODE=debug\n",
                new="set MODE=release\n"), DONE), _crlf_fixed, mode="auto-edit"),
    Task("replace an API across files with one patch", "move to new_api",
         {"one.py": "import old_api\nold_api.run()\n", "two.py": "import old_api\n"},
         (_call("grep", pattern="^import old_api"), _call("apply_patch", patch=TWO), DONE),
         _two_files_patched, mode="auto-edit"),
    Task("fetch a loopback page", "read the release notes", {},
         (_call("web_fetch", url="{url}"), DONE), _fetched, web=True),
    Task("a refused edit of a protected path", "clear the MCP servers",
         {".mcp.json": '{"mcpServers": {}}\n'},
         (_call("edit_file", path=".mcp.json", old="{}", new='{"x": {"command": "evil"}}'),
          DONE), _refused_protected),
    Task("an ambiguous edit corrected on the second try", "set b's port to 9090",
         {"conf.ini": "[a]\nport = 80\n[b]\nport = 80\n"},
         (_call("edit_file", path="conf.ini", old="port = 80\n", new="port = 9090\n"),
          _call("edit_file", path="conf.ini", old="[b]\nport = 80\n", new="[b]\nport = 9090\n"),
          DONE), _corrected, mode="auto-edit"),
]


# -- running them ------------------------------------------------------------------------------


class _Notes(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = (b"<html><body><h1>Release notes</h1><p>Version 2 is out.</p>"
                b"<script>alert(1)</script></body></html>")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Notes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/notes.html"
    finally:
        server.shutdown()
        server.server_close()


def _sandbox_works() -> bool:
    done = subprocess.run([sys.executable, "-m", "dsh", "sandbox", "check"],
                          capture_output=True, text=True, timeout=60)
    return "commands are confined" in done.stdout


def _setup(tmp_path: Path, task: Task) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    for rel, text in task.files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    config = tmp_path / "dsh.toml"
    web = ('\n[plugins.web]\nenabled = true\nallow_hosts = ["127.0.0.1"]\n' if task.web
           else "")
    if task.network:
        web += "\n[sandbox]\nnetwork = true\n"
    config.write_text(f"sessions_dir = {json.dumps(str(tmp_path / 'sessions'))}\n"
                      f"[plugins.shell]\nworkspace = {json.dumps(str(ws))}\n{web}")
    return ws, config


def _script(tmp_path: Path, task: Task, url: str) -> str:
    path = tmp_path / "script.json"
    with socket.socket() as probe:  # a free port for a server the task starts
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    text = json.dumps({"responses": list(task.responses)}).replace("{url}", url)
    text = text.replace("{port}", port)
    path.write_text(text)
    return f"scripted:{path}"


def _dsh(config: Path, ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``dsh run`` in a child with no controlling terminal: no one to ask."""
    env = {k: v for k, v in os.environ.items() if k not in ("DSH_LOAD_PLUGINS", "DSH_CONFIG")}
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), "run", *args],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ws,
                          start_new_session=True, stdin=subprocess.DEVNULL)


def _ledger(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert proc.returncode == 0, proc.stderr
    path = Path(json.loads(proc.stdout)["path"])
    return [json.loads(line) for line in path.read_text().splitlines()]


def _snapshot(ws: Path) -> dict[str, bytes]:
    return {str(p.relative_to(ws)): p.read_bytes() for p in sorted(ws.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.suffix != ".sock"}


def _needs(task: Task) -> None:
    if task.sandboxed and not _sandbox_works():
        pytest.skip("no kernel sandbox backend on this machine: shell syntax and jobs need one")
    if task.web:
        pytest.importorskip("dsh_web")


@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_the_task_is_done_and_every_change_undoes_exactly(task: Task, tmp_path: Path,
                                                         page: str) -> None:
    _needs(task)
    ws, config = _setup(tmp_path, task)
    before = _snapshot(ws)
    # a fetch, a networked command leave the sandbox: asked in every mode, --yes answers
    extra = ["--yes"] if task.web or task.network else []
    events = _ledger(_dsh(config, ws, "-m", _script(tmp_path, task, page), "--json",
                          "--mode", task.mode, *extra, task.prompt))
    task.check(ws, events)
    # Rewind-ready: undoing the recorded changes, newest first, gives back the files as they
    # were, byte for byte, without reading anything but the ledger and the disk now.
    recorded: list[Change] = [c for r in _results(events) for c in raw_changes(
        r.get("changes", []))]
    assert recorded or not any(r["name"] in WRITERS and r["status"] == "ok"
                               for r in _results(events))
    now = _snapshot(ws)
    for c in reversed(recorded):
        where = c.moved_to or c.path
        old = changes.undo(c, now.pop(where, None))
        if old is not None:
            now[c.path] = old
    assert now == before


@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_in_ask_mode_without_a_terminal_nothing_changes(task: Task, tmp_path: Path,
                                                        page: str) -> None:
    _needs(task)
    ws, config = _setup(tmp_path, task)
    before = _snapshot(ws)
    events = _ledger(_dsh(config, ws, "-m", _script(tmp_path, task, page), "--json",
                          task.prompt))
    assert _snapshot(ws) == before
    for result in _results(events):
        if result["name"] in WRITERS:
            assert result["status"] == "error" and "changes" not in result
    assert [e["mode"] for e in events if e["type"] == "turn/start"] == ["ask"]
    leftovers = [p for p in ws.rglob("*") if p.name.startswith(".dsh-")]
    assert not leftovers
    if shutil.which("pgrep"):  # no job outlives its run
        assert subprocess.run(["pgrep", "-f", "http.server --bind 127.0.0.1"],
                              capture_output=True).returncode != 0
