"""dsh-ray across two nodes (issue 27, item 4): ``ledgers = "ship"`` on a real two-node Ray
cluster on one machine, a node killed mid-batch.

The cluster is Ray's own multi-node utility (``ray.cluster_utils.Cluster``): a head node and a
worker node, one CPU each, every node a real raylet with its own worker processes. Each node
is started with its own ``TMPDIR``, so each node's workers keep their sessions in a different
directory, neither of them the driver's session directory. ``dsh batch`` is a real subprocess
joining the cluster by address (it attaches to the head's raylet: Ray prefers the head
among nodes on one host); the workers' tool, model and attachments come from a small plugin
module on every node's ``PYTHONPATH``, as in a cluster image.

What this shows and what it does not (real separate machines, NFS): docs/ray.md,
"Across nodes".
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

if importlib.util.find_spec("ray") is None or importlib.util.find_spec("dsh_ray") is None:
    pytest.skip("ray or dsh-ray is not installed (pip install 'ray>=2.40' ./plugins/dsh-ray)",
                allow_module_level=True)

CLUSTER = """
import sys
from ray.cluster_utils import Cluster

head_tmp, node_tmp, tools = sys.argv[1:4]
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "include_dashboard": False,
    "env_vars": {"TMPDIR": head_tmp, "PYTHONPATH": tools}})
node = cluster.add_node(num_cpus=1, env_vars={"TMPDIR": node_tmp, "PYTHONPATH": tools})
cluster.wait_for_nodes()
print(cluster.address, flush=True)
for line in sys.stdin:  # commands from the test; EOF: shut down
    if line.strip() == "kill":
        cluster.remove_node(node, allow_graceful=False)  # its raylet and workers SIGKILLed
        print("killed", flush=True)
cluster.shutdown()
"""

TOOLS = '''
"""A tool and a model the Ray workers run in tests/test_ray_nodes.py."""
import tempfile
import time

import dsh
from dsh.llm.builtin import ScriptedModel

PNG = b"\\x89PNG\\r\\n\\x1a\\n" + b"\\x00\\x00\\x00\\rIHDR" + bytes(range(40))


def snap() -> str:
    """Attach an image made for this session to the next step; answer where this worker
    keeps its sessions (its TMPDIR)."""
    from dsh.host.runcontext import current_or_none
    from dsh.llm import attachments as att

    session = current_or_none().session
    data = PNG + session.id.encode()
    refs = att.store(session.ledger.blobs, [att.Input(data, "image/png", name="snap.png")])
    session.inbox.put("here is the snapshot", attachments=refs)
    return tempfile.gettempdir()


def nap(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "rested"


class Vision(ScriptedModel):
    """``vision:PATH``: the scripted model, taking PNG images; every image in a request is
    read from the run's own store and checked against its hash before it answers."""

    attachment_types = frozenset({"image/png"})

    def complete(self, request, on_text=None):
        from dsh.llm import attachments as att

        for message in request.messages:
            for ref in getattr(message, "attachments", ()):
                att.payload(ref)
        return super().complete(request, on_text)


@dsh.hookimpl
def register_tools(register):
    register(snap)
    register(nap)


@dsh.hookimpl
def register_models(register):
    register("vision", Vision)
