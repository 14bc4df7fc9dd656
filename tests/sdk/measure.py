#!/usr/bin/env python3
"""Part A of issue 19: what each vendor SDK changes between its first try and its own
retries. Starts capture.py per (SDK call, origin behaviour), drives the SDK with its
default retry settings, and prints per run the headers that differ between tries and
those that stay. usage: measure.py [OUT_DIR]"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Headers whose values are printed in full (they change meaning, or vary).
MEANING = {"amz-sdk-request", "x-amz-date", "stripe-account", "openai-organization", "openai-project", "anthropic-version",
           "anthropic-beta", "stripe-version", "idempotency-key", "authorization"}


def start_capture(mode, path):
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "capture.py"), mode, path],
                         stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline())
    return p, port


def py_openai_chat(base, timeout):
    import openai
    kw = {"timeout": timeout} if timeout else {}
    c = openai.OpenAI(api_key="sk-test", base_url=base + "/v1", organization="org-A",
                      project="proj-A", **kw)
    c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])


def py_openai_responses(base, timeout):
    import openai
    kw = {"timeout": timeout} if timeout else {}
    c = openai.OpenAI(api_key="sk-test", base_url=base + "/v1", **kw)
    c.responses.create(model="gpt-4o-mini", input="hi")


def py_anthropic(base, timeout):
    import anthropic
    kw = {"timeout": timeout} if timeout else {}
    c = anthropic.Anthropic(api_key="sk-ant-test", base_url=base, **kw)
    c.messages.create(model="claude-sonnet-4-5", max_tokens=16,
                      messages=[{"role": "user", "content": "hi"}],
                      extra_headers={"anthropic-beta": "tools-2024-04-04"})


def py_stripe_global(base, timeout):
    import stripe
    stripe.api_key = "sk_test_x"
    stripe.api_base = base
    if timeout:
        from stripe import _http_client
        stripe.default_http_client = _http_client.new_default_http_client(timeout=timeout)
    stripe.Customer.create(email="a@example.com", stripe_account="acct_A")


def py_stripe_client(base, timeout):
    import stripe
    kw = {}
    if timeout:
        from stripe import _http_client
        kw["http_client"] = _http_client.new_default_http_client(timeout=timeout)
    c = stripe.StripeClient("sk_test_x", base_addresses={"api": base}, stripe_account="acct_A",
                            **kw)
    c.customers.create(params={"email": "a@example.com"})


def py_stripe_resend(base, timeout):
    """The agent's own resend: a second call with the same key after the first failed."""
    import stripe
    stripe.api_key = "sk_test_x"
    stripe.api_base = base
    stripe.max_network_retries = 0
    for _ in range(2):
        try:
            stripe.Customer.create(email="a@example.com", stripe_account="acct_A",
                                   idempotency_key="agent-key-1")
        except stripe.StripeError:
            pass
    stripe.max_network_retries = 2


NODE = r"""
const OpenAI = require('openai');
const base = process.argv[1]; const timeout = Number(process.argv[2]) || undefined;
const c = new OpenAI({apiKey: 'sk-test', baseURL: base + '/v1', organization: 'org-A',
  project: 'proj-A', ...(timeout ? {timeout: timeout * 1000} : {})});
c.chat.completions.create({model: 'gpt-4o-mini', messages: [{role: 'user', content: 'hi'}]})
  .then(() => process.exit(0), e => { console.error(String(e)); process.exit(1); });
"""


def node_openai_chat(base, timeout):
    r = subprocess.run(["node", "-e", NODE, base, str(timeout or 0)],
                       cwd=os.path.join(HERE, "node"), capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr else "failed")


def py_boto3_invoke_model(base, timeout):
    import boto3
    from botocore.config import Config
    cfg = Config(read_timeout=timeout) if timeout else None
    c = boto3.client("bedrock-runtime", endpoint_url=base, region_name="us-east-1",
                     aws_access_key_id="postern:aws", aws_secret_access_key="filler", config=cfg)
    c.invoke_model(modelId="anthropic.claude-3-haiku-20240307-v1:0", body=b'{"prompt":"hi"}',
                   contentType="application/json")


def py_boto3_put_object(base, timeout):
    import boto3
    from botocore.config import Config
    cfg = Config(read_timeout=timeout, s3={"addressing_style": "path"}) if timeout else \
        Config(s3={"addressing_style": "path"})
    c = boto3.client("s3", endpoint_url=base, region_name="us-east-1",
                     aws_access_key_id="postern:aws", aws_secret_access_key="filler", config=cfg)
    c.put_object(Bucket="b", Key="k", Body=b"hello")


