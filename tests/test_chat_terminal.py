"""``dsh chat`` on a real pseudo-terminal: the input line and the streamed output never share a
screen line, the ``/`` commands, Tab completion, the recap of a resumed chat.

The answer comes from a loopback OpenAI-compatible server (tests/servers.py) that streams it
slowly and holds the rest of it until the test has typed (a gate, never a timed wait). What
the terminal shows is worked out from the bytes pexpect read, by :class:`Screen`, a small VT
emulation of what prompt_toolkit and dsh write (cursor moves, erasing, wrapping).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_chunks

pexpect = pytest.importorskip("pexpect",
                              reason="pexpect is in the test extra: pip install -e '.[test]'")

MODEL = "openai:gpt-4o-mini"
PROMPT = "›"  # between turns (prompt_toolkit moves the cursor over its trailing space)


class Screen:
    """The screen a terminal of ``rows`` x ``cols`` would show for the bytes fed to it,
    with every line that scrolled off kept above (``lines``). Enough of a VT100 for
    prompt_toolkit's output: printable text (autowrap on or off), CR, LF, BS, CSI cursor
    moves (A B C D G H), erasing (J K); every other sequence is skipped."""

    CSI = re.compile(r"\x1b\[([?>=]?)([0-9;]*)([@-~])")

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.lines: list[list[str]] = [[]]
        self.row = self.col = 0
        self.autowrap = True
        self.pending = ""

    @property
    def top(self) -> int:
        return max(0, len(self.lines) - self.rows)

    def _line(self) -> list[str]:
        while len(self.lines) <= self.row:
            self.lines.append([])
        return self.lines[self.row]

    def _put(self, ch: str) -> None:
        if self.col >= self.cols:
            if self.autowrap:
                self.col = 0
                self.row += 1
            else:
                self.col = self.cols - 1
        line = self._line()
        line.extend(" " * (self.col + 1 - len(line)))
        line[self.col] = ch
        self.col += 1

    def feed(self, data: str) -> None:
        data = self.pending + data
        self.pending = ""
        i = 0
        while i < len(data):
            ch = data[i]
            if ch == "\x1b":
                m = self.CSI.match(data, i)
                if m is None:
                    if i + 1 >= len(data) or (data[i + 1] == "[" and i + 2 >= len(data)):
                        self.pending = data[i:]
                        return
                    if data[i + 1] == "[":  # an unfinished CSI at the end of this read
                        self.pending = data[i:]
                        return
                    i += 2  # ESC x: not drawn
                    continue
                self._csi(m.group(1), m.group(2), m.group(3))
                i = m.end()
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.row += 1
                self._line()
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch >= " ":
                self._put(ch)
            i += 1

    def _csi(self, private: str, params: str, final: str) -> None:
        nums = [int(x) if x else 0 for x in params.split(";")] if params else []
        n = max(1, nums[0]) if nums else 1
        if private == "?":
            if 7 in nums and final in "hl":
                self.autowrap = final == "h"
            return
        if final == "A":
            self.row = max(self.top, self.row - n)
        elif final == "B":
            self.row += n
        elif final == "C":
            self.col = min(self.cols - 1, self.col + n)
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final == "G":
            self.col = n - 1
        elif final in "Hf":
            self.row = self.top + (n - 1)
            self.col = (max(1, nums[1]) - 1) if len(nums) > 1 else 0
        elif final == "K":
            line = self._line()
            if not nums or nums[0] == 0:
                del line[self.col:]
            elif nums[0] == 2:
                line.clear()
        elif final == "J":
            if not nums or nums[0] == 0:
                del self._line()[self.col:]
                del self.lines[self.row + 1:]
            elif nums[0] == 2:
                for line in self.lines[self.top:]:
                    line.clear()

    def text(self) -> list[str]:
        return ["".join(line).rstrip() for line in self.lines]


class Recorder:
    """pexpect's ``logfile_read``: every read kept, to replay the screen read by read."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def write(self, data: str) -> None:
        self.reads.append(data)

    def flush(self) -> None:
        pass


class Gate:
    """The chunks of a streamed reply, the rest of them held back until :meth:`open`."""

    def __init__(self, chunks: list[bytes], held_after: int) -> None:
        self.chunks = chunks
        self.held_after = held_after
        self.opened = threading.Event()

    def open(self) -> None:
        self.opened.set()

    def __iter__(self) -> Iterator[bytes]:
        for i, chunk in enumerate(self.chunks):
            if i == self.held_after:
                self.opened.wait(60)
            yield chunk

    def __len__(self) -> int:
        return len(self.chunks)


