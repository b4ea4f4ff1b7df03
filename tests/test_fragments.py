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
    recorded = [e for e in ledger(path) if e["type"] == "user/message"]
    # The ledger keeps the prompt and a reference per fragment; the texts are blobs by hash.
    assert [e["text"] for e in recorded] == ["review these"]
    assert [(f["name"], f["size"]) for f in recorded[0]["fragments"]] == [
        ("a.py", 22), ("b.md", 27)]
    assert "def f()" not in path.read_text()
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


def blob_files(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "sessions" / "attachments"
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) \
        if folder.exists() else []


def test_the_same_100kb_fragment_in_two_turns_and_two_sessions_is_stored_once(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str]) -> None:
    text = "".join(f"line {i:06d} of the big file\n" for i in range(3800))  # ~100 KB
    assert len(text) > 100_000
    (tmp_path / "big.txt").write_text(text)
    block = f'<fragment name="big.txt">\n{text[:-1]}\n</fragment>'
    server.script(*(answer(f"answer {i}") for i in range(4)))
    first = dsh(env, tmp_path, "run", "--json", "-f", "big.txt", "first")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session"]
    again = dsh(env, tmp_path, "run", "--session", sid, "-f", "big.txt", "second")
    assert again.returncode == 0, again.stderr
    other = dsh(env, tmp_path, "run", "-f", "big.txt", "another session")
    assert other.returncode == 0, other.stderr
    # The wire: the block before the prompt, byte for byte as before, in every turn.
    assert user_texts(server.bodies[0]) == [f"{block}\n\nfirst"]
    assert user_texts(server.bodies[1]) == [f"{block}\n\nfirst", f"{block}\n\nsecond"]
    assert user_texts(server.bodies[2]) == [f"{block}\n\nanother session"]
    # Stored once: one blob holding the text, and ledgers that hold none of it.
    blobs = blob_files(tmp_path)
    assert len(blobs) == 1
    assert blobs[0].read_bytes() == text.encode()
    ledgers = list((tmp_path / "sessions").glob("*.jsonl"))
    assert len(ledgers) == 2
    assert sum(p.stat().st_size for p in ledgers) < 20_000
    assert all("line 000001" not in p.read_text() for p in ledgers)
    # The source is gone: the resumed session sends the same bytes, from the store.
    (tmp_path / "big.txt").unlink()
    third = dsh(env, tmp_path, "run", "--session", sid, "third")
    assert third.returncode == 0, third.stderr
    assert user_texts(server.bodies[3]) == [f"{block}\n\nfirst", f"{block}\n\nsecond", "third"]
    path = tmp_path / "sessions" / f"{sid}.jsonl"
    assert reconstruct(path) == [server.bodies[0], server.bodies[1], server.bodies[3]]


def test_sessions_show_and_export_name_a_fragment_and_its_size_not_its_text(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str]) -> None:
    (tmp_path / "notes.md").write_text("SECRET-ISH BODY\n" * 100)
    server.script(answer("ok"))
    done = dsh(env, tmp_path, "run", "--json", "-f", "notes.md", "summarise")
    assert done.returncode == 0, done.stderr
    sid = json.loads(done.stdout)["session"]
    shown = dsh(env, tmp_path, "sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert "fragment notes.md (1.6 KiB)" in shown.stdout
    assert "summarise" in shown.stdout and "SECRET-ISH" not in shown.stdout
    exported = dsh(env, tmp_path, "sessions", "export", sid, "--format", "markdown")
    assert exported.returncode == 0, exported.stderr
    assert "- fragment: notes.md (1.6 KiB)" in exported.stdout
    assert "SECRET-ISH" not in exported.stdout
    page = dsh(env, tmp_path, "sessions", "export", sid, "--html")
    assert page.returncode == 0, page.stderr
    assert "fragment notes.md (1.6 KiB)" in page.stdout and "SECRET-ISH" not in page.stdout


@pytest.mark.parametrize("damage", ["delete", "alter"])
def test_a_missing_or_altered_blob_is_an_error_naming_the_fragment_and_nothing_is_sent(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str], damage: str) -> None:
    (tmp_path / "a.py").write_text("print('hi')\n")
    server.script(answer("ok"), answer("never"))
    done = dsh(env, tmp_path, "run", "--json", "-f", "a.py", "look")
    assert done.returncode == 0, done.stderr
    sid = json.loads(done.stdout)["session"]
    [blob] = blob_files(tmp_path)
    if damage == "delete":
        blob.unlink()
    else:
        blob.write_text("print('pwned')\n")
    again = dsh(env, tmp_path, "run", "--session", sid, "more")
    assert again.returncode != 0
    assert "fragment 'a.py'" in again.stderr, again.stderr
    assert ("missing" if damage == "delete" else "altered") in again.stderr
    assert "Traceback" not in again.stderr
    assert len(server.received) == 1
    shown = dsh(env, tmp_path, "sessions", "show", sid)  # the view still works, and says so
    assert shown.returncode == 0, shown.stderr
    assert "fragment a.py" in shown.stdout and "context: unknown (fragment 'a.py'" in shown.stdout


