#!/usr/bin/env python3
"""A tiny HTTP tool server for examples/agent.yaml (Python 3 standard library only).

    python3 examples/tool-server.py [PORT] [HOST]   # default 8088 on 127.0.0.1

Each POST /<tool> gets the tool call's JSON arguments; the response body is the tool result the
model sees. It prints every call with its Idempotency-Key and answers a repeated key with the
first answer (marked "replayed"), the way a side-effecting tool should.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USERS = {"u-1": {"user_id": "u-1", "name": "Ada Lovelace", "status": "active"}}
ANSWERS = {}  # Idempotency-Key -> first answer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", "replace")
        key = self.headers.get("Idempotency-Key")
        tool = self.path.strip("/")
        print(f"{tool} Idempotency-Key={key} arguments={raw}", flush=True)
        try:
            args = json.loads(raw or "{}")
        except ValueError:
            return self.answer(400, {"error": "arguments are not JSON"})
        if key and key in ANSWERS:
            return self.answer(200, dict(ANSWERS[key], replayed=True))
        user_id = args.get("user_id") if isinstance(args, dict) else None
        if tool == "lookup_user":
            status, body = (200, USERS[user_id]) if user_id in USERS else (404, {"error": "no such user"})
        elif tool == "delete_user":
            if user_id in USERS:
                USERS[user_id] = dict(USERS[user_id], status="deleted")
                status, body = 200, {"deleted": user_id}
            else:
                status, body = 404, {"error": "no such user"}
        else:
            status, body = 404, {"error": f"unknown tool {tool}"}
        if key and status == 200:
            ANSWERS[key] = body
        self.answer(status, body)

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass  # the calls are printed by do_POST


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8088
    host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
    print(f"tool server on http://{host}:{port}", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()
