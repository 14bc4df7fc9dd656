"""A loopback stand-in for S3 and Bedrock that checks every request's SigV4 signature with
botocore's own signer and the real key pair (never postern's code).

    python3 aws_origin.py CERT KEY KEYS_JSON LEDGER MODE

Prints the port it listens on, then serves until killed. Each request is one JSON line in
LEDGER: method, host, path, the key id and whether the signature verified, whether it applied.
MODE `close`: a Bedrock InvokeModel applies, then the connection closes with no answer.
"""

import hashlib
import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from urllib.parse import parse_qsl, urlencode, urlsplit

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials

CERT, KEY, KEYS_JSON, LEDGER, MODE = sys.argv[1:6]
KEYS = json.load(open(KEYS_JSON))
OBJECTS = {}
LOCK = threading.Lock()


def parse_authorization(value):
    if not value.startswith("AWS4-HMAC-SHA256 "):
        return None
    fields = dict(f.strip().split("=", 1) for f in value[len("AWS4-HMAC-SHA256 "):].split(","))
    key_id, date, region, service, _ = fields["Credential"].rsplit("/", 4)
    return key_id, region, service, fields["SignedHeaders"].split(";"), fields["Signature"]


def expected_signature(handler, body, region, service, signed):
    creds = Credentials(KEYS["access_key_id"], KEYS["secret_access_key"], KEYS.get("session_token"))
    base = S3SigV4Auth if service == "s3" else SigV4Auth

    class Verifier(base):
        def headers_to_sign(self, request):
            out = HTTPHeaders()
            for name in signed:
                out[name] = request.headers[name]
            return out

    headers = {k: v for k, v in handler.headers.items()}
    request = AWSRequest(
        method=handler.command,
        url="https://%s%s" % (handler.headers["Host"], handler.path),
        headers=headers,
        data=body,
    )
    request.context["timestamp"] = handler.headers["X-Amz-Date"]
    auth = Verifier(creds, service, region)
    canonical = auth.canonical_request(request)
    return auth.signature(auth.string_to_sign(request, canonical), request)


def presigned_ok(handler):
    """A presigned request (SigV4 in the query), checked with botocore's query signer."""
    split = urlsplit(handler.path)
    params = parse_qsl(split.query, keep_blank_values=True)
    given = dict(params)
    key_id, date, region, service, _ = given["X-Amz-Credential"].rsplit("/", 4)
    if key_id != KEYS["access_key_id"]:
        return key_id, False
    if given.get("X-Amz-Security-Token") != KEYS.get("session_token"):
        return key_id, False
    signed = given["X-Amz-SignedHeaders"].split(";")
    creds = Credentials(KEYS["access_key_id"], KEYS["secret_access_key"], KEYS.get("session_token"))

    class Verifier(S3SigV4QueryAuth):
        def headers_to_sign(self, request):
            out = HTTPHeaders()
            for name in signed:
                out[name] = request.headers[name]
            return out

    rest = urlencode([(k, v) for k, v in params if k != "X-Amz-Signature"])
    request = AWSRequest(method=handler.command,
                         url="https://%s%s?%s" % (handler.headers["Host"], split.path, rest),
                         headers={k: v for k, v in handler.headers.items()})
    request.context["timestamp"] = given["X-Amz-Date"]
    auth = Verifier(creds, service, region, expires=int(given["X-Amz-Expires"]))
    canonical = auth.canonical_request(request)
    return key_id, given["X-Amz-Signature"] == auth.signature(auth.string_to_sign(request, canonical), request)


def unchunk(body):
    """An aws-chunked body's data (S3 uploads with a trailing checksum)."""
    out, rest = b"", body
    while rest:
        line, rest = rest.split(b"\r\n", 1)
        size = int(line.split(b";")[0], 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2:]
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self, **fields):
        with LOCK, open(LEDGER, "a") as f:
            f.write(json.dumps(fields) + "\n")

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        parsed = parse_authorization(self.headers.get("Authorization", ""))
        verified, key_id = False, None
        token_ok = self.headers.get("X-Amz-Security-Token") == KEYS.get("session_token")
        if "X-Amz-Signature=" in self.path:
            key_id, verified = presigned_ok(self)
            token_ok = True
        elif parsed:
            key_id, region, service, signed, signature = parsed
            verified = key_id == KEYS["access_key_id"] and signature == expected_signature(
                self, body, region, service, signed
            )
        entry = dict(
            method=self.command,
            host=self.headers.get("Host"),
            path=self.path,
            key_id=key_id,
            verified=verified and token_ok,
            applied=False,
        )
        if not entry["verified"]:
            self.record(**entry)
            return self.answer(403, b'{"message":"signature does not match"}',
                               {"x-amzn-ErrorType": "SignatureDoesNotMatch"})
        entry["applied"] = True
        self.record(**entry)
        if self.headers["Host"].startswith("bedrock-runtime."):
            if MODE == "close":
                self.close_connection = True
                self.connection.shutdown(2)
                return
            return self.answer(200, b'{"completion":"signed by postern"}',
                               {"Content-Type": "application/json"})
        if self.command == "PUT":
            data = unchunk(body) if "aws-chunked" in self.headers.get("Content-Encoding", "") else body
            OBJECTS[urlsplit(self.path).path] = data
            return self.answer(200, b"", {"ETag": '"%s"' % hashlib.md5(data).hexdigest()})
        data = OBJECTS.get(urlsplit(self.path).path)
        if data is None:
            return self.answer(404, b"<Error><Code>NoSuchKey</Code></Error>", {})
        return self.answer(200, data, {"Content-Type": "application/octet-stream"})

    def answer(self, status, body, headers):
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = handle_any


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(CERT, KEY)
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
