"""A loopback gRPC origin over TLS for tests/it/grpc.rs, with generic handlers (no codegen).

argv: cert.pem key.pem expected-authorization. Prints the port it listens on, then serves
until killed. Messages are raw bytes (no protobuf).

/t.Svc/Unary   checks the credential, answers b"echo:" + request, trailer x-origin: trailers
/t.Svc/Echo    echoes the authorization it got in the message and in a trailer
/t.Svc/Deny    PERMISSION_DENIED, the authorization echoed in grpc-message
/t.Svc/Fail    the status named by the request (e.g. b"UNAVAILABLE"), message "failed on purpose"
/t.Svc/Stream  server streaming: int(request) messages b"tick <n>", 400 ms apart
/t.Svc/EchoGzip, /t.Svc/EchoDeflate  as Echo, its message 8 times over, compressed
               (grpc-encoding), whatever grpc-accept-encoding the call sent
/t.Svc/StreamGzip  server streaming, gzip: int(request) messages, each 8 times
               b"<n> you sent " + authorization + b"\n"
/t.Svc/EchoBin  the authorization echoed in binary metadata: x-head-bin (initial) and
               x-echo-bin and grpc-status-details-bin (trailing), message b"ok"
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


def compressed(algorithm, handler):
    def call(request, context):
        # Per call, as grpcio's server-wide `compression=` does: the client's
        # grpc-accept-encoding is not consulted.
        context.set_compression(algorithm)
        # grpc-core sends a message uncompressed when that is shorter.
        return handler(request, context) * 8

    return call


def stream_gzip(request, context):
    context.set_compression(grpc.Compression.Gzip)
    for n in range(int(request)):
        yield (b"%d you sent %s\n" % (n, auth(context).encode())) * 8


def echo_bin(request, context):
    got = auth(context).encode()
    context.send_initial_metadata([("x-head-bin", b"head " + got)])
    # A google.rpc.Status with only its message (field 2): a length-prefixed protobuf.
    message = b"not for " + got
    details = b"\x12" + bytes([len(message)]) + message
    context.set_trailing_metadata(
        [("x-echo-bin", b"you sent " + got), ("grpc-status-details-bin", details)]
    )
    return b"ok"


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
        "EchoGzip": raw(compressed(grpc.Compression.Gzip, echo)),
        "EchoDeflate": raw(compressed(grpc.Compression.Deflate, echo)),
        "StreamGzip": raw(stream_gzip, grpc.unary_stream_rpc_method_handler),
        "EchoBin": raw(echo_bin),
    },
)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
server.add_generic_rpc_handlers((handlers,))
creds = grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())])
port = server.add_secure_port("127.0.0.1:0", creds)
server.start()
print(port, flush=True)
server.wait_for_termination()
