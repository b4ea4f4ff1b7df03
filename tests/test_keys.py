"""Stored keys (issue 17): ``dsh keys``, the owner-only file, the keyring, ``api_key_name``.

The file backend is tested for real (files, modes, owners, a terminal through pexpect); the
keyring path with the real ``keyring`` library and ``keyrings.alt``'s file backend, chosen
through ``PYTHON_KEYRING_BACKEND`` as a user would (skipped when they are not installed).
Models are the real OpenAI adapter against a loopback server (tests/servers.py).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.config.keys import FileStore
from dsh.config.keys import check_name
from dsh.config.keys import get_key
from dsh.config.keys import keys_dir
from dsh.config.keys import store
from dsh.core import redact
from dsh.core.errors import ConfigError
from dsh.core.errors import ProviderError
from dsh.core.errors import UsageError
from dsh.llm.openai import OpenAIModel
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion

KEY = "sk-stored-Zq81xKe0c9WvB2nd"


@pytest.fixture(autouse=True)
def _file_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The file backend unless a test says otherwise; keyring's own files under tmp_path."""
    monkeypatch.setenv("DSH_KEYS_BACKEND", "file")
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


def dsh(*args: str, input: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", *args], input=input, text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=60)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- the commands, file backend ---------------------------------------------------------------


def test_keys_set_list_path_remove_with_the_file_backend() -> None:
    r = dsh("keys", "set", "openai", input=KEY + "\n")
    assert r.returncode == 0, r.stderr
    path = keys_dir() / "keys.json"
    assert r.stdout == "" and r.stderr == f"dsh: stored key openai in {path}\n"
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert json.loads(path.read_text()) == {"version": 1, "keys": {"openai": KEY}}
    assert dsh("keys", "set", "other", input="sk-second-key-0000000001").returncode == 0
    listed = dsh("keys", "list")
    assert listed.stdout == "openai\nother\n" and KEY not in listed.stdout + listed.stderr
    assert dsh("keys", "path").stdout == f"{path}\n"
    removed = dsh("keys", "remove", "openai")
    assert removed.returncode == 0 and removed.stderr == f"dsh: removed key openai from {path}\n"
    again = dsh("keys", "remove", "openai")
    assert again.returncode == 2
    assert again.stderr == "dsh: error: no stored key 'openai' (dsh keys list shows them)\n"
    assert dsh("keys", "list").stdout == "other\n"


@pytest.mark.parametrize("typed", ["", "\n", "  \n"])
def test_keys_set_refuses_an_empty_key(typed: str) -> None:
    r = dsh("keys", "set", "openai", input=typed)
    assert r.returncode == 2 and "no key given" in r.stderr
    assert not (keys_dir() / "keys.json").exists()


def test_keys_set_refuses_a_bad_name_and_a_key_of_several_lines() -> None:
    r = dsh("keys", "set", "../etc/passwd", input=KEY)
    assert r.returncode == 2 and "invalid key name" in r.stderr
    r = dsh("keys", "set", "openai", input=f"{KEY}\nsecond-line-12345")
    assert r.returncode == 2 and "more than one line" in r.stderr and KEY not in r.stderr


def test_keys_set_reads_the_key_without_echo_on_a_terminal() -> None:
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(sys.executable, ["-m", "dsh", "keys", "set", "openai"],
                          env=dict(os.environ), encoding="utf-8", timeout=30)
    child.expect("Key for openai \\(not shown\\): ")
    child.sendline(KEY)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert KEY not in (child.before or "")  # the terminal never showed it
    assert "stored key openai" in (child.before or "")
    assert FileStore().get("openai") == KEY


def test_concurrent_sets_lose_no_key() -> None:
    """Each `set` rewrites the whole file: under the lock, none overwrites another's key
    (threads with their own lock descriptors, as separate processes have)."""
    from concurrent.futures import ThreadPoolExecutor

    def write(i: int) -> None:
        for j in range(15):
            FileStore().set(f"k{i}-{j}", f"sk-concurrent-{i:02d}-{j:02d}-abcdef")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(8)))
    assert len(FileStore().names()) == 8 * 15
    assert FileStore().get("k5-7") == "sk-concurrent-05-07-abcdef"
    assert not list(keys_dir().glob(".keys-*"))  # no temporary file left behind
    r = dsh("keys", "set", "one-more", input="sk-one-more-key-123")  # and a process
    assert r.returncode == 0 and len(FileStore().names()) == 8 * 15 + 1


