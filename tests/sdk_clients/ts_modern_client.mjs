// One MCP 2026-07-28 session with the newest TypeScript SDK (v2, @modelcontextprotocol/client;
// copied next to its node_modules and run by tests/test_mcp_sdk_matrix.py): the
// server/discover probe (mode auto), a call, an approval accepted and one declined through
// its elicitation handler; prints one JSON line of what it saw.
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const [python] = process.argv.slice(2);
const seen = { asked: [] };
const answers = ["once", "decline"];
const texts = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text);

const transport = new StdioClientTransport({
  command: python,
  args: ["-m", "shoal_mcp.facade"],
  env: process.env,
  stderr: "inherit",
});
const client = new Client(
  { name: "shoal-ts2-test", version: "0" },
  { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: "auto" } },
);
client.setRequestHandler("elicitation/create", async (request) => {
  seen.asked.push(request.params.message);
  const answer = answers.shift();
  if (answer === "decline") return { action: "decline" };
  return { action: "accept", content: { decision: answer } };
});
await client.connect(transport);
seen.protocol = client.getNegotiatedProtocolVersion?.() ?? null;
seen.server = client.getServerVersion()?.name ?? null;
seen.tools = (await client.listTools()).tools.map((t) => t.name).sort();
const ran = await client.callTool({ name: "shoal_exec", arguments: { command: "echo hi" } });
seen.exec_text = texts(ran);
const approved = await client.callTool({
  name: "shoal_exec",
  arguments: { command: "basename /x/ts-approved" },
});
seen.approved = { isError: approved.isError ?? false, text: texts(approved) };
const declined = await client.callTool({
  name: "shoal_exec",
  arguments: { command: "basename /x/ts-declined" },
});
seen.declined = { isError: declined.isError ?? false, text: texts(declined) };
await client.close();
console.log(JSON.stringify(seen));
