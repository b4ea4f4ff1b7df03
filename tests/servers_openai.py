"""Loopback servers and protocol-faithful bodies for OpenAI-side reasoning (issue 17).

:class:`CheckingServer` is a :class:`tests.servers.ScriptedServer` that also *validates* each
request the way the real API does before answering from its script, remembering what it sent
before (its reasoning) — so a test fails when the adapter's replay drops or alters reasoning:

* :func:`responses_rules`: the Responses API with ``store: false``: every reasoning item sent
  back must carry the id and the exact ``encrypted_content`` the server produced, a
  ``function_call`` (and its output) whose response had a reasoning item needs that item
  before it, a ``function_call_output`` needs its ``function_call``. The messages are the
  API's own (``Item 'fc_…' of type 'function_call' was provided without its required
  'reasoning' item: 'rs_…'.``).
* :func:`deepseek_rules`: DeepSeek's thinking mode: an assistant message that made tool calls
  must carry back its ``reasoning_content`` (``The `reasoning_content` in the thinking mode
  must be passed back to the API.``).
* :func:`no_reasoning_rules`: the deepseek-reasoner guide's rule: ``reasoning_content`` in the
  input messages is a 400.

The bodies follow the providers' published examples: the Responses API reference's streaming
events (``response.created`` … ``response.completed``, each with a ``sequence_number``) and
reasoning items (``rs_…`` ids, ``summary_text`` parts, ``encrypted_content``), and DeepSeek's
reasoning streams (a role chunk with ``reasoning_content: ""``, reasoning deltas with
``content: null``, then content deltas, a usage chunk with ``prompt_cache_hit_tokens`` and
``completion_tokens_details.reasoning_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from tests.servers import Received
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import _Handler
from tests.servers import sse

#: A rule: given the server's memory and a request body, a 400 reply or None (accepted).
Rule = Callable[[dict[str, Any], Any], "Reply | None"]


def bad_request(message: str, param: str | None = "input") -> Reply:
    return Reply(400, {"error": {"message": message, "type": "invalid_request_error",
                                 "param": param, "code": None}})


class _CheckingHandler(_Handler):
    server: Any

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        owner: CheckingServer = self.server.owner
        with owner.lock:
            owner.received.append(Received(self.command, self.path,
                                           {k.lower(): v for k, v in self.headers.items()},
                                           body, self.client_address[1]))
            owner.raw.append(raw)
            reply = owner.rule(owner.memory, body)
            if reply is None:
                reply = owner.replies.popleft() if owner.replies else None
                if reply is not None:
                    owner.learn(owner.memory, reply)
            else:
                owner.rejected.append(reply)
        if reply is None:
            reply = Reply(status=418, body={"error": {"message": "test script exhausted"}})
        try:
            self._reply(reply)
        except OSError:
            self.close_connection = True


class CheckingServer(ScriptedServer):
    """A scripted server that checks every request with ``rule`` before answering, and
    remembers what it answered with ``learn`` (both see ``memory``). ``raw`` keeps each
    request's bytes; ``rejected`` the 400s the rule gave."""

    def __init__(self, rule: Rule, learn: Callable[[dict[str, Any], Reply], None]) -> None:
        super().__init__()
        self._httpd.RequestHandlerClass = _CheckingHandler
        self.rule = rule
        self.learn = learn
        self.memory: dict[str, Any] = {}
        self.raw: list[bytes] = []
        self.rejected: list[Reply] = []

    def __enter__(self) -> CheckingServer:
        super().__enter__()
        return self


def _events(reply: Reply) -> list[dict[str, Any]]:
    """The JSON data of a scripted SSE reply, or its JSON body as one pseudo event."""
    if reply.chunks is None:
        return [{"type": "body", "response": reply.body}] if isinstance(reply.body, dict) else []
    out = []
    for block in b"".join(reply.chunks).decode("utf-8", "replace").split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                try:
                    value = json.loads(line[6:])
                except ValueError:
                    continue
                if isinstance(value, dict):
                    out.append(value)
    return out


# -- the Responses API ------------------------------------------------------------------------


