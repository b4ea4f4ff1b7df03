"""Attachments (issue 17): images and PDFs in, stored once by hash, sent in each provider's
format, refused clearly where they cannot go — against real loopback servers and real
subprocesses."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import dsh
from dsh.core.messages import Attachment
from dsh.ledger.events import UserMessage
from dsh.ledger.serialize import dump_event
from dsh.ledger.serialize import load_event
from dsh.ledger.store import JsonlStore
from dsh.llm import attachments as att
from dsh.llm.attachments import AttachmentError
from dsh.llm.attachments import AttachmentMissing
from dsh.llm.attachments import NotAccepted
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import anthropic_message
from tests.servers import closed_port
from tests.servers import openai_completion
from tests.servers import scripted_server

#: Minimal files with each type's real signature (a sniffer judges these bytes alone).
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(40))
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x01" * 30
GIF = b"GIF89a" + b"\x01\x00\x01\x00" + b"\x00" * 20
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x00" * 24
PDF = b"%PDF-1.7\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    yield from scripted_server()


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-attach")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-attach")


def make_app(tmp_path: Path, server: ScriptedServer | None = None, **models: Any) -> dsh.App:
    cfg: dict[str, Any] = {"autoload": False, "sessions_dir": str(tmp_path / "sessions"),
                           "model": "echo"}
    if server is not None:
        cfg["models"] = {
            "oa": {"adapter": "openai", "model": "gpt-4o", "base_url": server.url + "/v1",
                   **models.get("oa", {})},
            "an": {"adapter": "anthropic", "model": "claude-sonnet-4-5",
                   "base_url": server.url, **models.get("an", {})},
        }
    return dsh.App.from_config(cfg)


def ledger_text(result: dsh.RunResult) -> str:
    assert result.path is not None
    return result.path.read_text()


def user_content(body: dict[str, Any]) -> Any:
    """The content of the last user message of a request body."""
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


# -- sniffing and loading -------------------------------------------------------------------


@pytest.mark.parametrize("data,media_type", [(PNG, "image/png"), (JPEG, "image/jpeg"),
                                             (GIF, "image/gif"), (WEBP, "image/webp"),
                                             (PDF, "application/pdf")])
def test_sniff_judges_the_bytes(data: bytes, media_type: str) -> None:
    assert att.sniff(data) == media_type
    assert att.sniff(b"x" + data) is None  # the signature must be at the start


def test_a_file_that_claims_png_but_is_not_is_refused_by_name(tmp_path: Path) -> None:
    fake = tmp_path / "photo.png"
    fake.write_bytes(b"#!/bin/sh\necho not an image\n")
    with pytest.raises(AttachmentError, match=r"cannot attach '.*photo\.png': not a PNG"):
        att.load(fake)
    # bytes said to be a PNG whose content is a PDF: the content wins, the caller is told
    with pytest.raises(AttachmentError, match="said to be image/png but its content is "
                                              "application/pdf"):
        att.load((PDF, "image/png"))


def test_a_sparse_gigabyte_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "huge.png"
    with open(big, "wb") as f:
        f.write(PNG)
        f.truncate(1 << 30)  # sparse: 1 GiB apparent, nothing on disk
    started = time.monotonic()
    with pytest.raises(AttachmentError, match=r"huge\.png': 1073741824 bytes, over the 32 MiB"):
        att.load(big)
    assert time.monotonic() - started < 1.0  # refused from fstat, never read


def test_size_caps_per_type_name_the_file_and_the_limit() -> None:
    image = PNG + b"\x00" * (att.MAX_BYTES["image"] + 1 - len(PNG))
    with pytest.raises(AttachmentError, match=r"over the 20 MiB limit for image/png"):
        att.load(att.Input(image, None, "big.png"))
    pdf = PDF + b"\x00" * (att.MAX_BYTES["image"] + 1)  # a PDF may be bigger than an image
    assert att.load(pdf).media_type == "application/pdf"


def test_a_symlink_to_proc_environ_is_refused_and_proc_itself_read_capped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc files report size 0 and are read up to the cap; their content is judged like any
    # other and is not an image: refused, and the error quotes none of it.
    monkeypatch.setenv("DSH_TEST_SECRET", "hunter2-do-not-show")
    link = tmp_path / "innocent.png"
    link.symlink_to("/proc/self/environ")
    with pytest.raises(AttachmentError) as info:  # a link in the workspace is never followed
        att.load(link)
    assert "symbolic link" in str(info.value) and "hunter2" not in str(info.value)
    with pytest.raises(AttachmentError) as info:  # named by its own path: read, capped, judged
        att.load(Path("/proc/self/environ"))
    assert "not a" in str(info.value) and "hunter2" not in str(info.value)


def test_directories_fifos_and_devices_are_not_read(tmp_path: Path) -> None:
    with pytest.raises(AttachmentError, match="a directory"):
        att.load(tmp_path)
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(AttachmentError, match="not a regular file"):
        att.load(fifo)  # opened without blocking, refused without a read
    with pytest.raises(AttachmentError, match="not a regular file"):
        att.load("/dev/zero")


def test_a_traversal_looking_name_is_only_a_name(tmp_path: Path, server: ScriptedServer
                                                ) -> None:
    app = make_app(tmp_path, server)
    with app.session(model="oa") as s:
        refs = s.attach(att.Input(PNG, "image/png", "../../../../etc/passwd"))
    (ref,) = refs
    assert ref.name == "../../../../etc/passwd"  # displayed, never used as a path
    stored = list((tmp_path / "sessions" / "attachments").iterdir())
    assert stored == [tmp_path / "sessions" / "attachments" / hashlib.sha256(PNG).hexdigest()]
    with pytest.raises(dsh.core.errors.LedgerError, match="invalid attachment hash"):
        app.store.get_attachment("../../etc/passwd")


# -- storage --------------------------------------------------------------------------------


def test_stored_once_by_hash_0600_atomically(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    sha = store.put_attachment(PNG)
    assert sha == hashlib.sha256(PNG).hexdigest()
    path = tmp_path / "attachments" / sha
    assert path.read_bytes() == PNG
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    inode = path.stat().st_ino
    assert store.put_attachment(PNG) == sha and path.stat().st_ino == inode  # kept, not rewritten
    path.write_bytes(b"tampered")
    assert store.put_attachment(PNG) == sha and path.read_bytes() == PNG  # repaired
    assert [p.name for p in path.parent.iterdir()] == [sha]  # no temporary file left


def test_a_symlink_planted_in_the_store_is_not_followed(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    sha = hashlib.sha256(PNG).hexdigest()
    (tmp_path / "attachments").mkdir()
    (tmp_path / "attachments" / sha).symlink_to("/etc/hostname")
    with pytest.raises(OSError):
        store.get_attachment(sha)
    ref = Attachment(sha256=sha, media_type="image/png", size=len(PNG), name="p.png")
    with pytest.raises(AttachmentMissing, match=r"p\.png .* cannot be read"):
        att.verified(store, ref)


attachments_st = st.builds(
    Attachment, sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
    media_type=st.sampled_from(sorted(att.MEDIA_TYPES)), size=st.integers(0, 2**40),
    name=st.none() | st.text(max_size=40))


@settings(max_examples=200, deadline=None)
@given(st.lists(attachments_st, max_size=4), st.text(max_size=20))
def test_the_reference_round_trips_through_the_ledger_line(refs: list[Attachment],
                                                          text: str) -> None:
    event = UserMessage(seq=0, ts="2026-01-01T00:00:00.000Z", session="s", text=text,
                        attachments=tuple(refs))
    line = dump_event(event)
    back = load_event(line)
    assert back == event
    assert json.loads(line).get("attachments", []) == [
        {"sha256": r.sha256, "media_type": r.media_type, "size": r.size, "name": r.name}
        for r in refs]


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=1, max_size=2000), st.sampled_from([PNG, JPEG, GIF, WEBP, PDF]))
def test_any_bytes_come_back_verified_or_not_at_all(tail: bytes, head: bytes) -> None:
    blobs = att.MemoryBlobs()
    (ref,) = att.store(blobs, [att.load(head + tail)])
    assert att.verified(blobs, ref) == head + tail
    altered = Attachment(sha256=ref.sha256, media_type=ref.media_type, size=ref.size + 1)
    with pytest.raises(AttachmentMissing, match="altered"):
        att.verified(blobs, altered)


# -- what each adapter sends ------------------------------------------------------------------


def test_openai_sends_image_url_and_file_parts(tmp_path: Path, server: ScriptedServer) -> None:
    server.script(Reply(body=openai_completion("a cat and a form")))
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(JPEG)
    app = make_app(tmp_path, server)
    result = app.run("describe", model="oa", attachments=[photo, (PDF, "application/pdf")])
    assert result.check().output == "a cat and a form"
    assert user_content(server.bodies[0]) == [
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + b64(JPEG)}},
        {"type": "file", "file": {"filename": f"{hashlib.sha256(PDF).hexdigest()[:12]}.pdf",
                                  "file_data": "data:application/pdf;base64," + b64(PDF)}},
    ]
    # the ledger records references only: hash, type, size, name — never the bytes
    line = [json.loads(x) for x in ledger_text(result).splitlines()
            if '"user/message"' in x][0]
    assert line["attachments"] == [
        {"sha256": hashlib.sha256(JPEG).hexdigest(), "media_type": "image/jpeg",
         "size": len(JPEG), "name": "cat.jpg"},
        {"sha256": hashlib.sha256(PDF).hexdigest(), "media_type": "application/pdf",
         "size": len(PDF), "name": None}]
    assert b64(JPEG) not in ledger_text(result)


def test_anthropic_sends_image_and_document_blocks_before_the_text(tmp_path: Path,
                                                                  server: ScriptedServer
                                                                  ) -> None:
    server.script(Reply(body=anthropic_message("two things")))
    app = make_app(tmp_path, server)
    result = app.run("what are these?", model="an", attachments=[GIF, att.Input(PDF)])
    assert result.check().output == "two things"
    # (a prompt-cache breakpoint the adapter may add to the last block is not ours to check)
    blocks = [{k: v for k, v in b.items() if k != "cache_control"}
              for b in user_content(server.bodies[0])]
    assert blocks == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/gif",
                                     "data": b64(GIF)}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": b64(PDF)}},
        {"type": "text", "text": "what are these?"},
    ]


def test_later_steps_resend_the_same_bytes(tmp_path: Path, server: ScriptedServer) -> None:
    server.script(Reply(body=openai_completion("first")), Reply(body=openai_completion("two")))
    app = make_app(tmp_path, server)
    with app.session(model="oa") as s:
        s.send("look", attachments=[WEBP]).check()
        s.send("and again?").check()
    first, second = server.bodies
    assert second["messages"][0] == first["messages"][0]  # the image travels again, unchanged
    assert second["messages"][-1] == {"role": "user", "content": "and again?"}


def test_models_that_take_no_attachments_are_refused_before_anything_is_sent(
        tmp_path: Path, server: ScriptedServer) -> None:
    app = make_app(tmp_path, server, oa={"attachments": False},
                   an={"attachments": ["image/png"]})
    with pytest.raises(NotAccepted, match=r"model echo does not take image/png attachments"):
        app.run("hi", attachments=[PNG])
    with pytest.raises(NotAccepted, match=r"model oa does not take image/png"):
        app.run("hi", model="oa", attachments=[PNG])
    with pytest.raises(NotAccepted, match=r"model an does not take application/pdf"):
        app.run("hi", model="an", attachments=[PDF])
    assert server.received == []
    # nothing was recorded either: every refused session left no ledger behind
    assert not list((tmp_path / "sessions").glob("*.jsonl"))


def test_resuming_with_a_model_that_takes_none_is_refused_naming_it(tmp_path: Path,
                                                                   server: ScriptedServer
                                                                   ) -> None:
    server.script(Reply(body=openai_completion("ok")))
    app = make_app(tmp_path, server)
    first = app.run("look", model="oa", attachments=[PNG]).check()
    with pytest.raises(NotAccepted, match="model echo does not take image/png"):
        app.run("and now?", session=first.session_id)
    assert len(server.received) == 1


def test_a_missing_blob_is_a_clear_error_and_the_session_still_loads(tmp_path: Path,
                                                                    server: ScriptedServer
                                                                    ) -> None:
    server.script(Reply(body=openai_completion("ok")))
    app = make_app(tmp_path, server)
    first = app.run("look", model="oa", attachments=[att.Input(PNG, name="shot.png")]).check()
    blob = tmp_path / "sessions" / "attachments" / hashlib.sha256(PNG).hexdigest()
    blob.unlink()
    again = app.run("more?", model="oa", session=first.session_id)
    assert again.outcome == "error"
    assert isinstance(again.error, AttachmentMissing)
    assert "shot.png (image/png" in again.reason and str(blob) in again.reason
    assert len(server.received) == 1  # nothing was sent
    with app.store.open(first.session_id) as ledger:  # loads, and the turn was closed
        assert [m.content for m in ledger.projection.view()][-1] == "more?"
    blob.write_bytes(PNG[:-1] + b"X")  # altered: same size, other bytes
    third = app.run("more?", model="oa", session=first.session_id)
    assert "was altered" in third.reason and "shot.png" in third.reason


# -- URLs -------------------------------------------------------------------------------------


def test_a_url_is_downloaded_once_and_judged_by_its_bytes(tmp_path: Path,
                                                         server: ScriptedServer) -> None:
    server.script(Reply(status=302, headers={"location": "/real/cat.png"}),
                  Reply(body=PNG, headers={"content-type": "text/html"}),  # the header lies
                  Reply(body=openai_completion("a cat")))
    app = make_app(tmp_path, server)
    url = f"http://127.0.0.1:{server.port}/share/cat.png?token=s3cr3t-token"
    result = app.run("what?", model="oa", attachments=[url]).check()
    gets = [r for r in server.received if r.method == "GET"]
    assert [r.path for r in gets] == ["/share/cat.png?token=s3cr3t-token", "/real/cat.png"]
    assert user_content(server.bodies[-1])[1]["image_url"]["url"] == (
        "data:image/png;base64," + b64(PNG))
    ledger = ledger_text(result)
    assert f'"name":"http://127.0.0.1:{server.port}/share/cat.png"' in ledger
    assert "s3cr3t" not in ledger  # the query (a signed URL's token) is not recorded


def test_a_redirect_loop_stops_at_the_bound(server: ScriptedServer) -> None:
    server.script(*[Reply(status=302, headers={"location": "/again"}) for _ in range(20)])
    with pytest.raises(AttachmentError, match=f"more than {att.MAX_REDIRECTS} redirects"):
        att.fetch(server.url + "/start.png")
    assert len(server.received) == att.MAX_REDIRECTS + 1


def test_a_redirect_to_another_scheme_is_refused(server: ScriptedServer) -> None:
    server.script(Reply(status=301, headers={"location": "file:///etc/passwd"}))
    with pytest.raises(AttachmentError, match="redirected to a 'file' URL"):
        att.fetch(server.url + "/x.png")


def test_a_body_over_the_cap_is_cut_off_declared_or_not(server: ScriptedServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(att, "READ_CAP", 4096)
    server.script(Reply(body=PNG + b"\x00" * 5000))  # says its length: refused before reading
    with pytest.raises(AttachmentError, match="5000|over the"):
        att.fetch(server.url + "/big.png")
    # no length, chunked, endless in effect: reading stops past the cap
    server.script(Reply(chunks=[PNG] + [b"\x00" * 1024] * 64))
    with pytest.raises(AttachmentError, match="more than 0.00390625 MiB, download stopped"):
        att.fetch(server.url + "/stream.png")


def test_download_errors_never_echo_credentials_or_query(server: ScriptedServer) -> None:
    server.script(Reply(status=403, body="no"))
    url = f"http://alice:pa55word@127.0.0.1:{server.port}/p.png?sig=abc123"
    with pytest.raises(AttachmentError) as info:
        att.fetch(url)
    assert str(info.value) == (f"cannot attach 'http://127.0.0.1:{server.port}/p.png': "
                               "the server answered 403")
    with pytest.raises(AttachmentError) as info:
        att.fetch(f"http://alice:pa55word@127.0.0.1:{closed_port()}/p.png?sig=abc123")
    assert "pa55word" not in str(info.value) and "abc123" not in str(info.value)
    assert "ConnectError" in str(info.value)


def test_a_stalled_download_times_out(server: ScriptedServer) -> None:
    server.script(Reply(chunks=[PNG, b"x"], chunk_delay=5))
    started = time.monotonic()
    with pytest.raises(AttachmentError):
        att.fetch(server.url + "/slow.png", timeout=0.5)
    assert time.monotonic() - started < 4


# -- the command line (real processes) -------------------------------------------------------

DSH = [sys.executable, "-m", "dsh"]


@pytest.fixture
def cli_env(tmp_path: Path, server: ScriptedServer) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text(
        'autoload = false\nmodel = "echo"\n'
        f'sessions_dir = "{tmp_path / "sessions"}"\n'
        f'[models.oa]\nadapter = "openai"\nmodel = "gpt-4o"\nbase_url = "{server.url}/v1"\n'
        f'[models.local]\nadapter = "openai"\nmodel = "small"\nbase_url = "{server.url}/v1"\n'
        'attachments = false\n')
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS")}
    env.update(DSH_CONFIG=str(config), OPENAI_API_KEY="sk-test-attach")
    return env


def run_dsh(env: dict[str, str], *args: str, input: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([*DSH, *args], env=env, input=input, capture_output=True, timeout=60)


def only_session(tmp_path: Path) -> str:
    (ledger,) = (tmp_path / "sessions").glob("*.jsonl")
    return ledger.stem


def test_cli_attach_files_and_stdin(tmp_path: Path, server: ScriptedServer,
                                    cli_env: dict[str, str]) -> None:
    photo = tmp_path / "photo.webp"
    photo.write_bytes(WEBP)
    server.script(Reply(body=openai_completion("seen")))
    r = run_dsh(cli_env, "run", "-m", "oa", "--attach", str(photo), "--attach", "-", "compare",
                input=PDF)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"seen\n", b"")
    assert [p.get("type") for p in user_content(server.bodies[0])] == [
        "text", "image_url", "file"]
    assert user_content(server.bodies[0])[0] == {"type": "text", "text": "compare"}
    assert user_content(server.bodies[0])[2]["file"]["file_data"].endswith(b64(PDF))


def test_cli_attach_errors_are_one_line_and_exit_2(tmp_path: Path, server: ScriptedServer,
                                                   cli_env: dict[str, str]) -> None:
    fake = tmp_path / "fake.png"
    fake.write_text("hello")
    cases = [
        (["run", "-m", "oa", "--attach", str(fake), "x"], f"cannot attach '{fake}': not a PNG"),
        (["run", "-m", "oa", "--attach", "-"], "give PROMPT as an argument"),
        (["run", "-m", "local", "--attach", "-", "x"],
         "model local does not take image/png attachments"),
        (["run", "--attach", "-", "x"], "model echo does not take image/png attachments"),
    ]
    for args, message in cases:
        r = run_dsh(cli_env, *args, input=PNG)
        err = r.stderr.decode()
        assert r.returncode == 2, (args, err)
        assert message in err, (args, err)
        # one line (a click usage error adds its usual usage lines, as every dsh command's)
        assert err.count("\n") == 1 or err.startswith("Usage: dsh run"), (args, err)
        assert r.stdout == b""
    assert server.received == []
    assert not list((tmp_path / "sessions").glob("*.jsonl"))  # no session was left behind


def test_resume_after_sigkill_sends_the_same_bytes(tmp_path: Path, server: ScriptedServer,
                                                   cli_env: dict[str, str]) -> None:
    photo = tmp_path / "scan.jpg"
    photo.write_bytes(JPEG)
    server.script(Reply(body=openai_completion("late"), delay=30),
                  Reply(body=openai_completion("resumed")))
    proc = subprocess.Popen([*DSH, "run", "-m", "oa", "--attach", str(photo), "read it"],
                            env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not server.received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.received, "the first request never arrived"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    photo.write_bytes(PNG)  # the file on disk changes: the session keeps what it recorded
    sid = only_session(tmp_path)
    r = run_dsh(cli_env, "run", "-m", "oa", "--session", sid, "and now?")
    assert (r.returncode, r.stdout) == (0, b"resumed\n"), r.stderr
    first, second = server.bodies
    sent = json.dumps(user_content(first), sort_keys=True)
    assert json.dumps(second["messages"][0]["content"], sort_keys=True) == sent
    assert b64(JPEG) in sent


def test_sessions_show_lists_attachments_and_marks_a_missing_one(
        tmp_path: Path, server: ScriptedServer, cli_env: dict[str, str]) -> None:
    server.script(Reply(body=openai_completion("ok")))
    photo = tmp_path / "cat.png"
    photo.write_bytes(PNG)
    assert run_dsh(cli_env, "run", "-m", "oa", "--attach", str(photo), "--attach", "-", "hi",
                   input=PDF).returncode == 0
    sid = only_session(tmp_path)
    short = hashlib.sha256(PNG).hexdigest()[:12]
    r = run_dsh(cli_env, "sessions", "show", sid)
    out = r.stdout.decode()
    assert f"+ cat.png (image/png, {len(PNG)} B, sha256 {short})" in out
    assert f"+ stdin (application/pdf, {len(PDF)} B" in out
    assert "cannot be sent" not in out
    blob = tmp_path / "sessions" / "attachments" / hashlib.sha256(PNG).hexdigest()
    blob.unlink()
    r = run_dsh(cli_env, "sessions", "show", sid)
    assert r.returncode == 0  # the session still loads and shows
    line = next(x for x in r.stdout.decode().splitlines() if "cat.png" in x)
    assert "[cannot be sent: attachment cat.png" in line and "is missing" in line
    shown = json.loads(run_dsh(cli_env, "sessions", "show", sid, "--json").stdout)
    assert shown["id"] == sid
    assert [(a["name"], a["media_type"], a["problem"] is None) for a in shown["attachments"]] == [
        ("cat.png", "image/png", False), ("stdin", "application/pdf", True)]
    user = next(e for e in shown["events"] if e["type"] == "user/message")
    assert [a["sha256"] for a in user["attachments"]] == [a["sha256"]
                                                          for a in shown["attachments"]]
    # resuming is refused before anything is sent, naming the attachment and the file
    r = run_dsh(cli_env, "run", "-m", "oa", "--session", sid, "more")
    assert r.returncode == 1 and len(server.received) == 1
    assert "cat.png (image/png" in r.stderr.decode() and str(blob) in r.stderr.decode()


def test_chat_attach_goes_with_the_next_message(tmp_path: Path, server: ScriptedServer,
                                               cli_env: dict[str, str]) -> None:
    photo = tmp_path / "dog.gif"
    photo.write_bytes(GIF)
    server.script(Reply(body=openai_completion("a dog")), Reply(body=openai_completion("yes")))
    r = run_dsh(cli_env, "chat", "-m", "oa",
                input=f"/attach {photo}\nwhat is it?\nsure?\n".encode())
    assert r.returncode == 0, r.stderr
    assert "attached dog.gif (image/gif" in r.stdout.decode()  # as /tools prints
    assert user_content(server.bodies[0])[1]["image_url"]["url"].endswith(b64(GIF))
    assert server.bodies[1]["messages"][-1] == {"role": "user", "content": "sure?"}


def test_openai_responses_sends_input_image_and_input_file(tmp_path: Path,
                                                           server: ScriptedServer) -> None:
    from tests.servers_openai import responses_body

    server.script(Reply(body=responses_body([("message", "msg_1", ["a chart"])])))
    app = dsh.App.from_config({
        "autoload": False, "sessions_dir": str(tmp_path / "sessions"),
        "models": {"rs": {"adapter": "openai-responses", "model": "o4-mini",
                          "base_url": server.url + "/v1"}}})
    result = app.run("what?", model="rs", attachments=[PNG, att.Input(PDF, name="r.pdf")])
    assert result.check().output == "a chart"
    (user,) = [i for i in server.bodies[0]["input"] if i.get("role") == "user"]
    assert user["content"] == [
        {"type": "input_text", "text": "what?"},
        {"type": "input_image", "image_url": "data:image/png;base64," + b64(PNG)},
        {"type": "input_file", "filename": "r.pdf",
         "file_data": "data:application/pdf;base64," + b64(PDF)},
    ]


def test_a_malformed_attachments_setting_is_a_config_error(tmp_path: Path,
                                                           server: ScriptedServer) -> None:
    app = make_app(tmp_path, server, oa={"attachments": "yes"})
    with pytest.raises(dsh.core.errors.ConfigError, match="`attachments` must be true, false or a "
                                                     "list of media types"):
        app.run("hi", model="oa", attachments=[PNG])
    assert server.received == []


def test_a_providers_400_about_images_is_named_and_remembered(tmp_path: Path,
                                                              server: ScriptedServer) -> None:
    # OpenAI's answer to an image for a model without vision, as its API words it
    server.script(Reply(status=400, body={"error": {
        "message": "Invalid content type. image_url is only supported by certain models.",
        "type": "invalid_request_error", "param": "messages.[0].content.[1].type",
        "code": None}}))
    app = make_app(tmp_path, server)
    with app.session(model="oa") as s:
        result = s.send("look", attachments=[PNG])
        assert result.outcome == "error"
        assert result.reason.startswith("openai: model 'gpt-4o' refused the attachments "
                                        "(HTTP 400): Invalid content type.")
        assert "attachments = false" in result.reason
        # remembered: the next one is refused before anything is sent, naming the model
        with pytest.raises(NotAccepted, match="model oa does not take image/jpeg"):
            s.send("this one?", attachments=[JPEG])
    assert len(server.received) == 1


def test_no_save_sessions_keep_attachments_in_memory(tmp_path: Path,
                                                      server: ScriptedServer) -> None:
    server.script(Reply(body=openai_completion("ok")), Reply(body=openai_completion("ok")))
    app = make_app(tmp_path, server)
    with app.session(model="oa", save=False) as s:
        s.send("look", attachments=[PNG]).check()
        s.send("again").check()
    assert server.bodies[1]["messages"][0]["content"][1]["image_url"]["url"].endswith(b64(PNG))
    assert not (tmp_path / "sessions").exists()  # nothing written anywhere


def test_a_store_without_attachment_methods_refuses_clearly(tmp_path: Path) -> None:
    class Plain:  # a session_store plugin's store written before issue 17
        pass

    with pytest.raises(AttachmentError, match="this session's store keeps no attachments"):
        att.store(Plain(), [att.load(PNG)])
    ref = Attachment(sha256="ab" * 32, media_type="image/png", size=3, name="p.png")
    with pytest.raises(AttachmentMissing, match=r"p\.png .* this session's store keeps no"):
        att.verified(Plain(), ref)


def test_stdin_on_a_terminal_is_refused_instead_of_waiting(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty())
    with pytest.raises(AttachmentError, match="stdin: it is a terminal"):
        att.load("-")


def test_a_run_without_attachments_never_imports_the_module(tmp_path: Path) -> None:
    code = ("import sys, dsh\n"
            f"app = dsh.App.from_config({{'autoload': False, 'sessions_dir': {str(tmp_path)!r}}})\n"
            "app.run('hi', model='echo').check(); app.run('hi', model='echo', save=False).check()\n"
            "print('dsh.attachments' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out == "False\n"


def test_a_message_without_attachments_writes_no_field() -> None:
    plain = UserMessage(seq=0, ts="t", session="s", text="hi")
    assert "attachments" not in json.loads(dump_event(plain))  # ledgers stay as they were
    assert load_event(dump_event(plain)) == plain
