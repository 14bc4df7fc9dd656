"""An MCP host on the official Python SDK's stdio client, for tests/it/mcp.rs: it starts
`postern mcp --agent AGENT` as a host such as Claude Desktop would (command, args, env) and
runs a plan of steps in one session.

Usage: host.py POSTERN AGENT PLAN_JSON (or @FILE holding it)

The server's environment is POSTERN_HOME, POSTERN_CONFIG and the names listed in the
HOST_PASS variable (comma-separated), taken from this process. PLAN_JSON is a list of
steps: {"list": true} lists the tools; {"tool": NAME, "args": {...}, "progress": true}
calls one ("timeout": seconds after which the client gives up and sends
notifications/cancelled). Each step prints one JSON line as it ends; a step with "announce"
prints {"calling": NAME} first.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


def server_env():
    names = ["POSTERN_HOME", "POSTERN_CONFIG"] + [n for n in os.environ.get("HOST_PASS", "").split(",") if n]
    return {n: os.environ[n] for n in names if n in os.environ}


def emit(line):
    print(json.dumps(line), flush=True)


async def main():
    postern, agent, plan = sys.argv[1], sys.argv[2], sys.argv[3]
    if plan.startswith("@"):
        with open(plan[1:]) as f:
            plan = f.read()
    plan = json.loads(plan)
    params = StdioServerParameters(command=postern, args=["mcp", "--agent", agent], env=server_env())
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for step in plan:
                if step.get("list"):
                    tools = await session.list_tools()
                    emit({"tools": [t.model_dump(mode="json", by_alias=True) for t in tools.tools]})
                    continue
                if step.get("announce"):
                    emit({"calling": step["tool"]})
                notes = []

                async def on_progress(progress, total, message):
                    notes.append(message)

                callback = on_progress if step.get("progress") else None
                try:
                    result = await session.call_tool(
                        step["tool"], step.get("args", {}), progress_callback=callback,
                        read_timeout_seconds=step.get("timeout"))
                except Exception as e:  # noqa: BLE001 - the test reads what failed
                    emit({"tool": step["tool"], "exception": f"{type(e).__name__}: {e}"})
                    continue
                emit({
                    "tool": step["tool"],
                    "is_error": bool(result.is_error),
                    "structured": result.structured_content,
                    "text": [c.text for c in result.content if getattr(c, "text", None) is not None],
                    "progress": notes,
                })


asyncio.run(main())
