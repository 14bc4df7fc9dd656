"""A gRPC client as an agent runs it: it knows only `https_proxy` and the CA in
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (postern's). Prints one JSON object.

argv: target (host:port) method request [stream]
"""
import json
import sys
import time

import grpc

target, method, request = sys.argv[1], sys.argv[2], sys.argv[3].encode()
streaming = len(sys.argv) > 4 and sys.argv[4] == "stream"
channel = grpc.secure_channel(target, grpc.ssl_channel_credentials())
out = {"messages": [], "arrivals_ms": []}
start = time.monotonic()
try:
    if streaming:
        call = channel.unary_stream(method)(request, timeout=30)
        for m in call:
            out["arrivals_ms"].append(int((time.monotonic() - start) * 1000))
            out["messages"].append(m.decode("latin-1"))
    else:
        m, call = channel.unary_unary(method).with_call(request, timeout=30)
        out["messages"].append(m.decode("latin-1"))
    out["code"] = call.code().name
    out["details"] = call.details()
except grpc.RpcError as e:
    call = e
    out["code"] = e.code().name
    out["details"] = e.details()


def metadata(pairs):
    # Binary (`-bin`) values arrive decoded, as bytes.
    return {k: v.decode("latin-1") if isinstance(v, bytes) else v for k, v in pairs or []}


out["initial"] = metadata(call.initial_metadata())
out["trailing"] = metadata(call.trailing_metadata())
print(json.dumps(out))