def responses_learn(memory: dict[str, Any], reply: Reply) -> None:
    """Remember each reasoning item sent (id -> encrypted content) and, for each function
    call, the reasoning item of its response (call_id -> (fc id, rs id))."""
    output: list[Any] = []
    for e in _events(reply):
        if e.get("type") in ("body", "response.completed") and isinstance(e.get("response"), dict):
            output = e["response"].get("output") or output
    reasoning = memory.setdefault("reasoning", {})
    calls = memory.setdefault("calls", {})
    last_rs = None
    for item in output:  # hostile replies (no id, no call_id) teach nothing
        if item.get("type") == "reasoning" and "id" in item:
            reasoning[item["id"]] = item.get("encrypted_content")
            last_rs = item["id"]
        elif item.get("type") == "function_call" and "call_id" in item:
            calls[item["call_id"]] = (item.get("id"), last_rs)


def responses_rules(memory: dict[str, Any], body: Any) -> Reply | None:
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return bad_request("Missing required parameter: 'input'.")
    if body.get("store") is not False:
        return None  # stored server-side: items may be referred to by id (not modelled here)
    known = memory.get("reasoning", {})
    calls = memory.get("calls", {})
    seen_rs: list[str] = []  # reasoning items since the last user message
    called: set[str] = set()
    for item in body["input"]:
        kind = item.get("type", "message")
        if kind == "reasoning":
            rid = item.get("id")
            if rid not in known:
                return bad_request(f"Item with id '{rid}' not found. Items are not persisted "
                                   "when `store` is set to false. Try again with `store` set "
                                   "to true, or remove this item from your input.")
            if item.get("encrypted_content") != known[rid]:
                return bad_request(f"The encrypted content for item {rid} could not be "
                                   "verified.")
            seen_rs.append(rid)
        elif kind == "message" and item.get("role") == "user":
            seen_rs = []
        elif kind == "function_call":
            fc_id, rs = calls.get(item.get("call_id"), (None, None))
            if rs is not None and rs not in seen_rs:
                return bad_request(f"Item '{fc_id}' of type 'function_call' was provided "
                                   f"without its required 'reasoning' item: '{rs}'.")
            called.add(item.get("call_id"))
        elif kind == "function_call_output":
            cid = item.get("call_id")
            if cid not in called:
                return bad_request(f"No tool call found for function call output with call_id "
                                   f"{cid}.")
            rs = calls.get(cid, (None, None))[1]
            if rs is not None and rs not in seen_rs:
                return bad_request(f"Item '{calls[cid][0]}' of type 'function_call' was "
                                   f"provided without its required 'reasoning' item: '{rs}'.")
    return None


def responses_server() -> CheckingServer:
    return CheckingServer(responses_rules, responses_learn)


#: An output item for the builders: ("reasoning", id, [summary parts], encrypted) |
#: ("message", id, [text deltas]) | ("function_call", id, call_id, name, [argument deltas]).
Item = tuple[Any, ...]


def _full(item: Item) -> dict[str, Any]:
    if item[0] == "reasoning":
        _, rid, summary, encrypted = item
        out: dict[str, Any] = {"id": rid, "type": "reasoning",
                               "summary": [{"type": "summary_text", "text": s} for s in summary]}
        if encrypted is not None:
            out["encrypted_content"] = encrypted
        return out
    if item[0] == "message":
        _, mid, deltas = item
        return {"id": mid, "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                             "text": "".join(deltas)}]}
    _, fid, call_id, name, deltas = item
    return {"id": fid, "type": "function_call", "status": "completed",
            "arguments": "".join(deltas), "call_id": call_id, "name": name}


def _response(status: str, output: list[dict[str, Any]], usage: tuple[int, int, int, int] | None,
              model: str) -> dict[str, Any]:
    resp: dict[str, Any] = {
        "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
        "object": "response", "created_at": 1741476542, "status": status,
        "background": False, "error": None, "incomplete_details": None, "instructions": None,
        "max_output_tokens": None, "model": model, "output": output,
        "parallel_tool_calls": True, "previous_response_id": None,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False,
        "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
        "tools": [], "top_p": 1.0, "truncation": "disabled", "usage": None, "user": None,
        "metadata": {},
    }
    if usage is not None:
        inp, cached, out, reasoning = usage
        resp["usage"] = {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached},
                         "output_tokens": out,
                         "output_tokens_details": {"reasoning_tokens": reasoning},
                         "total_tokens": inp + out}
    return resp


