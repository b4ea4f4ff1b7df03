// A second, independent ACP client for `dsh acp`: the official TypeScript SDK
// (@agentclientprotocol/sdk) over the child's stdio (ndJsonStream). It runs
// initialize, session/new, a prompt whose tool call is allowed, one whose tool
// call is rejected, a cancelled prompt, then SIGKILLs dsh and loads the session
// in a new process. Each step prints one JSON line; tests/test_acp_js.py asserts.
//
// usage: node acp_client.mjs PYTHON CONFIG WORKSPACE
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const [python, config, workspace] = process.argv.slice(2);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

let answer = "allow";
let updates = [];

function start() {
  const child = spawn(python, ["-m", "dsh", "--config", config, "acp"], {
    cwd: workspace,
    stdio: ["pipe", "pipe", "inherit"],
  });
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  const app = acp
    .client()
    .onRequest("session/request_permission", async ({ params }) => {
      out({ step: "asked", toolCallId: params.toolCall.toolCallId, title: params.toolCall.title,
            kinds: params.options.map((o) => o.kind) });
      return { outcome: { outcome: "selected", optionId: answer } };
    })
    .onNotification("session/update", async ({ params }) => {
      updates.push(params.update);
    });
  const conn = app.connect(stream);
  return { child, conn };
}

const kinds = () => updates.map((u) => u.sessionUpdate).filter((k) => k !== "available_commands_update");
const text = (kind) => updates.filter((u) => u.sessionUpdate === kind).map((u) => u.content.text).join("");

async function main() {
  let { child, conn } = start();
  const agent = conn.agent;
  const init = await agent.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION,
                                                   clientCapabilities: {} });
  out({ step: "initialize", protocolVersion: init.protocolVersion,
        loadSession: init.agentCapabilities.loadSession });
  const created = await agent.request("session/new", { cwd: workspace, mcpServers: [] });
  const sessionId = created.sessionId;
  out({ step: "new", sessionId, modes: created.modes.availableModes.map((m) => m.id),
        current: created.modes.currentModeId });

  const ask = (t) => agent.request("session/prompt", { sessionId, prompt: [{ type: "text", text: t }] });
  updates = [];
  let res = await ask("write the notes");
  const done = updates.find((u) => u.sessionUpdate === "tool_call_update" && u.status !== "in_progress");
  const diff = (done.content || []).find((c) => c.type === "diff");
  out({ step: "allow", stopReason: res.stopReason, kinds: kinds(), text: text("agent_message_chunk"),
        status: done.status, diff: diff && { path: diff.path, oldText: diff.oldText, newText: diff.newText } });

  answer = "reject";
  updates = [];
  res = await ask("write the other");
  out({ step: "reject", stopReason: res.stopReason,
        statuses: updates.filter((u) => u.sessionUpdate === "tool_call_update").map((u) => u.status) });

  updates = [];
  const slow = ask("take your time");
  await agent.notify("session/cancel", { sessionId });
  res = await slow;
  out({ step: "cancel", stopReason: res.stopReason });

  child.kill("SIGKILL");
  await new Promise((resolve) => child.once("exit", resolve));
  conn.close();

  ({ child, conn } = start());
  updates = [];
  await conn.agent.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
  const loaded = await conn.agent.request("session/load", { sessionId, cwd: workspace, mcpServers: [] });
  out({ step: "load", kinds: kinds(), users: updates.filter((u) => u.sessionUpdate === "user_message_chunk").map((u) => u.content.text),
        current: loaded.modes.currentModeId });
  child.stdin.end();
  const code = await new Promise((resolve) => child.once("exit", resolve));
  conn.close();
  out({ step: "exit", code });
}

main().catch((err) => {
  out({ step: "error", message: String(err && err.message || err), data: err && err.data });
  process.exit(1);
});
