"""An MCP client on the official Python SDK (streamable HTTP), for tests/it/mcp.rs.

Usage: client.py URL SESSIONS

Runs SESSIONS sessions one after another, each `initialize` then `tools/call record(n=1)`,
configured by the environment alone (HTTPS_PROXY, SSL_CERT_FILE). Prints one JSON line per
session: the tool's text, whether it was an error, or the exception.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def one_session(url):
    async with streamable_http_client(url) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("record", {"n": 1})
            text = [c.text for c in result.content if getattr(c, "text", None) is not None]
            return {"text": text, "is_error": bool(result.is_error)}


def describe(e):
    """The exception, with the ones an exception group holds."""
    inner = [describe(x) for x in getattr(e, "exceptions", [])]
    return f"{type(e).__name__}: {e}" + (f" [{'; '.join(inner)}]" if inner else "")


async def main():
    url, sessions = sys.argv[1], int(sys.argv[2])
    for _ in range(sessions):
        try:
            line = await asyncio.wait_for(one_session(url), 30)
        except BaseException as e:  # noqa: BLE001 - the test reads what failed
            line = {"error": describe(e)}
        print(json.dumps(line), flush=True)


asyncio.run(main())
