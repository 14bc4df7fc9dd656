// An agent on the Node openai SDK, as the integration tests drive it through postern.
// usage: node agent.js BASE_URL [--timeout SECS]
// Configured by the environment only: HTTPS_PROXY (agent:token@), NODE_EXTRA_CA_CERTS
// (postern's CA) and OPENAI_API_KEY. Node's fetch ignores HTTPS_PROXY, so the agent hands
// undici's EnvHttpProxyAgent (which reads it) to the SDK. Prints one JSON line like agent.py.
const OpenAI = require('openai');
const { EnvHttpProxyAgent } = require('undici');

const [base, ...rest] = process.argv.slice(2);
const timeout = rest[0] === '--timeout' ? rest[1] : undefined;
const client = new OpenAI({
  baseURL: base,
  ...(Number(timeout) ? { timeout: Number(timeout) * 1000 } : {}),
  fetchOptions: { dispatcher: new EnvHttpProxyAgent() },
});

client.chat.completions
  .create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] })
  .then((r) => console.log(JSON.stringify({ ok: true, id: r.id })))
  .catch((e) => {
    const out = { ok: false, exception: e.constructor.name };
    if (e instanceof OpenAI.APIError && e.status !== undefined) {
      // e.error is the envelope's "error" object, e.code its code.
      out.status = e.status;
      out.code = e.code ?? e.error?.code;
      out.retry = e.error?.retry;
      out.invocation_id = e.headers?.get?.('postern-invocation');
      out.should_retry = e.headers?.get?.('x-should-retry');
    }
    console.log(JSON.stringify(out));
  });