NODE_AWS = r"""
const {BedrockRuntimeClient, InvokeModelCommand} = require('@aws-sdk/client-bedrock-runtime');
// HTTP/1.1 (the client's default handler is HTTP/2, which capture.py does not speak);
// retries live in the client's middleware, not in the handler.
const {NodeHttpHandler} = require('@smithy/node-http-handler');
const base = process.argv[1]; const timeout = Number(process.argv[2]) || undefined;
const c = new BedrockRuntimeClient({region: 'us-east-1', endpoint: base,
  credentials: {accessKeyId: 'postern:aws', secretAccessKey: 'filler'},
  requestHandler: new NodeHttpHandler(timeout ? {requestTimeout: timeout * 1000} : {})});
c.send(new InvokeModelCommand({modelId: 'anthropic.claude-3-haiku-20240307-v1:0',
  body: '{"prompt":"hi"}', contentType: 'application/json'}))
  .then(() => process.exit(0), e => { console.error(String(e)); process.exit(1); });
"""


def node_aws_invoke_model(base, timeout):
    r = subprocess.run(["node", "-e", NODE_AWS, base, str(timeout or 0)],
                       cwd=os.path.join(HERE, "node"), capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr else "failed")


CALLS = [("python openai chat.completions", py_openai_chat),
         ("python openai responses", py_openai_responses),
         ("python anthropic messages", py_anthropic),
         ("python stripe Customer.create", py_stripe_global),
         ("python stripe StripeClient.customers.create", py_stripe_client),
         ("node openai chat.completions", node_openai_chat),
         ("python stripe agent resend (2 calls, same key, 0 SDK retries)", py_stripe_resend),
         ("python boto3 bedrock-runtime invoke_model", py_boto3_invoke_model),
         ("python boto3 s3 put_object", py_boto3_put_object),
         ("node aws-sdk v3 bedrock-runtime InvokeModel", node_aws_invoke_model)]
MODES = [("500", None), ("close", None), ("stall:5", 1.0)]


def diff(reqs):
    tries = [[(n.lower(), v) for n, v in r["headers"]] for r in reqs]
    names = []
    for t in tries:
        for n, _ in t:
            if n not in names:
                names.append(n)
    varies, stays = [], []
    for n in names:
        vals = [tuple(v for k, v in t if k == n) for t in tries]
        (stays if len(set(vals)) == 1 else varies).append((n, vals))
    return varies, stays


def run_one(label, base, timeout):
    fn = dict(CALLS)[label]
    try:
        fn(base, float(timeout) or None)
        print("no error")
    except Exception as e:  # the SDK's own exception after its retries
        print(f"{type(e).__name__}: {str(e)[:80]}")


def main():
    if sys.argv[1:2] == ["--one"]:
        return run_one(*sys.argv[2:5])
    only = os.environ.get("MEASURE_ONLY")
    calls = [c for c in CALLS if not only or only in c[0]]
    out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    report = []
    for label, fn in calls:
        for mode, timeout in MODES:
            path = os.path.join(out_dir, f"{label.replace(' ', '_')}.{mode}.jsonl")
            open(path, "w").close()
            proc, port = start_capture(mode, path)
            t0 = time.time()
            # A fresh process per run: SDK state (Stripe's telemetry) must not leak between runs.
            one = subprocess.run([sys.executable, "-W", "ignore", __file__, "--one", label,
                                  f"http://127.0.0.1:{port}", str(timeout or 0)],
                                 capture_output=True, text=True)
            err = (one.stdout.strip() or one.stderr.strip()[-200:]).replace("\n", " ")
            took = time.time() - t0
            proc.kill()
            reqs = [json.loads(l) for l in open(path)]
            varies, stays = diff(reqs)
            report.append({"sdk": label, "mode": mode, "tries": len(reqs), "seconds": round(took, 1),
                           "error": err, "order": [n for n, _ in reqs[0]["headers"]] if reqs else [],
                           "varies": varies, "stays": stays,
                           "bodies_same": len({r["body"] for r in reqs}) <= 1})
            print(f"== {label} | origin {mode} | {len(reqs)} tries in {took:.1f}s | {err}")
            for n, vals in varies:
                print(f"   VARIES {n}: {' | '.join(','.join(v) or '<absent>' for v in vals)}")
            print("   stays: " + ", ".join(
                f"{n}={vals[0][0]}" if n in MEANING or n.startswith("x-stainless") else n
                for n, vals in stays if vals[0]))
            print(f"   body identical across tries: {report[-1]['bodies_same']}")
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("captures in", out_dir)


if __name__ == "__main__":
    main()
