"""dsh-mcp and the workspace: a project's ``.mcp.json`` and plugin folders are input, not
configuration (docs/mcp.md, "Project servers").

A file a confined command (or a model, or a ``git pull``) may have written launches nothing
until the person approved its exact bytes (``dsh trust approve``); then its servers run
confined, with the project root as their workspace; ``cwd`` cannot leave the project; ``${VAR}``
never hands them dsh's secrets or loader variables; a secret never goes on a command line.
Every outcome is observed from outside: a marker file the server's command writes (or does
not), the exit status and stderr of a real ``dsh`` process, the files written under the test.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh.config import trust
from dsh.core.errors import ConfigError
from dsh.run.app import App

pytest.importorskip("dsh_mcp", reason="pip install ./plugins/dsh-mcp")
pytest.importorskip("mcp", reason="the MCP SDK is not installed")

from dsh.sandbox.spawn import check  # noqa: E402
from tests.test_mcp_plugin import SERVER  # noqa: E402
from tests.test_mcp_plugin import _require_installed  # noqa: E402,F401 - the autouse fixture
from tests.test_mcp_plugin import call  # noqa: E402
from tests.test_mcp_plugin import dsh as run_dsh  # noqa: E402
from tests.test_mcp_plugin import ledger_events  # noqa: E402
from tests.test_mcp_plugin import run_tool  # noqa: E402
from tests.test_mcp_plugin import script  # noqa: E402

_CHECK = check()
needs_sandbox = pytest.mark.skipif(not _CHECK.get("backend"),
                                   reason=f"no sandbox on this machine: {_CHECK.get('why')}")
SECRET = "sk-proj-trust-mcp-0123456789abcdef"


@pytest.fixture(autouse=True)
def _no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """No question on the developer's terminal: in this process, and (by a new session, see
    :func:`dsh`) in every ``dsh`` subprocess."""
    monkeypatch.setattr(trust, "TTY", "/nonexistent/tty")
    monkeypatch.delenv("DSH_KEYS_BACKEND", raising=False)


def dsh(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Any:
    return run_dsh(*args, cwd=str(cwd), env=env, start_new_session=True)


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    """The project: the folder ``dsh`` runs in, holding a copy of the test server."""
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copy(SERVER, root / "server.py")
    (tmp_path / "outside").mkdir()
    return root


def config(tmp_path: Path, **mcp: Any) -> Path:
    import tomli_w

    path = tmp_path / "dsh.toml"
    path.write_text(tomli_w.dumps({"sessions_dir": str(tmp_path / "sessions"),
                                   "plugins": {"mcp": {"mcp_json": ".mcp.json", **mcp}}}))
    return path


def marking_server(*marks: Path, **extra: Any) -> dict[str, Any]:
    """A server whose command first tries to create each of ``marks`` (a write the sandbox
    refuses is skipped), then runs the test server (server.py in its current directory)."""
    code = ("import runpy, sys\n"
            f"for p in {[str(m) for m in marks]!r}:\n"
            "    try:\n        open(p, 'a').close()\n    except OSError:\n        pass\n"
            "sys.argv = ['server.py', 'stdio']\n"
            "runpy.run_path('server.py', run_name='__main__')\n")
    return {"command": sys.executable, "args": ["-c", code], **extra}


def write_mcp_json(root: Path, servers: dict[str, Any], approve: bool = False) -> bytes:
    data = json.dumps({"mcpServers": servers}, indent=1).encode()
    (root / ".mcp.json").write_bytes(data)
    if approve:
        trust.approve(root, ".mcp.json", trust.digest(data), "mcp")
    return data


def trust_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ".mcp.json" in ln]


def files_under(root: Path, skip: Path) -> list[tuple[Path, bytes]]:
    out = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and skip not in path.parents:
            out.append((path, path.read_bytes()))
    return out


# --------------------------------------------------------------------------------------------
# a model-written .mcp.json: inert until approved, inert again once changed
# --------------------------------------------------------------------------------------------


@needs_sandbox
def test_a_model_written_mcp_json_runs_nothing_until_approved(tmp_path: Path,
                                                              proj: Path) -> None:
    outside, inside = tmp_path / "outside" / "ran", proj / "ran"
    cfg = config(tmp_path)
    write_mcp_json(proj, {"w": marking_server(outside, inside)})
    for args in (("run", "-m", "echo", "hi"), ("tools",), ("mcp", "list"),
                 ("mcp", "refresh")):
        proc = dsh("--config", str(cfg), *args, cwd=proj)
        assert not outside.exists() and not inside.exists(), args  # the server never ran
        (line,) = trust_lines(proc.stderr)
        assert str(proj / ".mcp.json") in line and "not trusted" in line, args
        assert f"dsh trust approve {proj / '.mcp.json'}" in line
        if args[0] == "run":
            assert proc.returncode == 0 and proc.stdout.strip() == "hi", proc.stderr
        if args[0] == "tools":
            assert "mcp__w__" not in proc.stdout
    # the refused decision is recorded on turn/start
    starts = [e for e in ledger_events(tmp_path) if e["type"] == "turn/start"]
    assert any(d.get("decision") == "inert" and d["path"] == str(proj / ".mcp.json")
               for e in starts for d in e.get("trust") or []), starts

    approved = dsh("trust", "approve", ".mcp.json", cwd=proj)
    assert approved.returncode == 0, approved.stderr
    listed = dsh("--config", str(cfg), "tools", cwd=proj)
    assert listed.returncode == 0, listed.stderr
    assert "mcp__w__echo" in listed.stdout and trust_lines(listed.stderr) == []
    assert inside.exists()  # it ran ...
    assert not outside.exists()  # ... confined to the project: the write outside was refused

    # one byte changes (by a command, a model, a git pull): inert again
    inside.unlink()
    text = (proj / ".mcp.json").read_bytes()
    (proj / ".mcp.json").write_bytes(text.replace(b"ran", b"raN", 1))
    changed = proj / "raN"
    for args in (("tools",), ("run", "-m", "echo", "hi")):
        proc = dsh("--config", str(cfg), *args, cwd=proj)
        (line,) = trust_lines(proc.stderr)
        assert "changed since it was trusted" in line and "dsh trust approve" in line
        assert "mcp__w__" not in proc.stdout
        assert not changed.exists() and not inside.exists() and not outside.exists()


def test_a_symlinked_mcp_json_is_not_followed(tmp_path: Path, proj: Path) -> None:
    """The project's ``.mcp.json`` made a link to an approved file elsewhere: not read."""
    marker = tmp_path / "outside" / "ran"
    elsewhere = tmp_path / "outside" / "servers.json"
    data = json.dumps({"mcpServers": {"w": marking_server(marker)}}).encode()
    elsewhere.write_bytes(data)
    trust.approve(elsewhere.parent, elsewhere.name, trust.digest(data), "mcp")
    (proj / ".mcp.json").symlink_to(elsewhere)
    proc = dsh("--config", str(config(tmp_path)), "tools", cwd=proj)
    assert proc.returncode == 2, proc.stderr
    (line,) = trust_lines(proc.stderr)
    assert line == (f"dsh: error: {proj / '.mcp.json'}: cannot read: it goes through a "
                    "symbolic link (links are not followed)")
    assert "mcp__w__" not in proc.stdout and not marker.exists()


