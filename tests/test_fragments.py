"""``dsh run -f FILE|URL``: text fragments before the prompt, each in a block headed by its
name, recorded in the user message so a resumed session sends the same bytes (C3). The real
``dsh`` in subprocesses, against loopback servers (the model's and the fragment URL's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion
from tests.servers import reconstruct

MODEL = "openai:gpt-4o-mini"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def env(tmp_path: Path, server: ScriptedServer) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text(f'autoload = false\nsessions_dir = "{tmp_path / "sessions"}"\n'
                      f'model = "{MODEL}"\n[models."{MODEL}"]\n'
                      f'base_url = "{server.url}/v1"\nretries = 0\n')
    return {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home"),
            "OPENAI_API_KEY": "sk-test-fragments", "NO_COLOR": "1"}


def dsh(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", *args], env=env, cwd=cwd, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def answer(text: str) -> Reply:
    return Reply(body=openai_completion(text))


def user_texts(body: Any) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_files_go_before_the_prompt_named_and_a_resume_sends_the_same_bytes(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str]) -> None:
    (tmp_path / "a.py").write_text("def f():\n    return 1\n")
    (tmp_path / "b.md").write_text("# Notes\nno trailing newline")
    server.script(answer("looks fine"), answer("still fine"))
    done = dsh(env, tmp_path, "run", "--json", "-f", "a.py", "--fragment", "b.md",
               "review these")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    expected = ('<fragment name="a.py">\ndef f():\n    return 1\n</fragment>\n\n'
                '<fragment name="b.md">\n# Notes\nno trailing newline\n</fragment>\n\n'
                "review these")
    assert user_texts(server.bodies[0]) == [expected]
    path = tmp_path / "sessions" / f"{result['session']}.jsonl"
    recorded = [e["text"] for e in ledger(path) if e["type"] == "user/message"]
    assert recorded == [expected]
    # The files are gone: the resumed session's request still carries them, from the ledger.
    (tmp_path / "a.py").unlink()
    (tmp_path / "b.md").unlink()
    again = dsh(env, tmp_path, "run", "--session", result["session"], "and now?")
    assert again.returncode == 0, again.stderr
    assert user_texts(server.bodies[1]) == [expected, "and now?"]
    assert server.bodies == reconstruct(path)


def test_a_url_fragment_is_downloaded_once_and_named_without_its_query(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str]) -> None:
    server.script(answer("ok"))
    with ScriptedServer() as web:
        web.script(Reply(body="remote text\n", headers={"content-type": "text/plain"}))
        done = dsh(env, tmp_path, "run", "-f", f"{web.url}/doc.txt?token=s3cret", "sum up")
        assert done.returncode == 0, done.stderr
        assert [(r.method, r.path) for r in web.received] == [("GET", "/doc.txt?token=s3cret")]
    assert done.stdout == "ok\n"
    assert user_texts(server.bodies[0]) == [
        f'<fragment name="{web.url}/doc.txt">\nremote text\n</fragment>\n\nsum up']
    assert "s3cret" not in json.dumps(server.bodies)


@pytest.mark.parametrize("status", [404, 500])
def test_a_url_that_fails_is_an_error_naming_it_and_its_status(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str], status: int) -> None:
    with ScriptedServer() as web:
        web.script(Reply(status=status, body="nope"))
        done = dsh(env, tmp_path, "run", "-f", f"{web.url}/missing.md", "hi")
    assert done.returncode == 2, done.stderr
    assert f"{web.url}/missing.md" in done.stderr and f"answered {status}" in done.stderr
    assert "Traceback" not in done.stderr
    assert server.received == []  # nothing was sent to the model
    assert not (tmp_path / "sessions").exists() or not list((tmp_path / "sessions").glob("*.jsonl"))


def test_a_url_over_the_cap_is_refused(tmp_path: Path, server: ScriptedServer,
                                       env: dict[str, str]) -> None:
    with ScriptedServer() as web:
        web.script(Reply(body="x" * (1024 * 1024 + 1), headers={"content-type": "text/plain"}))
        done = dsh(env, tmp_path, "run", "-f", f"{web.url}/big.txt", "hi")
    assert done.returncode == 2
    assert "big.txt" in done.stderr and "limit" in done.stderr
    assert server.received == []


@pytest.mark.parametrize(("content", "why"), [
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, "image/png"),
    (b"caf\xe9 latin-1", "not UTF-8 text"),
    (b"ELF\x00\x01\x02", "NUL bytes"),
])
def test_a_file_that_is_not_utf8_text_is_an_error_naming_it(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str], content: bytes,
        why: str) -> None:
    (tmp_path / "pic.bin").write_bytes(content)
    done = dsh(env, tmp_path, "run", "-f", "pic.bin", "what is it")
    assert done.returncode == 2, done.stderr
    assert "'pic.bin'" in done.stderr and why in done.stderr and "--attach" in done.stderr
    assert server.received == []


def test_missing_big_and_directory_files_are_errors_naming_them(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str]) -> None:
    (tmp_path / "big.txt").write_text("y" * (1024 * 1024 + 1))
    (tmp_path / "folder").mkdir()
    for name, why in (("nope.txt", "no such file"), ("big.txt", "limit"),
                      ("folder", "a directory")):
        done = dsh(env, tmp_path, "run", "-f", name, "hi")
        assert done.returncode == 2, (name, done.stderr)
        assert repr(name) in done.stderr and why in done.stderr, done.stderr
    assert server.received == []


def test_a_symbolic_link_is_refused_like_an_attachment(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str]) -> None:
    (tmp_path / "real.txt").write_text("secret-ish")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    done = dsh(env, tmp_path, "run", "-f", "link.txt", "hi")
    assert done.returncode == 2
    assert "'link.txt'" in done.stderr and "symbolic link" in done.stderr
    assert server.received == []
