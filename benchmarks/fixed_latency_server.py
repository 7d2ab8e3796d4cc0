"""An OpenAI-compatible chat endpoint that answers every request after a fixed delay with one canned reply.

It stands in for a model server whose latency is known exactly, so a benchmark can compare memrl's throughput
with the ideal bound (requests in flight / latency). It speaks just enough HTTP/1.1 (keep-alive, Content-Length)
on bare asyncio streams: on a 2-core machine a web framework's own CPU time would be charged to the client.
`GET /stats` returns the number of chat requests served.

Two canned replies, chosen by the path so that the server never parses a request body:
- `/v1/chat/completions`: `CANNED`, one JSON object with the keys of every collab role;
- `/judge/v1/chat/completions`: `JUDGE_REPLY`, a valid coverage-judge verdict (`{"reasoning": ..., "score": 2}`).

    python benchmarks/fixed_latency_server.py --port 8123 --latency 0.05
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

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
# What the LLM coverage judge must answer (memrl.rewards.llm_judge): a reasoning string and a 0-3 score.
JUDGE_REPLY = json.dumps({"reasoning": "Most preferences are recorded with concrete guidance.", "score": 2})
JUDGE_PREFIX = "/judge/"  # base URL http://host:port/judge/v1 gets the judge reply


def _completion(content: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-fixed",
            "object": "chat.completion",
            "created": 0,
            "model": "fixed",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
        }
    ).encode()


_COMPLETION = _completion(CANNED)
_JUDGE_COMPLETION = _completion(JUDGE_REPLY)


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
                    writer.write(_response(_JUDGE_COMPLETION if path.startswith(JUDGE_PREFIX) else _COMPLETION))
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


@contextlib.contextmanager
def running_server(latency: float) -> Iterator[str]:
    """Run the server in its own process (so its CPU time is not the benchmark's); yield its base URL."""
    import httpx2

    from memrl.rollout.serve import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, str(Path(__file__)), "--port", str(port), "--latency", str(latency)])
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx2.get(f"{base}/health").status_code == 200:
                    break
            except httpx2.HTTPError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"the fixed-latency server on port {port} did not start")
        yield base
    finally:
        server.terminate()
        server.wait()


def served(base: str) -> int:
    """Chat requests the server at `base` has answered so far."""
    import httpx2

    return int(httpx2.get(f"{base}/stats").json()["served"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    asyncio.run(FixedLatencyServer(args.latency).serve(args.port))


if __name__ == "__main__":
    main()