# -- the file's protection --------------------------------------------------------------------


def stored() -> Path:
    FileStore().set("openai", KEY)
    return keys_dir() / "keys.json"


@pytest.mark.parametrize(("target", "bits"), [("file", 0o644), ("file", 0o602),
                                              ("file", 0o640), ("dir", 0o755), ("dir", 0o711)])
def test_a_keys_file_or_dir_others_can_reach_is_refused(target: str, bits: int) -> None:
    path = stored()
    where = path if target == "file" else path.parent
    os.chmod(where, bits)
    r = dsh("keys", "list")
    assert r.returncode == 2, r.stdout
    kind = "file" if target == "file" else "directory"
    want = "600" if target == "file" else "700"
    assert r.stderr == (f"dsh: error: {where}: the keys {kind} is not private (mode "
                        f"{bits:04o}, others may read or change it); dsh will not read keys "
                        f"from it until it is: chmod {want} {where}\n")
    with pytest.raises(ConfigError):
        FileStore().set("more", "sk-another-000000000")  # nor written to
    os.chmod(where, 0o600 if target == "file" else 0o700)
    assert FileStore().get("openai") == KEY


def test_a_symlinked_or_foreign_keys_file_is_refused(tmp_path: Path) -> None:
    path = stored()
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps({"version": 1, "keys": {"openai": "sk-planted-0000000"}}))
    os.chmod(elsewhere, 0o600)
    path.unlink()
    path.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="symbolic link"):
        FileStore().get("openai")
    path.unlink()
    stored()
    if os.geteuid() == 0:  # root can give the file away; others cannot make the case
        os.chown(path, 65534, 65534)
        with pytest.raises(ConfigError, match="belongs to another user"):
            FileStore().get("openai")


def test_a_damaged_keys_file_is_named_without_its_content() -> None:
    path = stored()
    path.write_text('{"keys": {"openai": "' + KEY + '"')  # cut short
    r = dsh("keys", "list")
    assert r.returncode == 2
    assert r.stderr == (f"dsh: error: {path}: the keys file is damaged (not dsh's JSON); "
                        "remove it and set the keys again\n")


def test_the_keys_dir_is_made_owner_only_whatever_the_umask() -> None:
    old = os.umask(0)
    try:
        FileStore().set("openai", KEY)
    finally:
        os.umask(old)
    assert mode(keys_dir()) == 0o700 and mode(keys_dir() / "keys.json") == 0o600


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
               min_size=8, max_size=60).filter(lambda s: any(c.isdigit() for c in s)))
def test_any_stored_key_round_trips_and_is_redacted(value: str) -> None:
    value = value.strip()
    if not redact.is_secret(value):
        return
    FileStore().set("prop", value)
    assert FileStore().get("prop") == value
    assert value not in redact.redact(f"the server said: invalid key {value}!")


@given(st.text(max_size=40))
def test_key_names_are_plain_words(name: str) -> None:
    try:
        check_name(name)
    except UsageError:
        return
    assert "/" not in name and ":" not in name and ".." != name[:2] and name.strip() == name


# -- resolving a model's key ------------------------------------------------------------------


def make(server: ScriptedServer, **settings_: Any) -> OpenAIModel:
    return OpenAIModel("gpt-4o-mini", {"base_url": server.url + "/v1", "retry_base": 0.001,
                                       **settings_})


