"""dsh-hooks and workspace trust: a project's hook files (``.claude/settings*.json``, a plugin
folder inside the project) are read beneath the project with no link followed and run only
once the person trusted their exact bytes; a project hook may deny or ask, never approve.
Real ``dsh run`` subprocesses (scripted model, dsh-shell, no terminal unless a test gives one),
real hook processes; every outcome is observed from outside: a marker file a hook writes, a
side effect of the command that must not have happened, stderr, the trust records."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dsh.config import trust
from tests.test_hooks_plugin import SECRET
from tests.test_hooks_plugin import _require_installed  # noqa: F401 - autouse fixture
from tests.test_hooks_plugin import approve
from tests.test_hooks_plugin import bash_call
from tests.test_hooks_plugin import dsh
from tests.test_hooks_plugin import hook
from tests.test_hooks_plugin import ledger
from tests.test_hooks_plugin import model
from tests.test_hooks_plugin import of
from tests.test_hooks_plugin import write_config

ALLOW = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
                                "permissionDecisionReason": "looks fine to me"}}
DENY = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                               "permissionDecisionReason": "not here"}}
ASK = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "ask",
                              "permissionDecisionReason": "writes files"}}


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / ".claude").mkdir(parents=True)
    return root


def answering(marker: Path, answer: dict[str, Any]) -> str:
    """A PreToolUse hook command that leaves ``marker`` and prints ``answer``."""
    return f"touch {marker}; echo '{json.dumps(answer)}'"


def settings_file(proj: Path, command: str, name: str = "settings.json") -> Path:
    """What a model's command might write: a project settings file with one Bash hook."""
    path = proj / ".claude" / name
    path.write_text(json.dumps({"hooks": hook("PreToolUse", command, "Bash")}))
    return path


def one_line(stderr: str, about: Path) -> str:
    """The one line of stderr that names ``about`` (dsh's other notes, such as what ``--yes``
    means, may be there too; nothing else of dsh-hooks is)."""
    lines = [x for x in stderr.splitlines() if str(about) in x]
    assert len(lines) == 1 and "dsh-hooks:" not in stderr, stderr
    return lines[0]


# ------------------------------------------------------------------ not trusted: inert


def test_an_unapproved_project_hook_is_inert_and_allows_nothing(tmp_path: Path,
                                                                proj: Path) -> None:
    marker = proj / "hook-ran"
    path = settings_file(proj, answering(marker, ALLOW))
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")  # no --yes, no terminal
    assert r.returncode == 0, r.stderr
    assert not marker.exists()  # the hook never ran
    assert not (proj / "made-by-command").exists()  # and nothing approved the command
    line = one_line(r.stderr, path)
    assert str(path) in line and "not trusted" in line and "dsh trust approve" in line
    [res] = of(ledger(tmp_path), "tool/result")
    assert "needs approval" in res["output"]
    assert trust.load() == {}  # a run without a terminal never approves anything


def test_approved_it_runs_but_its_allow_does_not_approve_the_command(tmp_path: Path,
                                                                     proj: Path) -> None:
    marker = proj / "hook-ran"
    approve(settings_file(proj, answering(marker, ALLOW)))
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")  # no --yes, no terminal
    assert r.returncode == 0, r.stderr
    assert marker.exists()  # trusted: the hook ran
    assert not (proj / "made-by-command").exists()  # its allow approved nothing
    events = ledger(tmp_path)
    [res] = of(events, "tool/result")
    assert res["status"] == "error" and "needs approval" in res["output"]
    assert "a project hook cannot approve one" in res["output"]
    [decision] = [e["data"] for e in of(events, "x/dsh-hooks/decision")]
    assert decision["decision"] == "allow"
    assert decision["approval"] == "unchanged (a project hook)"
    assert r.stderr == ""  # trusted: nothing to say


