"""Hook scripts under the kernel sandbox (issue 22): per hook source, off by default."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("dsh_hooks", reason="pip install ./plugins/dsh-hooks")

from dsh.sandbox.spawn import check  # noqa: E402
from tests.test_hooks_plugin import dsh  # noqa: E402
from tests.test_hooks_plugin import hook  # noqa: E402
from tests.test_hooks_plugin import ledger  # noqa: E402
from tests.test_hooks_plugin import of  # noqa: E402
from tests.test_hooks_plugin import write_config  # noqa: E402
from tests.test_sandbox import without_landlock  # noqa: E402

_CHECK = check()


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    """The project (cwd, workspace) of tests/test_hooks_plugin.py, with its hook scripts."""
    from tests import test_hooks_plugin

    return test_hooks_plugin.proj.__wrapped__(tmp_path)  # type: ignore[attr-defined]
needs_sandbox = pytest.mark.skipif(not _CHECK.get("backend"),
                                   reason=f"no sandbox on this machine: {_CHECK.get('why')}")


def _hook_command(tmp_path: Path) -> str:
    secret = tmp_path / "home-secret"
    secret.write_text("S3CR3T-hook")
    return (f"touch {tmp_path}/outside-mark; cat {secret} > leak.txt; "
            "echo ran > inside-mark.txt")


@needs_sandbox
def test_a_confined_hook_source_writes_only_the_project(tmp_path: Path, proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("UserPromptSubmit", _hook_command(tmp_path)),
                       sandbox={"config": "workspace-write"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 0, r.stderr
    assert (proj / "inside-mark.txt").read_text() == "ran\n"
    assert not (tmp_path / "outside-mark").exists()
    assert (proj / "leak.txt").read_text() == ""  # the read was denied
    [run] = [e["data"] for e in of(ledger(tmp_path), "x/dsh-hooks/hook")]
    assert run["sandbox"] == "workspace-write, no network"


def test_hooks_are_unconfined_by_default_and_the_record_says_so(tmp_path: Path,
                                                                proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("UserPromptSubmit", _hook_command(tmp_path)))
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "outside-mark").exists()
    [run] = [e["data"] for e in of(ledger(tmp_path), "x/dsh-hooks/hook")]
    assert run["sandbox"] == "off"


def test_without_landlock_a_confined_hook_does_not_run(tmp_path: Path, proj: Path) -> None:
    import os
    import subprocess

    cfg = write_config(tmp_path, proj, hook("UserPromptSubmit", _hook_command(tmp_path)),
                       sandbox={"config": "workspace-write"})
    r = subprocess.run(without_landlock("-m", "dsh", "--config", str(cfg), "run", "-m", "echo",
                                        "hi"), capture_output=True, text=True, cwd=proj,
                       timeout=120, env={**os.environ, "HOME": str(tmp_path / "home")})
    assert not (proj / "inside-mark.txt").exists() and not (tmp_path / "outside-mark").exists()
    [run] = [e["data"] for e in of(ledger(tmp_path), "x/dsh-hooks/hook")]
    assert run["status"] == "spawn", (run, r.stderr)
    assert "the kernel has no Landlock (ENOSYS)" in run["reason"]


def test_an_unknown_hook_source_in_sandbox_is_a_config_error(tmp_path: Path,
                                                             proj: Path) -> None:
    cfg = write_config(tmp_path, proj, hook("UserPromptSubmit", "true"),
                       sandbox={"projct": "off"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 2
    assert "sandbox: unknown hook source 'projct'" in r.stderr


@needs_sandbox
def test_a_project_hook_runs_only_trusted_and_then_confined(tmp_path: Path, proj: Path) -> None:
    """`sandbox = {project = …}` confines a project file's hooks once they are trusted;
    before that they do not run at all, confined or not."""
    import json

    from tests.test_hooks_plugin import approve

    path = proj / ".claude" / "settings.json"
    path.write_text(json.dumps({"hooks": hook("UserPromptSubmit", _hook_command(tmp_path))}))
    cfg = write_config(tmp_path, proj, claude_settings=["project"],
                       sandbox={"project": "workspace-write"})
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 0, r.stderr
    assert not (proj / "inside-mark.txt").exists() and not (tmp_path / "outside-mark").exists()
    assert str(path) in r.stderr and "not trusted" in r.stderr
    approve(path)
    r = dsh(tmp_path, proj, cfg, "run", "-m", "echo", "hi")
    assert r.returncode == 0, r.stderr
    assert (proj / "inside-mark.txt").read_text() == "ran\n"
    assert not (tmp_path / "outside-mark").exists()
    assert (proj / "leak.txt").read_text() == ""
    [run] = [e["data"] for e in of(ledger(tmp_path), "x/dsh-hooks/hook")]
    assert run["sandbox"] == "workspace-write, no network" and run["source"] == str(path)
