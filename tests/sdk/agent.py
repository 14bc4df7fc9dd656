#!/usr/bin/env python3
"""An agent on a vendor SDK, as the integration tests drive it through postern.

usage: agent.py openai|openai-responses|anthropic|stripe BASE_URL [--timeout SECS]
                [--key IDEMPOTENCY_KEY] [--stripe-account ACCT] [--stream] [--calls N]

--stream (openai): a streamed chat completion; the line adds the text read ("text", also on
a failure mid-stream) and postern's Postern-Replayed header ("replayed").

--calls N (openai): N calls one after another in this process, one line each; the first
failure ends the run (back to back, a rate limit is met whatever the machine's speed).

Configured only by the environment an agent gets: HTTPS_PROXY (with agent:token@),
SSL_CERT_FILE (postern's bundle) and the SDK's key variable (OPENAI_API_KEY,
ANTHROPIC_API_KEY, STRIPE_API_KEY). Retry settings stay the SDK's defaults. One call; prints
one JSON line: {"ok": true, "id": ...} or {"ok": false, "exception": ..., "status": ...,
"code": ..., "retry": ..., "invocation_id": ...}, code and retry read from postern's envelope
through the SDK's own exception.
"""
import argparse
import json
import os
import sys


def args():
    p = argparse.ArgumentParser()
    p.add_argument("sdk")
    p.add_argument("base")
    p.add_argument("--timeout", type=float)
    p.add_argument("--key")
    p.add_argument("--stripe-account")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--calls", type=int, default=1)
    return p.parse_args()


def envelope_of(response):
    """postern's envelope from an error response the SDK raised on, or {} if not one."""
    try:
        body = response.json()
    except Exception:
        return {}
    return body if isinstance(body, dict) and "invocation_id" in body else {}


def stainless_failure(e):
    """OpenAI and Anthropic raise APIStatusError (.status_code, .response, .body) for a status,
    APIConnectionError/APITimeoutError without a response."""
    out = {"ok": False, "exception": type(e).__name__}
    response = getattr(e, "response", None)
    status = getattr(e, "status_code", None)
    if status is not None and response is not None:
        out["status"] = status
        env = envelope_of(response)
        err = env.get("error", {})
        # openai puts the envelope's "error" object into e.body and its code into e.code.
        out["code"] = err.get("code") or getattr(e, "code", None)
        out["retry"] = err.get("retry")
        out["invocation_id"] = env.get("invocation_id") or response.headers.get("postern-invocation")
        out["should_retry"] = response.headers.get("x-should-retry")
    return out


def run_openai(a, responses):
    import openai
    kw = {"base_url": a.base}
    if a.timeout:
        kw["timeout"] = a.timeout
    client = openai.OpenAI(**kw)  # api key from OPENAI_API_KEY
    extra = {"extra_headers": {"Idempotency-Key": a.key}} if a.key else {}
    if a.stream:
        return stream_openai(client, openai, extra)
    try:
        if responses:
            r = client.responses.create(model="gpt-4o-mini", input="hi", **extra)
        else:
            r = client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], **extra)
        return {"ok": True, "id": r.id}
    except openai.APIError as e:
        return stainless_failure(e)


def stream_openai(client, openai, extra):
    """A streamed chat completion, read to its end (or until the SDK gives up)."""
    text = []
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True, **extra)
        replayed = raw.headers.get("postern-replayed")
        for chunk in raw.parse():
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
        return {"ok": True, "text": "".join(text), "replayed": replayed}
    except openai.APIError as e:
        return dict(stainless_failure(e), text="".join(text))
    except Exception as e:  # noqa: BLE001 - a timeout mid-stream surfaces from httpx itself
        return {"ok": False, "exception": type(e).__name__, "text": "".join(text)}


def run_anthropic(a):
    import anthropic
    kw = {"base_url": a.base}
    if a.timeout:
        kw["timeout"] = a.timeout
    client = anthropic.Anthropic(**kw)  # api key from ANTHROPIC_API_KEY
    try:
        r = client.messages.create(model="claude-sonnet-4-5", max_tokens=16,
                                   messages=[{"role": "user", "content": "hi"}])
        return {"ok": True, "id": r.id}
    except anthropic.APIError as e:
        return stainless_failure(e)


def run_stripe(a):
    import stripe
    stripe.api_key = os.environ["STRIPE_API_KEY"]
    stripe.api_base = a.base
    # Stripe's requests client verifies against its own bundle, not SSL_CERT_FILE: an agent
    # behind postern has to hand the bundle over itself.
    stripe.ca_bundle_path = os.environ["SSL_CERT_FILE"]
    if a.timeout:
        from stripe import _http_client
        stripe.default_http_client = _http_client.new_default_http_client(timeout=a.timeout)
    kw = {}
    if a.key:
        kw["idempotency_key"] = a.key
    if a.stripe_account:
        kw["stripe_account"] = a.stripe_account
    try:
        c = stripe.Customer.create(email="a@example.com", **kw)
        return {"ok": True, "id": c.id}
    except stripe.StripeError as e:
        # Stripe parses the body's "error" object: e.code is postern's code.
        out = {"ok": False, "exception": type(e).__name__, "status": e.http_status}
        body = e.json_body if isinstance(e.json_body, dict) else {}
        err = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
        if e.http_status is not None:
            out["code"] = e.code or err.get("code")
            out["retry"] = err.get("retry")
            out["invocation_id"] = body.get("invocation_id")
            out["should_retry"] = (e.headers or {}).get("stripe-should-retry")
        return out


def main():
    a = args()
    if a.sdk == "openai" and a.calls > 1:
        for _ in range(a.calls - 1):
            out = run_openai(a, False)
            print(json.dumps(out), flush=True)
            if not out.get("ok"):
                return
        out = run_openai(a, False)
    elif a.sdk == "openai":
        out = run_openai(a, False)
    elif a.sdk == "openai-responses":
        out = run_openai(a, True)
    elif a.sdk == "anthropic":
        out = run_anthropic(a)
    elif a.sdk == "stripe":
        out = run_stripe(a)
    else:
        sys.exit(f"unknown sdk {a.sdk}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
