"""An MCP server for agentrun's tests, written with the official Python SDK (`mcp` on PyPI:
MCPServer, which mcp 1.x called FastMCP) and served over the Streamable HTTP transport on
127.0.0.1.

Tools:
  delete_file(path)  annotated destructiveHint: true   (approval under fromAnnotations)
  read_file(path)    annotated readOnlyHint: true      (no approval under fromAnnotations)
  fail(reason)       annotated readOnlyHint: true; raises ToolError, so the result has
                     isError: true and the reason as its text

Every HTTP request is logged to --log (one JSON object per line: its JSON-RPC method, tool name
and headers) and every executed tool call too ({"executed": tool, "arguments": ...}), so a test
can count executions and check headers. --changed gives delete_file another description (a new
definition digest); --require-header NAME=VALUE answers 401 to requests without that header;
--slow-read SECONDS makes read_file answer that much later (for timeouts).
"""

import argparse
import asyncio
import json
import sys
import threading

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

LOCK = threading.Lock()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--changed", action="store_true")
    parser.add_argument("--require-header", default=None)
    parser.add_argument("--slow-read", type=float, default=0.0)
    args = parser.parse_args()

    def log(entry: dict) -> None:
        with LOCK, open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    server = MCPServer("agentrun-test-tools")
    description = "Deletes a file for good."
    if args.changed:
        description = "Deletes a file and every backup of it."

    @server.tool(
        description=description,
        annotations=ToolAnnotations(destructiveHint=True, readOnlyHint=False),
    )
    def delete_file(path: str) -> str:
        log({"executed": "delete_file", "arguments": {"path": path}})
        return f"deleted {path}"

    @server.tool(
        description="Reads a file.",
        annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True),
    )
    async def read_file(path: str) -> str:
        log({"executed": "read_file", "arguments": {"path": path}})
        if args.slow_read:
            await asyncio.sleep(args.slow_read)
        return f"contents of {path}: hello"

    @server.tool(description="Always fails.", annotations=ToolAnnotations(readOnlyHint=True))
    def fail(reason: str) -> str:
        log({"executed": "fail", "arguments": {"reason": reason}})
        raise ToolError(f"failed on purpose: {reason}")

    app = server.streamable_http_app(host="127.0.0.1")
    required = None
    if args.require_header:
        name, _, value = args.require_header.partition("=")
        required = (name.lower().encode(), value.encode())

    async def logged(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message)
            more = message.get("type") == "http.request" and message.get("more_body", False)
        body = b"".join(m.get("body", b"") for m in chunks)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        entry = {"http": scope["method"], "headers": headers}
        try:
            rpc = json.loads(body) if body else {}
            if isinstance(rpc, dict):
                entry["method"] = rpc.get("method")
                entry["tool"] = (rpc.get("params") or {}).get("name")
        except ValueError:
            pass
        log(entry)
        if required is not None and dict(scope["headers"]).get(required[0]) != required[1]:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        replay = iter(chunks)

        async def replayed():
            try:
                return next(replay)
            except StopIteration:
                return await receive()

        return await app(scope, replayed, send)

    async def root(scope, receive, send):
        if scope["type"] == "lifespan":
            return await app(scope, receive, send)
        return await logged(scope, receive, send)

    print(f"listening on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(root, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
