// One MCP session with the official TypeScript SDK (copied next to its node_modules and
// run by tests/test_mcp_sdk_matrix.py): exec, get, a resource read, subscribe/unsubscribe
// with an update in between, and a cancel; prints one JSON line of what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [python, marker] = process.argv.slice(2);
const seen = {};
const updates = [];
const texts = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const transport = new StdioClientTransport({
  command: python,
  args: ["-m", "shoal_mcp.facade"],
  env: process.env,
  stderr: "inherit",
});
const client = new Client({ name: "shoal-ts-test", version: "0" }, { capabilities: {} });
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (note) => {
  updates.push(note.params.uri);
});
await client.connect(transport);
seen.server = client.getServerVersion();

const ran = await client.callTool({ name: "shoal_exec", arguments: { command: "echo hi" } });
seen.exec_error = ran.isError;
seen.exec_text = texts(ran);
seen.exec_types = ran.content.map((c) => c.type);
const got = await client.callTool({ name: "shoal_get", arguments: { ref: "out:1", path: ".out" } });
seen.get_text = texts(got);
const read = await client.readResource({ uri: "shoal://out/1?format=render" });
seen.read = read.contents;

const started = await client.callTool({
  name: "shoal_exec",
  arguments: { command: "sleep 0.5; echo bg", background: true },
});
const taskUri = texts(started).join(" ").match(/shoal:\/\/task\/[0-9]+/)[0];
await client.subscribeResource({ uri: taskUri });
for (let i = 0; i < 400 && !updates.includes(taskUri); i++) await sleep(50);
await client.unsubscribeResource({ uri: taskUri });
seen.updates = updates.length;

// Cancel: aborting the request makes the SDK send notifications/cancelled.
const abort = new AbortController();
const pending = client
  .callTool({ name: "shoal_exec", arguments: { command: `sleep ${marker}` } }, undefined, {
    signal: abort.signal,
  })
  .catch((err) => String(err));
await sleep(1000);
abort.abort("test");
seen.cancelled = await pending;
const after = await client.callTool({ name: "shoal_exec", arguments: { command: "echo after-cancel" } });
seen.after_cancel = texts(after);
await client.close();
console.log(JSON.stringify(seen));
