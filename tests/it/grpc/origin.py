"""A loopback gRPC origin over TLS for tests/it/grpc.rs, with generic handlers (no codegen).

argv: cert.pem key.pem expected-authorization. Prints the port it listens on, then serves
until killed. Messages are raw bytes (no protobuf).

/t.Svc/Unary   checks the credential, answers b"echo:" + request, trailer x-origin: trailers
/t.Svc/Echo    echoes the authorization it got in the message and in a trailer
/t.Svc/Deny    PERMISSION_DENIED, the authorization echoed in grpc-message
/t.Svc/Fail    the status named by the request (e.g. b"UNAVAILABLE"), message "failed on purpose"
/t.Svc/Stream  server streaming: int(request) messages b"tick <n>", 400 ms apart
"""
import sys
import time
from concurrent import futures

import grpc

cert, key, expected = sys.argv[1], sys.argv[2], sys.argv[3]


def auth(context):
    return dict(context.invocation_metadata()).get("authorization", "")


def unary(request, context):
    if auth(context) != expected:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "no credential")
    context.set_trailing_metadata([("x-origin", "trailers")])
    return b"echo:" + request


def echo(request, context):
    got = auth(context)
    context.set_trailing_metadata([("x-echo", got)])
    return b"you sent " + got.encode()


def deny(request, context):
    context.abort(grpc.StatusCode.PERMISSION_DENIED, "not for " + auth(context))


def fail(request, context):
    context.abort(getattr(grpc.StatusCode, request.decode()), "failed on purpose")


def stream(request, context):
    for n in range(int(request)):
        if n:
            time.sleep(0.4)
        yield b"tick %d" % n


def raw(handler, kind=grpc.unary_unary_rpc_method_handler):
    return kind(handler, request_deserializer=None, response_serializer=None)


handlers = grpc.method_handlers_generic_handler(
    "t.Svc",
    {
        "Unary": raw(unary),
        "Echo": raw(echo),
        "Deny": raw(deny),
        "Fail": raw(fail),
        "Stream": raw(stream, grpc.unary_stream_rpc_method_handler),
    },
)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
server.add_generic_rpc_handlers((handlers,))
creds = grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())])
port = server.add_secure_port("127.0.0.1:0", creds)
server.start()
print(port, flush=True)
server.wait_for_termination()