def test_an_old_ledger_with_the_blocks_in_its_text_loads_and_resumes_unchanged(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str]) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    server.script(answer("ok"), answer("again"))
    done = dsh(env, tmp_path, "run", "--json", "-f", "a.py", "check")
    assert done.returncode == 0, done.stderr
    sid = json.loads(done.stdout)["session"]
    path = tmp_path / "sessions" / f"{sid}.jsonl"
    whole = '<fragment name="a.py">\nx = 1\n</fragment>\n\ncheck'
    # Rewrite it as dsh wrote it before fragments were blobs: the whole text, no references.
    lines = ledger(path)
    for e in lines:
        if e["type"] == "user/message":
            assert e.pop("fragments")
            e["text"] = whole
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in lines))
    for blob in blob_files(tmp_path):
        blob.unlink()
    shown = dsh(env, tmp_path, "sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert "x = 1" in shown.stdout
    again = dsh(env, tmp_path, "run", "--session", sid, "and?")
    assert again.returncode == 0, again.stderr
    assert user_texts(server.bodies[1]) == [whole, "and?"]
    assert user_texts(server.bodies[0]) == [whole]
    assert reconstruct(path) == server.bodies


def test_a_no_save_session_sends_the_block(tmp_path: Path, server: ScriptedServer,
                                           env: dict[str, str]) -> None:
    (tmp_path / "a.py").write_text("y = 2")
    server.script(answer("ok"))
    done = dsh(env, tmp_path, "run", "--no-save", "-f", "a.py", "hm")
    assert done.returncode == 0, done.stderr
    assert user_texts(server.bodies[0]) == ['<fragment name="a.py">\ny = 2\n</fragment>\n\nhm']
    assert not (tmp_path / "sessions").exists() or not blob_files(tmp_path)


def test_ledger_lines_round_trip_fragment_references() -> None:
    """The event shape: ``fragments`` is written only when there are any, read back checked;
    a line whose references are of the wrong shape is refused, naming the field."""
    from dsh.core.errors import LedgerError
    from dsh.core.messages import FragmentRef
    from dsh.ledger.events import UserMessage
    from dsh.ledger.serialize import dump_event
    from dsh.ledger.serialize import load_event

    ref = FragmentRef(sha256="ab" * 32, size=5, name="a.py")
    event = UserMessage(seq=1, ts="t", session="s", text="hi", fragments=(ref,))
    line = dump_event(event)
    assert json.loads(line)["fragments"] == [{"sha256": "ab" * 32, "size": 5, "name": "a.py"}]
    assert load_event(line) == event
    assert "fragments" not in dump_event(UserMessage(seq=1, ts="t", session="s", text="hi"))
    bad = json.loads(line)
    bad["fragments"][0]["size"] = "5"
    with pytest.raises(LedgerError, match="fragments"):
        load_event(json.dumps(bad))


def test_a_session_with_fragments_replays_the_same_requests(
        tmp_path: Path, server: ScriptedServer, env: dict[str, str]) -> None:
    """``dsh replay`` gives each recorded message again with its fragments' blocks, read from
    the blobs beside the ledger: the replayed requests are the recorded ones."""
    (tmp_path / "a.py").write_text("def f():\n    return 1\n")
    server.script(answer("looks fine"))
    done = dsh(env, tmp_path, "run", "--json", "-f", "a.py", "review this")
    assert done.returncode == 0, done.stderr
    session = json.loads(done.stdout)["session"]
    (tmp_path / "a.py").unlink()  # the blob, not the file, is what is given again
    replayed = dsh(env, tmp_path, "replay", session)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert len(server.bodies) == 1  # replay sends nothing: a stand-in answers