@pytest.mark.parametrize("answer", [DENY, "exit2"])
def test_an_approved_project_hook_still_denies(tmp_path: Path, proj: Path,
                                               answer: Any) -> None:
    marker = proj / "hook-ran"
    command = (f"touch {marker}; echo no >&2; exit 2" if answer == "exit2"
               else answering(marker, answer))
    path = settings_file(proj, command)
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    m = model(tmp_path, bash_call("mkdir before-approval"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    assert not marker.exists() and (proj / "before-approval").is_dir()  # inert: no deny
    approve(path)
    m = model(tmp_path, bash_call("mkdir after-approval"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-m", m, "go")  # --yes: only the deny stops it
    assert r.returncode == 0, r.stderr
    assert marker.exists() and not (proj / "after-approval").exists()
    [res] = of(ledger(tmp_path), "tool/result")
    assert res["status"] == "error" and "blocked by hooks" in res["output"]


def test_an_approved_project_hook_still_asks(tmp_path: Path, proj: Path) -> None:
    """`ask` with no terminal is a refusal, even of a command the allowlist would run."""
    marker = proj / "hook-ran"
    path = settings_file(proj, answering(marker, ASK))
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    m = model(tmp_path, bash_call("echo allowlisted"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    [res] = of(ledger(tmp_path), "tool/result")
    assert not marker.exists() and res["status"] == "ok"  # inert: nothing asked
    approve(path)
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    [res] = of(ledger(tmp_path), "tool/result")
    assert marker.exists() and res["status"] == "error"
    assert "no terminal to ask on" in res["output"] and "allowlisted" not in res["output"]


@pytest.mark.parametrize("change", ["command", "added hook"])
def test_a_file_changed_after_approval_is_inert_again(tmp_path: Path, proj: Path,
                                                      change: str) -> None:
    marker, other = proj / "hook-ran", proj / "other-ran"
    path = settings_file(proj, answering(marker, DENY))
    approve(path)
    if change == "command":  # the same shape, another command
        settings_file(proj, answering(other, DENY))
    else:
        data = json.loads(path.read_text())
        data["hooks"]["Stop"] = [{"hooks": [{"type": "command", "command": f"touch {other}"}]}]
        path.write_text(json.dumps(data))
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    assert not marker.exists() and not other.exists()  # none of its hooks ran
    assert (proj / "made-by-command").exists()  # --yes: the deny it held is gone too
    line = one_line(r.stderr, path)
    assert str(path) in line and "changed since it was trusted" in line


def test_settings_local_json_is_gated_on_its_own(tmp_path: Path, proj: Path) -> None:
    marker, local = proj / "hook-ran", proj / "local-ran"
    approve(settings_file(proj, f"touch {marker}"))
    path = settings_file(proj, f"touch {local}", "settings.local.json")
    cfg = write_config(tmp_path, proj, claude_settings=["project", "local"])
    m = model(tmp_path, bash_call("echo hi"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    assert marker.exists() and not local.exists()
    assert str(path) in one_line(r.stderr, path)


# ------------------------------------------------------------------ links: refused


@pytest.mark.parametrize("link", ["file", "folder"])
def test_a_symlinked_settings_file_is_refused(tmp_path: Path, proj: Path, link: str) -> None:
    marker = proj / "hook-ran"
    real = tmp_path / "elsewhere" / ".claude"
    real.mkdir(parents=True)
    target = settings_file(real.parent, answering(marker, ALLOW))
    if link == "file":
        (proj / ".claude" / "settings.json").symlink_to(target)
    else:
        (proj / ".claude").rmdir()
        (proj / ".claude").symlink_to(real)
    # Even with those very bytes trusted under the link's name, a link is not followed.
    trust.approve(proj / ".claude", "settings.json", trust.digest(target.read_bytes()), "hooks")
    trust.approve(target.parent, target.name, trust.digest(target.read_bytes()), "hooks")
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode != 0
    assert not marker.exists() and not (proj / "made-by-command").exists()
    # (a linked .claude folder is also dsh-claude's note, about its own files)
    [line] = [x for x in r.stderr.splitlines() if "settings.json" in x]
    assert str(proj / ".claude" / "settings.json") in line and "symbolic link" in line
    assert "cannot read hook settings" in line


# ------------------------------------------------------------------ the user's own hooks


def test_the_users_own_hooks_may_still_approve(tmp_path: Path, proj: Path) -> None:
    """~/.claude/settings.json and dsh's TOML are the person's: their allow approves the call
    (a project file's allow of the same call changes nothing either way)."""
    user_mark, proj_mark = tmp_path / "user-ran", proj / "project-ran"
    home = tmp_path / "home" / ".claude"
    home.mkdir(parents=True)
    settings_file(home.parent, answering(user_mark, ALLOW))
    approve(settings_file(proj, answering(proj_mark, ALLOW)))
    cfg = write_config(tmp_path, proj, claude_settings=["project", "user"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    assert user_mark.exists() and proj_mark.exists()
    assert (proj / "made-by-command").is_dir()  # approved by the user's hook
    [decision] = [e["data"] for e in of(ledger(tmp_path), "x/dsh-hooks/decision")]
    assert decision["source"] == str(home / "settings.json")
    assert decision["approval"] == "skipped"
    [approved] = [e["data"] for e in of(ledger(tmp_path), "x/dsh.tools/approval")]
    assert approved["allowed"] and approved["by"] == "hook"  # recorded as the hook's, not --yes


# ------------------------------------------------------------------ environment


def test_a_project_hook_gets_no_secret_even_through_env_keep(tmp_path: Path,
                                                             proj: Path) -> None:
    seen_proj, seen_cfg = proj / "project-env", tmp_path / "config-env"
    path = proj / ".claude" / "settings.json"
    path.write_text(json.dumps({"hooks": hook(
        "UserPromptSubmit", f"printenv OPENAI_API_KEY > {seen_proj}; env > {seen_proj}.all; "
                            f"echo \"$OPENAI_API_KEY\" >> {seen_proj}.all; true")}))
    approve(path)
    cfg = write_config(tmp_path, proj,
                       hook("UserPromptSubmit", f"printenv OPENAI_API_KEY > {seen_cfg}"),
                       claude_settings=["project"], env_keep=["OPENAI_API_KEY"])
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 0, r.stderr
    assert seen_cfg.read_text().strip() == SECRET  # the person's own hook: as configured
    assert seen_proj.read_text() == ""  # the project's: never
    everything = Path(f"{seen_proj}.all").read_text()
    assert SECRET not in everything and f"CLAUDE_PROJECT_DIR={proj}" in everything


# ------------------------------------------------------------------ plugin folders in the project


def _project_plugin(proj: Path, command: str) -> Path:
    folder = proj / "plugins" / "guard"
    (folder / ".claude-plugin").mkdir(parents=True)
    (folder / ".claude-plugin" / "plugin.json").write_text(json.dumps({"name": "guard"}))
    (folder / "hooks").mkdir()
    path = folder / "hooks" / "hooks.json"
    path.write_text(json.dumps({"hooks": hook("PreToolUse", command, "Bash")}))
    return path


def test_a_plugin_folder_in_the_project_is_gated(tmp_path: Path, proj: Path) -> None:
    marker = proj / "hook-ran"
    path = _project_plugin(proj, answering(marker, ALLOW))
    cfg = write_config(tmp_path, proj, claude_plugins=["plugins/guard"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    assert not marker.exists() and not (proj / "made-by-command").exists()
    line = one_line(r.stderr, path)
    assert str(path) in line and "adds a plugin folder" in line
    approve(path, "plugin")
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    assert marker.exists()  # trusted: it runs
    assert not (proj / "made-by-command").exists()  # its allow approves nothing
    listed = dsh(tmp_path, proj, cfg, "hooks", "list", "--json")
    [row] = [json.loads(x) for x in listed.stdout.splitlines()]
    assert row["project"] is True and row["ignored"] is None
    assert row["sandbox"] == "workspace-write, no network"  # confined by default


def test_a_link_inside_a_project_plugin_folder_is_refused(tmp_path: Path, proj: Path) -> None:
    """A user's folder may hold a link that stays inside it; the project's follows none."""
    marker = proj / "hook-ran"
    path = _project_plugin(proj, answering(marker, DENY))
    real = path.parent / "real.json"
    path.rename(real)
    path.symlink_to("real.json")
    approve(real, "plugin")
    trust.approve(path.parent, path.name, trust.digest(real.read_bytes()), "plugin")
    cfg = write_config(tmp_path, proj, claude_plugins=["plugins/guard"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "--yes", "-m", m, "go")
    assert r.returncode != 0 and not marker.exists()
    assert not (proj / "made-by-command").exists()
    line = one_line(r.stderr, path)
    assert str(path) in line and "symbolic link" in line


# ------------------------------------------------------------------ the question on a terminal


def _on_a_terminal(tmp: Path, proj: Path, cfg: Path, answer: bytes, *args: str,
                   after: str | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    """``dsh --config CFG ARGS`` with a controlling terminal (a pty) on which ``answer`` is
    typed ahead (or, with ``after``, once the terminal shows that text: the approval question
    drops what was typed before it); stdin, stdout and stderr stay pipes. Returns what the
    terminal showed."""
    master, slave = os.openpty()
    name = os.ttyname(slave)

    def own_terminal() -> None:  # after setsid: the first tty opened becomes the session's
        os.close(os.open(name, os.O_RDWR))

    env = {**os.environ, "OPENAI_API_KEY": SECRET, "HOME": str(tmp / "home")}
    env.pop("DSH_LOAD_PLUGINS", None)
    (tmp / "home").mkdir(exist_ok=True)
    shown = ""
    try:
        if after is None:
            os.write(master, answer)
        proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), *args],
                                stdin=subprocess.PIPE if after is None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=proj, env=env,
                                start_new_session=True, preexec_fn=own_terminal)
        if after is not None:  # the slave stays open meanwhile: no EIO before dsh opens it
            deadline = time.monotonic() + 60
            while (after not in shown and time.monotonic() < deadline
                   and proc.poll() is None):
                if select.select([master], [], [], 0.1)[0]:
                    shown += os.read(master, 65536).decode(errors="replace")
            assert after in shown, shown
            os.write(master, answer)
        os.close(slave)
        slave = -1
        out, err = proc.communicate(timeout=60)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                break
            try:
                shown += os.read(master, 65536).decode(errors="replace")
            except OSError:  # EIO: every slave end is closed
                break
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), shown
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


@pytest.mark.parametrize(("answer", "trusted"), [(b"y\n", True), (b"n\n", False)])
def test_a_terminal_is_asked_once_with_every_hook_command(tmp_path: Path, proj: Path,
                                                          answer: bytes, trusted: bool) -> None:
    marker = proj / "hook-ran"
    forged = "cat <<'X'\nhook Stop, matcher *: \"harmless\"\nX"  # a line in it forges none
    path = proj / ".claude" / "settings.json"
    path.write_text(json.dumps({"hooks": {
        **hook("PreToolUse", answering(marker, ALLOW), "Bash"),
        **hook("UserPromptSubmit", forged)}}))
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r, shown = _on_a_terminal(tmp_path, proj, cfg, answer, "run", "-m", m, "go")
    assert r.returncode == 0, r.stderr
    assert shown.count("Trust this exact content? [y/N]") == 1, shown
    assert f"{path} is new to dsh; it runs hook commands." in shown
    assert (f'hook PreToolUse, matcher Bash: {json.dumps(answering(marker, ALLOW))}'
            in shown), shown
    assert ('hook UserPromptSubmit, matcher *: "cat <<\'X\'\\nhook Stop, matcher *: '
            '\\"harmless\\"\\nX"') in shown, shown
    assert marker.exists() is trusted
    assert not (proj / "made-by-command").exists()  # approving the file approves no command
    held = trust.load()
    assert (str(path) in held) is trusted
    if trusted:
        assert held[str(path)]["sha256"] == trust.digest(path.read_bytes())
        assert r.stderr == ""
    else:
        assert str(path) in one_line(r.stderr, path)


def test_a_project_ask_answered_yes_leaves_dshs_own_approval_in_place(tmp_path: Path,
                                                                      proj: Path) -> None:
    """The hook's question is answered yes on the terminal; dsh-shell's own question (its
    terminal is none here) still decides, so the command is refused."""
    marker = proj / "hook-ran"
    approve(settings_file(proj, answering(marker, ASK)))
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    m = model(tmp_path, bash_call("mkdir made-by-command"), {"text": "done"})
    r, shown = _on_a_terminal(tmp_path, proj, cfg, b"y\n", "run", "-m", m, "go",
                              after="say why: ")
    assert r.returncode == 0, r.stderr
    assert "run_command wants to call" in shown, shown
    assert "asks: writes files)" in shown, shown  # the hook's reason
    assert "mkdir made-by-command" in shown, shown  # what it would run
    assert marker.exists() and not (proj / "made-by-command").exists()
    [res] = of(ledger(tmp_path), "tool/result")
    assert "needs approval" in res["output"] and "the user approved" in res["output"]


def test_hooks_list_asks_nothing_and_says_what_is_not_trusted(tmp_path: Path,
                                                              proj: Path) -> None:
    path = settings_file(proj, "true")
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    r, shown = _on_a_terminal(tmp_path, proj, cfg, b"y\n", "hooks", "list", "--json")
    assert r.returncode == 0, r.stderr
    assert "Trust this" not in shown and trust.load() == {}
    [row] = [json.loads(x) for x in r.stdout.splitlines()]
    assert row["ignored"] == f"not trusted: dsh trust approve {path}"
    assert row["project"] is True


# ------------------------------------------------------------------ the summary itself


def test_the_summary_is_one_line_per_hook_whatever_the_command() -> None:
    from dsh_hooks.config import SUMMARY_LINES
    from dsh_hooks.config import parse_hooks
    from dsh_hooks.config import summary

    commands = ["a\nb", "c\r\nhook X", "d\u2028e", "\x1b[2Jf"] + [f"n{i}" for i in range(30)]
    hooks = parse_hooks({"PreToolUse": [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": c} for c in commands]}]}, "f", strict=False,
        default_timeout=1.0)
    lines = summary(hooks).split("\n")
    assert len(lines) == SUMMARY_LINES and lines[-1].startswith("… and 16 more hooks")
    for line, command in zip(lines, commands[:SUMMARY_LINES - 1], strict=False):
        assert json.loads(line.split(": ", 1)[1]) == command
        assert "\r" not in line and "\u2028" not in line


# ------------------------------------------------------------------ inside a sub-agent


@pytest.mark.parametrize("answer", [DENY, ALLOW])
def test_a_project_pretooluse_hook_fires_inside_a_sub_agent(tmp_path: Path, proj: Path,
                                                            answer: Any) -> None:
    """Most work runs in sub-agents: the project's trusted hook runs for the child's calls
    too, its deny blocks them, and its allow approves nothing there either."""
    import tomli_w

    marker = proj / "hook-ran"
    approve(settings_file(proj, answering(marker, answer)))
    cfg = write_config(tmp_path, proj, claude_settings=["project"])
    helper = tmp_path / "helper.json"
    helper.write_text(json.dumps({"responses": [bash_call("mkdir made-by-child"),
                                                {"text": "helped"}]}))
    import tomllib

    data = tomllib.loads(cfg.read_text())
    data["agents"] = {"default": {"subagents": ["helper"]},
                      "helper": {"model": f"scripted:{helper}", "mode": "full-auto"}}
    cfg.write_text(tomli_w.dumps(data))
    m = model(tmp_path, {"tool_calls": [{"name": "ask_helper", "arguments": {
        "prompt": "make the folder"}}]}, {"text": "done"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", m, "go")  # the lead asks (default mode)
    assert r.returncode == 0, r.stderr
    assert marker.exists()  # the hook ran for the child's call
    assert not (proj / "made-by-child").exists()
    logs = [[json.loads(x) for x in p.read_text().splitlines()]
            for p in (tmp_path / "sessions").glob("*.jsonl")]
    [child] = [events for events in logs if of(events, "turn/start")[0].get("parent")]
    [res] = of(child, "tool/result")
    if answer is DENY:
        assert "not here" in res["output"]  # the hook's reason
    else:  # the mode (the lead's ask) decides; with no terminal: refused
        assert "a project hook cannot approve one" in res["output"]
        assert "no terminal" in res["output"]
    [decision] = [e["data"] for e in of(child, "x/dsh-hooks/decision")]
    assert decision["decision"] == ("deny" if answer is DENY else "allow")
