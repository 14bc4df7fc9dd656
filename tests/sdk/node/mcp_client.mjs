// An MCP client on the official TypeScript SDK (streamable HTTP), for tests/it/mcp.rs.
//
// usage: node mcp_client.mjs URL SESSIONS
//
// Node's global fetch ignores HTTPS_PROXY (Node 20, also with NODE_USE_ENV_PROXY=1), so the
// agent hands it the proxy from the environment with undici's EnvHttpProxyAgent, as
// docs/mcp.md says; postern's CA comes from NODE_EXTRA_CA_CERTS. Runs SESSIONS sessions one
// after another, each `initialize` then `tools/call record(n=1)`; prints one JSON line per
// session: the tool's text and whether it was an error, or the error.
import { EnvHttpProxyAgent, setGlobalDispatcher } from "undici";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

setGlobalDispatcher(new EnvHttpProxyAgent());
process.removeAllListeners("warning");

const [url, sessions] = [process.argv[2], Number(process.argv[3])];
for (let i = 0; i < sessions; i++) {
  const client = new Client({ name: "postern-test", version: "0" });
  try {
    const transport = new StreamableHTTPClientTransport(new URL(url));
    await client.connect(transport);
    const result = await client.callTool({ name: "record", arguments: { n: 1 } });
    const text = result.content.filter((c) => c.type === "text").map((c) => c.text);
    await transport.terminateSession();
    await client.close();
    console.log(JSON.stringify({ text, is_error: Boolean(result.isError) }));
  } catch (e) {
    console.log(JSON.stringify({ error: `${e?.name}: ${e?.message} ${e?.cause?.code ?? ""}` }));
    await client.close().catch(() => {});
  }
}