'''

#: Every task: snap (attach an image) -> the image sent, nap -> done; a continued session
#: gets the fourth answer. Distinct token counts per answer: the totals say which were paid.
SCRIPT = {"responses": [
    {"tool_calls": [{"name": "snap", "arguments": {}}],
     "usage": {"input_tokens": 100, "output_tokens": 1}},
    {"tool_calls": [{"name": "nap", "arguments": {"seconds": 3}}],
     "usage": {"input_tokens": 200, "output_tokens": 2}},
    {"text": "done", "usage": {"input_tokens": 300, "output_tokens": 3}},
    {"text": "continued", "usage": {"input_tokens": 400, "output_tokens": 4}},
]}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A two-node Ray cluster: its address, each node's TMPDIR, and a way to kill the
    worker node."""
    where = tmp_path_factory.mktemp("nodes")
    head_tmp, node_tmp = where / "head-tmp", where / "node-tmp"
    head_tmp.mkdir()
    node_tmp.mkdir()
    tools = where / "tools"
    tools.mkdir()
    (tools / "ray_node_tools.py").write_text(TOOLS)
    env = {**os.environ}
    env.pop("RAY_ADDRESS", None)
    log = (where / "cluster.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", CLUSTER, str(head_tmp), str(node_tmp),
                             str(tools)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                            text=True, env=env, cwd=where)
    assert proc.stdout is not None and proc.stdin is not None
    address = proc.stdout.readline().strip()
    if not address:
        proc.kill()
        proc.wait()
        log.close()
        pytest.fail(f"the Ray cluster did not start: {(where / 'cluster.log').read_text()}")

    def kill() -> None:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("kill\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "killed"

    yield {"address": address, "head_tmp": head_tmp, "node_tmp": node_tmp, "kill": kill,
           "tools": tools}
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    log.close()


#: Every session loaded as a resume loads it (locked, checked), then its events and
#: attachments as ``dsh sessions show --json`` gives them (one process for all of them).
LOAD = """
import json, sys
from pathlib import Path
from dsh.ledger.serialize import dump_event
from dsh.ledger.store import JsonlStore
from dsh.llm.attachments import listing

store = JsonlStore(Path(sys.argv[1]))
out = {}
for sid in sys.argv[2:]:
    store.open(sid).close()
    events = store.read(sid)
    out[sid] = {"events": [json.loads(dump_event(e)) for e in events],
                "attachments": listing(store, events)}
print(json.dumps(out))
"""


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def local_ledgers(tmp: Path) -> list[Path]:
    """The ledgers the workers of the node whose TMPDIR is ``tmp`` are writing now."""
    return list(tmp.glob("dsh-ray-ledgers-*/*.jsonl"))


def test_two_nodes_ship_ledgers_and_attachments_and_a_killed_node_loses_nothing(
        tmp_path: Path, nodes: dict[str, Any]) -> None:
    """Six tasks over two nodes, four at once; each attaches an image on its worker (stored
    in that node's own directory), sends it, then naps. While a task naps on the worker
    node, the node is killed (its raylet and workers SIGKILLed). Then:

    * every task has exactly one result line, completed; the killed tasks' attempts are
      journalled ``died`` and run again (on the head) in new sessions;
    * every ledger — the killed attempts' too — is in the driver's store and loads with
      ``dsh sessions show``; every attachment any of them references is there, its bytes
      matching its hash (``problem`` null);
    * the workers wrote in their nodes' own directories, never in the driver's;
    * the batch budget's total (the summary, read from the actor) equals the usage the
      ledgers record;
    * continuing two sessions (one from each node) sends their attachments back to a
      worker, which reads and checks them before answering.
    """
    sessions = tmp_path / "sessions"
    config = tmp_path / "config.toml"
    config.write_text(f'sessions_dir = "{sessions}"\nload = ["ray_node_tools"]\n'
                      "[plugins.dsh-ray]\ntask_cpus = 0.5\nledgers = \"ship\"\n")
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "DSH_CONFIG": str(config),
           "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(nodes["tools"]),
           "RAY_ADDRESS": nodes["address"]}
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    model = f"vision:{script}"
    (tmp_path / "tasks.jsonl").write_text("".join(
        json.dumps({"id": f"t{i}", "prompt": f"task {i}"}) + "\n" for i in range(6)))

    batch = subprocess.Popen(
        [sys.executable, "-m", "dsh", "batch", "tasks.jsonl", "-m", model, "--executor", "ray",
         "--workers", "4", "-L", "requests=100", "--results", "r.jsonl"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Wait until a task naps on the worker node, with its image already sent, and for two
    # of the shipper's half-second rounds: then kill the node.
    deadline = time.monotonic() + 90
    napping = re.compile(r'^\{"v":1,"type":"tool/call",.*"name":"nap"', re.MULTILINE)
    while not any(napping.search(p.read_text(errors="replace"))
                  for p in local_ledgers(nodes["node_tmp"])):
        assert batch.poll() is None and time.monotonic() < deadline, batch.communicate()
        time.sleep(0.05)
    time.sleep(1.2)
    nodes["kill"]()
    out, err = batch.communicate(timeout=120)
    assert batch.returncode == 0, err
    assert out == ""

    results = lines(tmp_path / "r.jsonl")
    assert Counter(x["id"] for x in results) == Counter(f"t{i}" for i in range(6))
    assert {x["outcome"] for x in results} == {"completed"}
    assert {x["output"] for x in results} == {"done"}
    journal = lines(tmp_path / "r.jsonl.journal")
    died = [x for x in journal if x.get("outcome") == "died"]
    assert died, journal  # the node's tasks died with it ...
    starts = [x for x in journal if "session" in x]
    assert len(starts) == 6 + len(died)  # ... and ran again, each in a new session

    ledgers = sorted(sessions.glob("*.jsonl"))
    session_of = {(x["task"], x["attempt"]): x["session"] for x in starts}
    dead = {session_of[x["task"], x["attempt"]] for x in died}
    # Every ledger the workers wrote is here; a journalled attempt may have none only if its
    # worker died before its run reserved its first step (nothing was written, or sent).
    assert {p.stem for p in ledgers} <= set(session_of.values())
    assert set(session_of.values()) - {p.stem for p in ledgers} <= dead
    assert dead & {p.stem for p in ledgers}  # the one killed in its nap at least
    # Where the workers kept their sessions: each node's own TMPDIR, never the driver's.
    kept = {e["output"] for p in ledgers for e in lines(p)
            if e["type"] == "tool/result" and e["name"] == "snap"}
    assert kept == {str(nodes["head_tmp"]), str(nodes["node_tmp"])}
    assert not list(sessions.glob(".dsh-ray-*"))

    load = subprocess.run([sys.executable, "-c", LOAD, str(sessions),
                           *(p.stem for p in ledgers)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert load.returncode == 0, load.stderr
    loaded = json.loads(load.stdout)
    tokens = 0
    napped = []
    for path in ledgers:
        shown = loaded[path.stem]
        events = shown["events"]
        for a in shown["attachments"]:  # every image referenced arrived whole
            assert a["problem"] is None, (path.stem, a)
            blob = (sessions / "attachments" / a["sha256"]).read_bytes()
            assert hashlib.sha256(blob).hexdigest() == a["sha256"]
            assert blob.endswith(path.stem.encode())  # the image made for this session
        tokens += sum(e["usage"]["input_tokens"] + e["usage"]["output_tokens"]
                      for e in events if e["type"] == "assistant/message")
        end = events[-1]
        assert end["type"] == "turn/end"
        if path.stem not in dead:
            assert end["outcome"] == "completed"
            assert len(shown["attachments"]) == 1
            continue
        # A killed attempt: closed as any crashed session is, what it had shipped kept.
        assert end["outcome"] == "aborted" and end["reason"].startswith("interrupted:")
        calls = [e["call_id"] for e in events if e["type"] == "tool/call" and e["name"] == "nap"]
        if calls:
            result = next(e for e in events if e["type"] == "tool/result"
                          and e["call_id"] == calls[0])
            napped.append((result["status"], len(shown["attachments"])))
    assert ("interrupted", 1) in napped  # the one killed in its nap, with its image
    summary = re.search(r"; ([\d,]+) tokens;", err)
    assert summary is not None, err
    assert int(summary.group(1).replace(",", "")) == tokens  # the budget is exact

    # Continue a completed session (made on the head) and the killed attempt's (made on the
    # lost node): the driver sends each ledger and its image to a worker, whose model reads
    # and checks the image before answering; the killed one's script resumes where it stopped.
    def made_on(sid: str) -> str:
        return next(e["output"] for e in lines(sessions / f"{sid}.jsonl")
                    if e["type"] == "tool/result" and e["name"] == "snap")

    done = results[0]["session"]
    killed = next(p.stem for p in ledgers
                  if p.stem in dead and made_on(p.stem) == str(nodes["node_tmp"]))
    (tmp_path / "more.jsonl").write_text(
        json.dumps({"id": "c1", "prompt": "and now?", "session": done}) + "\n"
        + json.dumps({"id": "c2", "prompt": "go on", "session": killed}) + "\n")
    again = subprocess.run(
        [sys.executable, "-m", "dsh", "batch", "more.jsonl", "-m", model, "--executor", "ray",
         "--results", "more-r.jsonl"], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""
    more = {x["id"]: x for x in lines(tmp_path / "more-r.jsonl")}
    assert (more["c1"]["session"], more["c1"]["outcome"], more["c1"]["output"]) == (
        done, "completed", "continued")
    assert (more["c2"]["session"], more["c2"]["outcome"], more["c2"]["output"]) == (
        killed, "completed", "done")
    for sid in (done, killed):
        events = lines(sessions / f"{sid}.jsonl")
        assert [e["turn"] for e in events if e["type"] == "turn/end"] == [1, 2]
        assert events[-1]["outcome"] == "completed"
        assert sum(1 for e in events if e["type"] == "user/message" and e.get("attachments")
                   ) == 1
    assert sorted(os.listdir(sessions / "attachments")) == sorted(
        {a for p in ledgers for a in re.findall(r'"sha256":"([0-9a-f]{64})"', p.read_text())})


# ------------------------------------------------------------------------------------------
# The shipping rules, without a cluster
# ------------------------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(40))


def _message(*blobs: bytes) -> bytes:
    refs = [{"sha256": hashlib.sha256(b).hexdigest(), "media_type": "image/png",
             "size": len(b), "name": "x.png"} for b in blobs]
    return (json.dumps({"v": 1, "type": "user/message", "seq": 0, "text": "x",
                        "source": "user", "attachments": refs}) + "\n").encode()


@given(blobs=st.lists(st.binary(max_size=64), max_size=4),
       junk=st.binary(max_size=80), cut=st.integers(0, 400))
@settings(max_examples=200, deadline=None)
def test_references_find_every_whole_line_reference_and_survive_junk(
        blobs: list[bytes], junk: bytes, cut: int) -> None:
    """Every reference on a whole line is found, in order; junk lines and a torn last line
    give none and never raise."""
    from dsh_ray.ship import references

    line = _message(*blobs)
    found = references(junk + b"\n" + line + line[:cut])
    want = [(hashlib.sha256(b).hexdigest(), len(b)) for b in blobs]
    assert found[:len(want)] == want
    torn = found[len(want):]
    assert torn in ([], want)  # the torn copy counts only when it is whole


def test_landing_stores_only_bytes_that_match_their_hash(tmp_path: Path) -> None:
    """The driver's side of shipping: a blob whose bytes match its hash is stored (0600,
    atomically); one altered in transit is refused and named, and so is a reference whose
    blob did not arrive; a hash naming another file is refused; the ledger is written
    whole either way."""
    from dsh_ray.ship import land

    good, altered, missing = PNG + b"good", PNG + b"altered", PNG + b"missing"
    sha = {b: hashlib.sha256(b).hexdigest() for b in (good, altered, missing)}
    hostile = json.dumps({"v": 1, "type": "user/message", "seq": 1, "text": "y",
                          "attachments": [{"sha256": "../../etc/shadow", "size": 3}]})
    ledger = _message(good, altered, missing) + hostile.encode() + b"\n"
    path = tmp_path / "s1.jsonl"
    problems = land(path, ledger, {sha[good]: good, sha[altered]: altered + b"!",
                                   "../../etc/passwd": good})
    assert path.read_bytes() == ledger
    stored = tmp_path / "attachments" / sha[good]
    assert stored.read_bytes() == good and stored.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path / "attachments")) == [sha[good]]
    assert sorted(os.listdir(tmp_path)) == ["attachments", "s1.jsonl"]
    assert any(sha[altered][:12] in p and "arrived altered" in p for p in problems), problems
    assert any("../../etc/pa" in p and "arrived altered" in p for p in problems), problems
    assert any(sha[missing][:12] in p and "did not arrive whole" in p for p in problems)
    assert any("invalid attachment hash '../../etc/shadow'" in p for p in problems), problems
    assert len(problems) == 4, problems
    assert land(tmp_path / "s2.jsonl", _message(good), {sha[good]: good}) == []


class _Handle:
    """Calls a :class:`dsh_ray.ship.LedgerSink` as its Ray actor handle is called
    (``handle.method.remote(...)``), in this process and in order, recording the order."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        handle = self

        class _Method:
            @staticmethod
            def remote(*args: Any) -> None:
                handle.calls.append(name)
                getattr(handle.sink, name)(*args)

        return _Method


def test_a_worker_ships_whole_lines_blobs_first_and_never_altered_bytes(
        tmp_path: Path) -> None:
    """The worker's side, against the real sink object: while the run lasts only whole lines
    go; an attachment's bytes go before the line that references it, once; a blob altered
    in the worker's store is not sent, and the driver names it as not arrived whole."""
    from dsh_ray.ship import Blobs
    from dsh_ray.ship import LedgerSink
    from dsh_ray.ship import Shipper
    from dsh_ray.ship import land

    local = tmp_path / "worker"
    local.mkdir()
    ok, bad = PNG + b"ok", PNG + b"bad"
    sha_ok, sha_bad = Blobs(local).put_attachment(ok), Blobs(local).put_attachment(bad)
    (local / "attachments" / sha_bad).write_bytes(PNG + b"tampered")
    path = local / "s.jsonl"
    first, second = _message(ok), _message(ok, bad)
    path.write_bytes(first + second[:10])  # a line being written
    handle = _Handle(LedgerSink())
    shipper = Shipper(handle, "s", path)
    shipper.flush()
    assert handle.calls == ["put_blob", "append"]
    assert bytes(handle.sink.ledgers["s"]) == first
    path.write_bytes(first + second)
    shipper.flush()
    assert handle.calls == ["put_blob", "append", "append"]  # ok's bytes not sent again
    data, blobs = handle.sink.take("s")
    assert data == first + second and blobs == {sha_ok: ok}
    driver = tmp_path / "driver"
    problems = land(driver / "s.jsonl", data, blobs)
    assert (driver / "attachments" / sha_ok).read_bytes() == ok
    assert not (driver / "attachments" / sha_bad).exists()
    assert len(problems) == 1 and sha_bad[:12] in problems[0], problems