# --------------------------------------------------------------------------------------------
# cwd stays in the project
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["absolute", "dotdot", "symlink", "inner-symlink"])
def test_a_cwd_outside_the_project_is_refused(tmp_path: Path, proj: Path, shape: str) -> None:
    target = tmp_path / "outside"
    marker = target / "ran"
    if shape == "absolute":
        cwd = str(target)
    elif shape == "dotdot":
        cwd = "../outside"
    elif shape == "symlink":
        (proj / "tmp").symlink_to(target)
        cwd = "tmp"
    else:  # a real folder, reached through a link further up
        (proj / "sub").mkdir()
        (proj / "link").symlink_to(proj / "sub")
        cwd = str(proj / "link")
    write_mcp_json(proj, {"w": marking_server(marker, cwd=cwd)}, approve=True)
    cfg = config(tmp_path, sandbox="workspace-write")
    for args in (("tools",), ("run", "-m", "echo", "hi")):
        proc = dsh("--config", str(cfg), *args, cwd=proj)
        assert proc.returncode == 2, proc.stderr
        assert f"{proj / '.mcp.json'}: mcpServers.w: 'cwd' {cwd!r}" in proc.stderr
        assert "\n" not in proc.stderr.strip()
        assert not marker.exists()


@needs_sandbox
def test_a_cwd_inside_the_project_is_used_and_the_workspace_is_the_root(
        tmp_path: Path, proj: Path) -> None:
    (proj / "sub").mkdir()
    shutil.copy(SERVER, proj / "sub" / "server.py")
    write_mcp_json(proj, {"w": marking_server(proj / "ran-sub", cwd="sub")}, approve=True)
    model = script(tmp_path, call("mcp__w__echo", text="hello"), {"text": "done"})
    proc = dsh("--config", str(config(tmp_path)), "run", "--yes", "-m", model, "go", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    assert (proj / "ran-sub").exists()
    record = next(e["data"] for e in ledger_events(tmp_path) if e["type"] == "x/mcp/sandbox")
    assert record["policy"] == "workspace-write" and record["workspace"] == str(proj)


# --------------------------------------------------------------------------------------------
# ${VAR}: dsh's secrets and loader variables
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "var"), [
    ("env", "OPENAI_API_KEY"), ("args", "OPENAI_API_KEY"), ("env", "LD_PRELOAD"),
    ("args", "LD_PRELOAD"), ("headers", "GITHUB_TOKEN"), ("env", "DSH_CONFIG"),
    ("cwd", "PYTHONPATH"), ("url", "ANTHROPIC_API_KEY"), ("env", "PLAIN_HOLDING_A_KEY"),
])
def test_a_project_file_never_expands_secrets_or_loader_variables(
        tmp_path: Path, proj: Path, key: str, var: str) -> None:
    from dsh.config.keys import FileStore

    marker = tmp_path / "outside" / "ran"
    # (LD_PRELOAD must name a library that loads: dsh itself runs with it)
    held = "libm.so.6" if var == "LD_PRELOAD" else f"{SECRET}-{var.lower()}"
    if var == "PLAIN_HOLDING_A_KEY":  # a harmless name, holding a key of dsh's key store
        FileStore().set("openai", held)
    if key == "headers" or key == "url":
        ref = f"http://127.0.0.1:9/mcp?k=${{{var}}}" if key == "url" else \
            "http://127.0.0.1:9/mcp"
        entry: dict[str, Any] = {"url": ref}
        if key == "headers":
            entry["headers"] = {"Authorization": f"Bearer ${{{var}}}"}
    else:
        entry = marking_server(marker)
        if key == "env":
            entry["env"] = {"X": f"${{{var}}}"}
        elif key == "args":
            entry["args"] = [*entry["args"], f"--key=${{{var}}}"]
        else:
            entry["cwd"] = f"${{{var}}}"
    write_mcp_json(proj, {"w": entry}, approve=True)
    env = {**os.environ, var: held, "DSH_KEYS_BACKEND": "file"}
    proc = dsh("--config", str(config(tmp_path)), "run", "-m", "echo", "hi", cwd=proj,
               env=env)
    assert proc.returncode == 2, proc.stderr
    assert f"{proj / '.mcp.json'}: mcpServers.w: {key}" in proc.stderr
    assert f"${{{var}}} is not expanded" in proc.stderr
    assert not marker.exists()
    keys = tmp_path / "xdg-config" / "dsh" / "keys"
    for path, data in files_under(tmp_path, keys):
        assert held.encode() not in data, path
    assert held not in proc.stderr + proc.stdout


