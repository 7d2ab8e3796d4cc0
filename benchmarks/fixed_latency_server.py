"""An OpenAI-compatible chat endpoint that answers every request after a fixed delay with one canned reply.

It stands in for a model server whose latency is known exactly, so a benchmark can compare memrl's throughput
with the ideal bound (requests in flight / latency). It speaks just enough HTTP/1.1 (keep-alive, Content-Length)
on bare asyncio streams: on a 2-core machine a web framework's own CPU time would be charged to the client.
`GET /stats` returns the number of chat requests served.

    python benchmarks/fixed_latency_server.py --port 8123 --latency 0.05
"""

from __future__ import annotations

import argparse
import asyncio
import json

# Carries the keys of every collab role (agent reply, retrieval, reflection), so each call parses.
CANNED = json.dumps(
    {
        "user_preferences_reasoning": "The user wants short, direct answers.",
        "reasoning": "Answer directly.",
        "response": "- Step 1: add the numbers.\n- Step 2: check the total.\nI am 80% confident.",
        "relevant_notes": "Keep it short.",
        "agent_notes": "The user prefers short answers with bullet points.",
    }
)
_COMPLETION = json.dumps(
    {
        "id": "chatcmpl-fixed",
        "object": "chat.completion",
        "created": 0,
        "model": "fixed",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": CANNED}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
    }
).encode()


def _response(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class FixedLatencyServer:
    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.served = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *headers = head.decode("latin-1").split("\r\n")
                length = next((int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                path = request_line.split(" ")[1]
                if path.endswith("/chat/completions"):
                    await asyncio.sleep(self.latency)
                    self.served += 1
                    writer.write(_response(_COMPLETION))
                elif path == "/stats":
                    writer.write(_response(json.dumps({"served": self.served}).encode()))
                else:  # /health and anything else
                    writer.write(_response(b'{"status": "ok"}'))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def serve(self, port: int) -> None:
        server = await asyncio.start_server(self.handle, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    asyncio.run(FixedLatencyServer(args.latency).serve(args.port))


if __name__ == "__main__":
    main()