class Term:
    def __init__(self, tmp: Path, server: ScriptedServer | None = None,
                 model: str | None = None) -> None:
        self.tmp = tmp
        self.sessions = tmp / "sessions"
        self.work = tmp / "work"
        self.work.mkdir(exist_ok=True)
        self.config = tmp / "config.toml"
        cfg: dict[str, Any] = {"autoload": False, "sessions_dir": str(self.sessions),
                               "load": ["chatplugin"]}
        if server is not None:
            cfg["model"] = MODEL
            cfg["models"] = {MODEL: {"base_url": server.url + "/v1", "retries": 0}}
        else:
            cfg["model"] = model or "echo"
        self.config.write_text(tomli_w.dumps(cfg))
        (tmp / "chatplugin.py").write_text(
            "from dsh.hookspecs import hookimpl\n\n"
            "@hookimpl\n"
            "def register_chat_commands(register):\n"
            "    register('shout', lambda chat, arg: arg.upper() + '!', help='shout it')\n")
        self.env = {**os.environ, "DSH_CONFIG": str(self.config), "DSH_HOME": str(tmp / "home"),
                    "PYTHONPATH": str(tmp), "NO_COLOR": "1", "TERM": "xterm",
                    "PROMPT_TOOLKIT_NO_CPR": "1", "OPENAI_API_KEY": "sk-test-chat-terminal"}
        self.env.pop("OPENAI_BASE_URL", None)
        self.recorder = Recorder()

    def spawn(self, *args: str, rows: int = 30, cols: int = 100) -> Any:
        import signal

        before = signal.getsignal(signal.SIGINT)
        if before == signal.SIG_IGN:  # a person at a terminal: Ctrl-C is not ignored
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            child = pexpect.spawn(sys.executable, ["-m", "dsh", "chat", *args], env=self.env,
                                  cwd=str(self.work), encoding="utf-8", timeout=30,
                                  dimensions=(rows, cols))
        finally:
            if before == signal.SIG_IGN:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.rows, self.cols = rows, cols
        self.recorder = Recorder()
        child.logfile_read = self.recorder
        child.expect(PROMPT)
        return child

    def screens(self) -> Iterator[list[str]]:
        """The screen after each read from the terminal."""
        screen = Screen(self.rows, self.cols)
        for data in self.recorder.reads:
            screen.feed(data)
            yield screen.text()

    def ledger(self, session: str | None = None) -> list[dict[str, Any]]:
        paths = sorted(self.sessions.glob("*.jsonl"))
        path = next(p for p in paths if session is None or p.stem == session)
        return [json.loads(x) for x in path.read_text().splitlines()]

    def session_ids(self) -> list[str]:
        return sorted(p.stem for p in self.sessions.glob("*.jsonl"))


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


def _type(child: Any, text: str) -> None:
    """Type ``text`` key by key, each drawn by the prompt before the next (prompt_toolkit
    draws only what changed: the key)."""
    for ch in text:
        child.send(ch)
        child.expect_exact(ch)


# -- the input line and the output -----------------------------------------------------------


def test_typing_during_a_streamed_answer_never_shares_its_screen_line(
        tmp_path: Path, server: ScriptedServer) -> None:
    words = [f"alpha{i:02d} " for i in range(1, 41)]
    words[19] = "alpha20\n"  # a whole line, then the line the model is still writing
    gate = Gate(openai_chunks(words), held_after=8)  # role chunk + 7 words, then held
    server.script(Reply(chunks=gate, chunk_delay=0.02),  # type: ignore[arg-type]
                  Reply(chunks=openai_chunks(["steered ", "and done"])))
    term = Term(tmp_path, server)
    child = term.spawn(cols=200)
    child.sendline("write forty words")
    child.expect("alpha07")  # streaming, and held: the answer is half written
    _type(child, "zzsteer")  # typed while the answer streams
    gate.open()
    child.expect("alpha25")  # more of the answer arrived while "zzsteer" sat in the prompt
    _type(child, "ing")
    child.send("\r")  # sent to Session.steer: answered when this turn ends
    child.expect("queued")
    child.expect("and done")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    shared = []
    for screen in term.screens():
        for line in screen:
            if "alpha" in line and "zz" in line:
                shared.append(line)
    assert not shared, shared[:3]
    final = list(term.screens())[-1]
    streamed = [line for line in final if "alpha" in line]
    assert any(line.startswith("alpha01 ") and line.endswith("alpha20") for line in streamed)
    assert any("alpha40" in line for line in streamed)
    msgs = [d["text"] for d in term.ledger() if d["type"] == "user/message"]
    assert msgs == ["write forty words", "zzsteering"]
    sent = server.received[-1].body["messages"]
    assert sent[-1]["content"] == "zzsteering"
    assert "alpha40" in sent[-2]["content"]  # the whole answer was recorded