def responses_body(items: Sequence[Item], usage: tuple[int, int, int, int] = (36, 0, 87, 64),
                   model: str = "o4-mini-2025-04-16") -> dict[str, Any]:
    """A non-streamed ``response`` object (status completed) with these output items."""
    return _response("completed", [_full(i) for i in items], usage, model)


def responses_events(items: Sequence[Item], usage: tuple[int, int, int, int] = (36, 0, 87, 64),
                     model: str = "o4-mini-2025-04-16", end: str = "response.completed",
                     final_output: bool = True) -> list[bytes]:
    """A streamed response: ``response.created``, ``response.in_progress``, then per item
    ``output_item.added``, its parts and deltas, ``output_item.done``; then ``end`` with the
    whole response (``final_output=False``: with an empty output list, as some servers do)."""
    seq = 0
    out: list[bytes] = []

    def ev(kind: str, **fields: Any) -> None:
        nonlocal seq
        out.append(sse({"type": kind, "sequence_number": seq, **fields}, kind))
        seq += 1

    ev("response.created", response=_response("in_progress", [], None, model))
    ev("response.in_progress", response=_response("in_progress", [], None, model))
    for index, item in enumerate(items):
        full = _full(item)
        iid = full["id"]
        if item[0] == "reasoning":
            ev("response.output_item.added", output_index=index,
               item={"id": iid, "type": "reasoning", "summary": []})
            for s_index, text in enumerate(item[2]):
                part = {"type": "summary_text", "text": ""}
                ev("response.reasoning_summary_part.added", item_id=iid, output_index=index,
                   summary_index=s_index, part=part)
                for i in range(0, len(text), 7):  # the summary streams in small pieces
                    ev("response.reasoning_summary_text.delta", item_id=iid,
                       output_index=index, summary_index=s_index, delta=text[i:i + 7])
                ev("response.reasoning_summary_text.done", item_id=iid, output_index=index,
                   summary_index=s_index, text=text)
                ev("response.reasoning_summary_part.done", item_id=iid, output_index=index,
                   summary_index=s_index, part={"type": "summary_text", "text": text})
        elif item[0] == "message":
            ev("response.output_item.added", output_index=index,
               item={"id": iid, "type": "message", "status": "in_progress", "role": "assistant",
                     "content": []})
            ev("response.content_part.added", item_id=iid, output_index=index, content_index=0,
               part={"type": "output_text", "annotations": [], "logprobs": [], "text": ""})
            for d in item[2]:
                ev("response.output_text.delta", item_id=iid, output_index=index,
                   content_index=0, delta=d, logprobs=[])
            text = "".join(item[2])
            ev("response.output_text.done", item_id=iid, output_index=index, content_index=0,
               text=text, logprobs=[])
            ev("response.content_part.done", item_id=iid, output_index=index, content_index=0,
               part={"type": "output_text", "annotations": [], "logprobs": [], "text": text})
        else:
            ev("response.output_item.added", output_index=index,
               item={**full, "status": "in_progress", "arguments": ""})
            for d in item[4]:
                ev("response.function_call_arguments.delta", item_id=iid, output_index=index,
                   delta=d)
            ev("response.function_call_arguments.done", item_id=iid, output_index=index,
               arguments=full["arguments"])
        ev("response.output_item.done", output_index=index, item=full)
    output = [_full(i) for i in items] if final_output else []
    status = "completed" if end == "response.completed" else "incomplete"
    final = _response(status, output, usage, model)
    if status == "incomplete":
        final["incomplete_details"] = {"reason": "max_output_tokens"}
    ev(end, response=final)
    return out


# -- chat completions with reasoning_content ---------------------------------------------------


def deepseek_learn(memory: dict[str, Any], reply: Reply) -> None:
    """Remember the reasoning_content of every answer that made tool calls (by call id)."""
    reasoning: list[str] = []
    seen = False
    call_ids: list[str] = []
    for e in _events(reply):
        if e.get("type") == "body":
            msg = e["response"].get("choices", [{}])[0].get("message", {})
            deltas = [msg]
        else:
            deltas = [c.get("delta", {}) for c in e.get("choices") or ()]
        for d in deltas:
            for field in ("reasoning_content", "reasoning"):
                if isinstance(d.get(field), str):
                    reasoning.append(d[field])
                    seen = True
                    break
            call_ids += [tc["id"] for tc in d.get("tool_calls") or () if tc.get("id")]
    for cid in call_ids:
        memory.setdefault("calls", {})[cid] = "".join(reasoning) if seen else None


