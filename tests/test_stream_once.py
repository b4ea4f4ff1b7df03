"""A streamed answer reaches stdout once.

The double print: a server that fails mid-stream with a context-length error (llama.cpp's
"exceed context window" once generation fills the window) made dsh compact the session and
send the request again, so stdout got the first attempt's part *and* the whole second answer
(``Hello worHello world``). Once part of an answer was shown, nothing sends it again — the
transport's retries already kept that rule; compaction's retry now does too — and the run ends
with the provider's error. The real ``dsh`` in subprocesses against a loopback server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_chunks
from tests.servers import openai_completion
from tests.servers import sse

MODEL = "openai:gpt-4o-mini"


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


def dsh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", *args], env=env, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def env(tmp_path: Path, server: ScriptedServer) -> dict[str, str]:
    """A session with some history (so that compaction has something to compact)."""
    config = tmp_path / "dsh.toml"
    config.write_text(f'autoload = false\nsessions_dir = "{tmp_path / "sessions"}"\n'
                      f'model = "{MODEL}"\n[models."{MODEL}"]\n'
                      f'base_url = "{server.url}/v1"\nretries = 0\ncontext_window = 100000\n')
    e = {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home"),
         "OPENAI_API_KEY": "sk-test-stream-once", "NO_COLOR": "1"}
    for turn in range(4):
        server.script(Reply(chunks=openai_chunks([f"earlier answer {turn} " + "x " * 300])))
        done = dsh(e, "run", "--stream", "-c", f"question {turn} " + "y " * 300)
        assert done.returncode == 0, done.stderr
    return e


def cut_by_the_window() -> Reply:
    chunks = openai_chunks(["Hello ", "wor"], done=False)[:3]
    chunks.append(sse({"error": {"message": "the request exceeds the available context size: "
                                            "exceed context window",
                                 "type": "exceed_context_size_error"}}))
    return Reply(chunks=chunks)


def test_an_answer_cut_mid_stream_is_not_sent_again(server: ScriptedServer,
                                                    env: dict[str, str]) -> None:
    before = len(server.received)
    server.script(cut_by_the_window(),
                  Reply(status=404, body={}),  # llama.cpp's /props: the window, if asked
                  Reply(body=openai_completion("SUMMARY of the session")),  # a compaction
                  Reply(chunks=openai_chunks(["Hello ", "world"])))
    done = dsh(env, "run", "--stream", "-c", "hi")
    assert done.stdout == "Hello wor\n"  # the part shown, once; never "Hello worHello world"
    assert done.returncode == 1 and "exceed context window" in done.stderr
    posts = [r for r in server.received[before:] if r.method == "POST"]
    assert len(posts) == 1  # nothing sent again: no summary request, no second answer


def test_a_context_error_before_any_text_is_still_compacted_and_retried(
        server: ScriptedServer, env: dict[str, str]) -> None:
    before = len(server.received)
    refusal = Reply(status=400, body={"error": {"message": "exceed context window",
                                                "type": "exceed_context_size_error"}})
    server.script(refusal, Reply(status=404, body={}),
                  Reply(body=openai_completion("SUMMARY of the session")),
                  Reply(chunks=openai_chunks(["Hello ", "world"])))
    done = dsh(env, "run", "--stream", "-c", "hi")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Hello world\n"
    posts = [r for r in server.received[before:] if r.method == "POST"]
    assert len(posts) == 3  # refused, the summary, the answer