def test_clear_compact_mode_and_cost_at_the_prompt(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "one " * 200}, {"text": "two " * 200}, {"text": "three " * 200},
        {"text": "four"}]}))
    term = Term(tmp_path, model=f"scripted:{script}")
    child = term.spawn()
    for msg, answer in (("first", "one one"), ("second", "two two"), ("third", "three")):
        child.sendline(msg)
        child.expect(answer)
        child.expect(PROMPT)
    child.sendline("/compact truncate")
    child.expect(r"compacted messages (\d+)-(\d+) \(truncate\): ~(\d+) -> ~(\d+) tokens")
    before, after = int(child.match.group(3)), int(child.match.group(4))
    assert after < before
    child.expect(PROMPT)
    child.sendline("/mode")
    child.expect("mode: ask")
    child.sendline("/mode yolo")
    child.expect("unknown mode 'yolo'")
    child.sendline("/mode read-only")
    child.expect("mode: read-only")
    child.expect(PROMPT)
    child.sendline("fourth")
    child.expect("four")
    child.expect(PROMPT)
    child.sendline("/cost")
    child.expect(r"session (\S+): (\d+) in / (\d+) out tokens, cost unknown, 4 responses")
    first = child.match.group(1)
    child.sendline("/clear")
    child.expect(r"new session (\S+); the previous one is kept as it was: (\S+) ")
    second, kept = child.match.group(1), child.match.group(2)
    assert kept == first and second != first
    child.expect(PROMPT)
    child.sendline("again")
    child.expect("one one")  # the scripted model answers by position: the history is empty
    child.expect(PROMPT)
    child.sendline("/cost")
    child.expect(rf"session {second}: \d+ in / \d+ out tokens, cost unknown, 1 response\b")
    child.expect(PROMPT)  # Ctrl-D is the prompt's once it is drawn (before: the terminal's)
    child.sendeof()
    child.expect(pexpect.EOF)
    assert term.session_ids() == sorted([first, second])
    old = term.ledger(first)
    compacted = [d for d in old if d["type"] == "context/compacted"]
    assert len(compacted) == 1 and compacted[0]["strategy"] == "truncate"
    modes = [d.get("mode") for d in old if d["type"] == "turn/start"]
    assert modes == ["ask", None, None, "read-only"]  # recorded when it changes
    new = term.ledger(second)
    assert [d["text"] for d in new if d["type"] == "user/message"] == ["again"]
    starts = [d for d in new if d["type"] == "turn/start"]
    assert len(starts) == 1 and starts[0]["mode"] == "read-only"  # the chat's mode went on


def test_tab_completes_commands_and_paths(tmp_path: Path) -> None:
    term = Term(tmp_path)
    (term.work / "notes_abc.txt").write_text("x")
    (term.work / "src").mkdir()
    (term.work / "src" / "main_module.py").write_text("x")
    child = term.spawn()
    child.send("/cl\t")
    child.expect("/clear")
    child.send("\r")
    child.expect("new session")
    child.expect(PROMPT)
    child.send("/sho\t")  # a plugin's command (register_chat_commands)
    child.expect("/shout")
    child.send(" hey\r")
    child.expect("HEY!")
    child.expect(PROMPT)
    child.send("read @notes_a\t")
    child.expect("@notes_abc.txt")
    child.send(" and @src/ma\t")
    child.expect("@src/main_module.py")
    child.send("\r")
    child.expect("read @notes_abc.txt and @src/main_module.py\r\n")  # echo's answer
    child.expect(PROMPT)
    child.sendline("/help")
    child.expect("/exit")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    helped = list(term.screens())[-1]
    for name in ("clear", "compact", "mode", "cost", "model", "fork", "rewind", "shout"):
        assert any(line.startswith(f"  /{name} ") for line in helped), name
    msgs = [d["text"] for d in term.ledger() if d["type"] == "user/message"]
    assert msgs == ["read @notes_abc.txt and @src/main_module.py"]  # left as typed


def test_a_resumed_chat_starts_with_a_recap(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Paris is the capital"}, {"text": "it has \u001b[2J 2.1 million people\nand more"},
        {"text": "the Seine"}, {"text": "welcome back"}]}))
    term = Term(tmp_path, model=f"scripted:{script}")
    child = term.spawn()
    for msg, answer in (("capital of France?", "Paris is"), ("how many live there?", "million"),
                        ("its river?", "Seine")):
        child.sendline(msg)
        child.expect(answer)
        child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    child = term.spawn("-c")
    child.sendline("hello again")
    child.expect("welcome back")
    child.expect(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    screen = list(term.screens())[-1]
    start = next(i for i, line in enumerate(screen) if line.startswith("resumed: "))
    assert screen[start:start + 7] == [
        "resumed: 3 exchanges so far",
        "  you: capital of France?",
        "  agent: Paris is the capital",
        "  you: how many live there?",
        "  agent: it has \\x1b[2J 2.1 million people and more",  # one line, escaped
        "  you: its river?",
        "  agent: the Seine"]
    assert len(term.session_ids()) == 1
