"""An MCP server on the official Python SDK (streamable HTTP over TLS), for tests/it/mcp.rs.

Usage: server.py PORT CERT KEY LOG TOKEN

Its one tool, `record(n)`, counts its executions and answers `exec-<count>-<n>`. Every
request's method, JSON-RPC method and `Mcp-Session-Id` are appended to LOG as a JSON line
(what postern forwarded), and a request without `Authorization: Bearer TOKEN` is answered
401: the token is what postern injects, the client never holds it.
"""

import json
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

port, cert, key, log_path, token = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
executions = 0
server = MCPServer("recorder")


@server.tool()
def record(n: int) -> str:
    """Records one execution and says which it was."""
    global executions
    executions += 1
    with open(log_path, "a") as log:
        log.write(json.dumps({"executed": executions, "n": n}) + "\n")
    return f"exec-{executions}-{n}"


security = TransportSecuritySettings(allowed_hosts=["mcp.test:*", "mcp.test"], allowed_origins=[])
inner = server.streamable_http_app(transport_security=security)


async def app(scope, receive, send):
    """Logs what arrived and checks the injected bearer token, then serves MCP."""
    if scope["type"] != "http":
        return await inner(scope, receive, send)
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    try:
        rpc = json.loads(body).get("method") if body else None
    except ValueError:
        rpc = "(not json)"
    seen = {
        "method": scope["method"],
        "rpc": rpc,
        "session": headers.get("mcp-session-id"),
        "protocol": headers.get("mcp-protocol-version"),
        "headers": sorted(headers),
        "authorized": headers.get("authorization") == f"Bearer {token}",
    }
    with open(log_path, "a") as log:
        log.write(json.dumps(seen) + "\n")
    if not seen["authorized"]:
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
        return await send({"type": "http.response.body", "body": b"unauthorized"})
    replayed = False

    async def replay():
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    await inner(scope, replay, send)


uvicorn.run(app, host="127.0.0.1", port=int(port), ssl_certfile=cert, ssl_keyfile=key, log_level="warning")