def deepseek_rules(memory: dict[str, Any], body: Any) -> Reply | None:
    """DeepSeek's thinking mode: a tool-call turn's reasoning_content must come back."""
    calls = memory.get("calls", {})
    for i, m in enumerate(body.get("messages") or ()):
        if m.get("role") != "assistant":
            continue
        for tc in m.get("tool_calls") or ():
            expected = calls.get(tc.get("id"))
            if expected is not None and m.get("reasoning_content") != expected:
                if "reasoning_content" not in m:
                    return bad_request("The `reasoning_content` in the thinking mode must be "
                                       "passed back to the API.", None)
                return bad_request(f"Invalid `reasoning_content` in the assistant message at "
                                   f"message index {i}", None)
    return None


def no_reasoning_rules(memory: dict[str, Any], body: Any) -> Reply | None:
    """The deepseek-reasoner guide: reasoning_content in the input messages is a 400."""
    for m in body.get("messages") or ():
        if "reasoning_content" in m:
            return bad_request("reasoning_content is not allowed in the input messages "
                               "(deepseek-reasoner multi-round conversation)", None)
    return None


def reasoning_chunks(reasoning: Sequence[str] = (), text: Sequence[str] = (),
                     calls: Sequence[tuple[str, str, Sequence[str]]] = (),
                     usage: tuple[int, int, int, int] = (64, 0, 120, 96),
                     field: str = "reasoning_content", model: str = "deepseek-reasoner",
                     ) -> list[bytes]:
    """A DeepSeek-style chat.completion.chunk stream: the role chunk (``reasoning_content``
    empty, ``content`` null), reasoning deltas, content deltas, tool-call deltas, the finish
    chunk, the usage chunk, ``[DONE]``. ``field="reasoning"``: vLLM 0.11+'s name."""
    base = {"id": "0f3b7d1e-6a2c-4c1e-9d0e-5b9a8e4f2c10", "object": "chat.completion.chunk",
            "created": 1738000000, "model": model,
            "system_fingerprint": "fp_7e73fd9a08_prod0225"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({**base, "choices": [choice]})

    out = [chunk({"role": "assistant", "content": None, field: ""})]
    out += [chunk({"content": None, field: r}) for r in reasoning]
    out += [chunk({"content": t, field: None}) for t in text]
    for i, (cid, name, fragments) in enumerate(calls):
        head = {"index": i, "id": cid, "type": "function"}
        out.append(chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]})
                for f in fragments]
    out.append(chunk({"content": "", field: None}, "tool_calls" if calls else "stop"))
    prompt, hit, completion, thinking = usage
    out.append(sse({**base, "choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": hit},
        "completion_tokens_details": {"reasoning_tokens": thinking},
        "prompt_cache_hit_tokens": hit, "prompt_cache_miss_tokens": prompt - hit}}))
    out.append(b"data: [DONE]\n\n")
    return out


def reasoning_completion(reasoning: str | None, text: str | None = None,
                         calls: Sequence[tuple[str, str, str]] = (),
                         usage: tuple[int, int, int, int] = (64, 0, 120, 96),
                         model: str = "deepseek-reasoner") -> dict[str, Any]:
    """A non-streamed chat.completion with ``message.reasoning_content``."""
    message: dict[str, Any] = {"role": "assistant", "content": text,
                               "reasoning_content": reasoning}
    if calls:
        message["tool_calls"] = [{"index": i, "id": cid, "type": "function",
                                  "function": {"name": name, "arguments": args}}
                                 for i, (cid, name, args) in enumerate(calls)]
    prompt, hit, completion, thinking = usage
    return {"id": "0f3b7d1e-6a2c-4c1e-9d0e-5b9a8e4f2c10", "object": "chat.completion",
            "created": 1738000000, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": hit},
                      "completion_tokens_details": {"reasoning_tokens": thinking},
                      "prompt_cache_hit_tokens": hit, "prompt_cache_miss_tokens": prompt - hit},
            "system_fingerprint": "fp_7e73fd9a08_prod0225"}


def deepseek_server(rule: Rule = deepseek_rules) -> CheckingServer:
    return CheckingServer(rule, deepseek_learn)