def test_a_project_server_may_not_set_a_loader_variable(tmp_path: Path, proj: Path) -> None:
    marker = tmp_path / "outside" / "ran"
    write_mcp_json(proj, {"w": marking_server(marker, env={"LD_PRELOAD": "./evil.so"})},
                   approve=True)
    proc = dsh("--config", str(config(tmp_path)), "tools", cwd=proj)
    assert proc.returncode == 2
    assert "mcpServers.w: env.LD_PRELOAD: a project's server may not set the loader " \
           "variable LD_PRELOAD" in proc.stderr
    assert not marker.exists()


def test_a_secret_never_travels_in_args_even_from_the_persons_own_file(
        tmp_path: Path, proj: Path) -> None:
    """A file of the person's own (outside the project, named by their config): a secret in
    ``env`` is theirs to give; on the command line it is refused."""
    own = tmp_path / "own.json"
    marker = tmp_path / "outside" / "ran"
    env = {**os.environ, "OPENAI_API_KEY": SECRET}
    cfg = config(tmp_path, mcp_json=str(own))
    own.write_text(json.dumps({"mcpServers": {"w": {
        **marking_server(marker), "env": {"MCP_TEST_KEY": "${OPENAI_API_KEY}"}}}}))
    proc = dsh("--config", str(cfg), "tools", cwd=proj, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "mcp__w__echo" in proc.stdout and marker.exists()  # as before: the person's own
    marker.unlink()
    entry = marking_server(marker)
    entry["args"] = [*entry["args"], "--key", "${OPENAI_API_KEY}"]
    own.write_text(json.dumps({"mcpServers": {"w": entry}}))
    proc = dsh("--config", str(cfg), "tools", cwd=proj, env=env)
    assert proc.returncode == 2
    assert f"{own}: mcpServers.w: args[3]: ${{OPENAI_API_KEY}} is not expanded: " \
           "OPENAI_API_KEY is a secret, and a secret never travels on a command line" \
           in proc.stderr
    assert not marker.exists() and SECRET not in proc.stderr


def test_a_known_secret_under_a_plain_name_stays_off_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh_mcp.settings import parse_settings

    own = tmp_path / "own.json"
    own.write_text(json.dumps({"mcpServers": {"w": {"command": "x",
                                                    "args": ["${PLAIN_NAME}"]}}}))
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("PLAIN_NAME", SECRET)
    with pytest.raises(ConfigError, match=r"args\[0\]: \$\{PLAIN_NAME\} is not expanded: "
                                          "PLAIN_NAME is a secret") as err:
        parse_settings({"mcp_json": str(own)}, "plugins.mcp", base_dir=tmp_path / "elsewhere")
    assert SECRET not in str(err.value)
    monkeypatch.setenv("PLAIN_NAME", "/srv/data/of/mine")  # not a secret: expanded as before
    got = parse_settings({"mcp_json": str(own)}, "plugins.mcp", base_dir=tmp_path / "x")
    assert got.servers["w"].args == ("/srv/data/of/mine",)


# --------------------------------------------------------------------------------------------
# plugin folders in the project
# --------------------------------------------------------------------------------------------


@needs_sandbox
def test_a_plugin_folder_in_the_project_is_trusted_by_content(
        tmp_path: Path, proj: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    from dsh_mcp import client

    folder = proj / "plugins" / "p"
    (folder / ".claude-plugin").mkdir(parents=True)
    manifest = json.dumps({"name": "p", "mcpServers": {"notes": {
        "command": sys.executable,
        "args": ["${CLAUDE_PLUGIN_ROOT}/../../server.py", "stdio"]}}}).encode()
    (folder / ".claude-plugin" / "plugin.json").write_bytes(manifest)
    monkeypatch.chdir(proj)

    def app() -> App:
        return App.from_config({"sessions_dir": str(tmp_path / "sessions"),
                                "plugins": {"mcp": {"claude_plugins": ["plugins/p"]}},
                                "agents": {"a": {"plugins": ["mcp"]}}, "agent": "a"})

    assert "mcp__notes__echo" not in app().agent().tools
    err = capfd.readouterr().err
    (line,) = [ln for ln in err.splitlines() if "plugin.json" in ln]
    assert "adds a plugin folder" in line and "dsh trust approve" in line
    trust.approve(folder / ".claude-plugin", "plugin.json", trust.digest(manifest), "plugin")
    try:
        got = app()
        out = run_tool(got, "mcp__notes__echo", {"text": "from the project"})
        assert (out.status, out.output) == ("ok", "from the project")
        server = next(iter(client.pool().connections.values())).server
        assert server.workspace == str(proj) and server.sandbox is not None
    finally:
        client.shutdown()
    # a symbolic link as the plugin folder (to the approved one): not followed
    (proj / "plugins" / "q").symlink_to(folder)
    with pytest.raises(ConfigError, match=r"claude_plugins\[0\]: .*/plugins/q is not used: it "
                                          "goes through a symbolic link"):
        App.from_config({"sessions_dir": str(tmp_path / "sessions"),
                         "plugins": {"mcp": {"claude_plugins": ["plugins/q"]}},
                         "agents": {"a": {"plugins": ["mcp"]}}, "agent": "a"}).agent()