def ask(model: OpenAIModel) -> str:
    from dsh.core.messages import Message
    from dsh.core.messages import ModelRequest
    from dsh.llm.transport import send

    return send(ModelRequest(model="openai:gpt-4o-mini",
                             messages=[Message(role="user", content="hi")]), model=model).text


def test_a_stored_key_is_used_when_no_variable_holds_one(
        server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    FileStore().set("openai", KEY)
    FileStore().set("work", "sk-work-key-99999999")
    # Named after the provider by default (a remote URL: nothing is sent here).
    assert OpenAIModel("gpt-4o", {"base_url": "https://api.example.invalid/v1"}).api_key() == KEY
    server.script(*[Reply(body=openai_completion("ok"))] * 3)
    assert ask(make(server, api_key_name="openai")) == "ok"
    assert server.received[0].headers["authorization"] == f"Bearer {KEY}"
    assert ask(make(server, api_key_name="work")) == "ok"
    assert server.received[1].headers["authorization"] == "Bearer sk-work-key-99999999"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment-1")  # the variable wins
    assert ask(make(server, api_key_name="openai")) == "ok"
    assert server.received[2].headers["authorization"] == "Bearer sk-from-the-environment-1"


def test_a_missing_stored_key_says_how_to_store_one(
        server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ProviderError) as info:
        make(server, api_key_name="work", api_key_env="MY_KEY").check()
    assert "dsh keys set work" in str(info.value) and "MY_KEY" in str(info.value)
    assert server.received == []


def test_a_loopback_server_without_key_does_not_read_the_store(
        server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local servers need no key: unless `api_key_name` asks for one, the store (and
    keyring's import) is not touched."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("DSH_KEYS_BACKEND", "bogus")  # reading the store would fail
    server.script(Reply(body=openai_completion("ok")))
    assert ask(make(server)) == "ok"
    assert "authorization" not in server.received[0].headers


def test_a_stored_key_echoed_by_the_server_is_redacted(
        server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    FileStore().set("leaky", "sk-leaky-Yt6Wq0pLm3Nv")
    server.script(Reply(401, {"error": {"message": "Incorrect API key provided: "
                                                   "sk-leaky-Yt6Wq0pLm3Nv"}}))
    with pytest.raises(ProviderError) as info:
        ask(make(server, api_key_name="leaky"))
    assert "sk-leaky-Yt6Wq0pLm3Nv" not in str(info.value)
    assert "[redacted]" in str(info.value) and "stored key leaky" in str(info.value)


def test_a_run_with_a_stored_key_never_shows_or_passes_it_on(
        server: ScriptedServer, tmp_path: Path) -> None:
    """End to end: the key reaches the server's header and nowhere else — not stdout,
    stderr, --events, the ledger, nor the environment of a tool's child process."""
    FileStore().set("openai", KEY)
    tool = tmp_path / "envtool.py"
    tool.write_text(
        "import os, subprocess, sys\nfrom dsh import hookimpl\n\n"
        "def child_env() -> str:\n    \"\"\"The environment a child process gets.\"\"\"\n"
        "    return subprocess.run(['env'], capture_output=True, text=True).stdout\n\n"
        "@hookimpl\ndef register_tools(register):\n    register(child_env)\n")
    config = tmp_path / "dsh.toml"
    config.write_text(f'model = "openai:gpt-4o-mini"\nload = ["envtool"]\n'
                      f'[models."openai:gpt-4o-mini"]\nbase_url = "{server.url}/v1"\n'
                      'api_key_name = "openai"\n')
    server.script(Reply(body=openai_completion(calls=[("c1", "child_env", "{}")])),
                  Reply(body=openai_completion("done")))
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-m", "dsh", "--config", str(config), "run",
                        "--events", "hi"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert server.received[0].headers["authorization"] == f"Bearer {KEY}"
    tool_result = json.dumps(server.bodies[1]["messages"][-1])
    assert "PATH=" in tool_result and KEY not in tool_result  # the child's env, no key
    assert KEY not in r.stdout and KEY not in r.stderr
    ledgers = list((Path(os.environ["DSH_HOME"]) / "sessions").glob("*.jsonl"))
    assert ledgers and all(KEY not in p.read_text() for p in ledgers)


# -- the keyring --------------------------------------------------------------------------------


@pytest.fixture
def keyring_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """keyring with keyrings.alt's plaintext backend, chosen as a user would."""
    pytest.importorskip("keyring", reason="keyring is not installed")
    pytest.importorskip("keyrings.alt", reason="keyrings.alt is not installed")
    monkeypatch.setenv("DSH_KEYS_BACKEND", "auto")
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyrings.alt.file.PlaintextKeyring")
    return tmp_path / "xdg-data" / "python_keyring" / "keyring_pass.cfg"


def test_keys_in_the_keyring(keyring_file: Path) -> None:
    where = "keyring keyrings.alt.file.PlaintextKeyring (service 'dsh')"
    assert dsh("keys", "path").stdout == where + "\n"
    r = dsh("keys", "set", "openai", input=KEY)
    assert r.returncode == 0 and r.stderr == f"dsh: stored key openai in {where}\n"
    assert dsh("keys", "set", "work", input="sk-work-key-99999999").returncode == 0
    assert dsh("keys", "list").stdout == "openai\nwork\n"
    assert keyring_file.exists() and not (keys_dir() / "keys.json").exists()
    assert get_key("openai") == KEY
    assert KEY not in redact.redact(f"echo {KEY}")
    assert dsh("keys", "remove", "openai").returncode == 0
    assert dsh("keys", "list").stdout == "work\n"
    assert get_key("openai") is None
    assert dsh("keys", "remove", "openai").returncode == 2


def test_keyrings_fallback_file_is_not_chosen_on_its_own(
        keyring_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """keyrings.alt's plaintext file (priority 0.5) is keyring's fallback, not an OS
    keyring: without an explicit choice, dsh's owner-only file is used."""
    monkeypatch.delenv("PYTHON_KEYRING_BACKEND")
    import keyring

    from dsh.config.keys import usable_keyring

    if keyring.get_keyring().priority >= 1:
        pytest.skip("this machine has a real OS keyring")
    assert usable_keyring() is None
    assert isinstance(store(), FileStore)
    monkeypatch.setenv("DSH_KEYS_BACKEND", "keyring")  # forced: any working backend
    assert store().where().startswith("keyring ")


def test_a_failing_keyring_is_one_clear_error(keyring_file: Path, tmp_path: Path) -> None:
    """A locked keyring (or one without its D-Bus service) is exit 2 naming the backend and
    the way out, with no traceback and no key."""
    (tmp_path / "lockedkr.py").write_text(
        "from keyring.backend import KeyringBackend\n"
        "from keyring.errors import KeyringLocked\n\n"
        "class Locked(KeyringBackend):\n"
        "    priority = 5\n\n"
        "    def get_password(self, service, username):\n"
        "        raise KeyringLocked('the keyring is locked')\n\n"
        "    def set_password(self, service, username, password):\n"
        "        raise KeyringLocked('the keyring is locked')\n\n"
        "    def delete_password(self, service, username):\n"
        "        raise KeyringLocked('the keyring is locked')\n")
    env = {"PYTHON_KEYRING_BACKEND": "lockedkr.Locked",
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for args, typed in ((("keys", "list"), None), (("keys", "set", "openai"), KEY)):
        r = dsh(*args, input=typed, env=env)
        assert r.returncode == 2, r.stderr
        assert r.stderr == ("dsh: error: keyring lockedkr.Locked (service 'dsh'): "
                            "KeyringLocked: the keyring is locked (DSH_KEYS_BACKEND=file keeps "
                            "keys in a file instead)\n")
