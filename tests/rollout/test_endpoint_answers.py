"""What an endpoint may answer, and what the OpenAI backend makes of it: a real HTTP server on 127.0.0.1 scripted to
answer garbage, drip, fall silent or demand the URL's credentials. Every failure is one BackendError line, in time,
that pickles without its cause (it crosses Ray); a well-formed answer with odd fields still counts."""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support import memrl_in_process

from memrl.core import secrets
from memrl.core.errors import BackendError
from memrl.rollout import SamplingParams
from memrl.rollout.openai_http import OpenAIBackend

ASK = [{"role": "user", "content": "hi"}]
SHORT = SamplingParams(temperature=0, max_tokens=4)
PASSWORD = "pa55-w0rd-in-the-url"
COMPLETION = {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


def _json(handler: BaseHTTPRequestHandler, body: object, ctype: str = "application/json") -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _drip(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    for _ in range(200):  # a byte every 0.1 s: each read succeeds, the answer never completes
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(0.1)


def _silent_stream(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    chunk = {"choices": [{"delta": {"role": "assistant"}, "index": 0}]}
    handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
    handler.wfile.flush()
    time.sleep(20)  # a server that took the request and makes no progress


def _stream(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    for piece in ("o", "k"):
        time.sleep(0.3)
        handler.wfile.write(f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n".encode())
        handler.wfile.flush()
    last = {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    handler.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())


_DROPPED: set[str] = set()


def _drop_once(handler: BaseHTTPRequestHandler) -> None:
    """The first request's connection closes before any answer (a keep-alive connection the server had just
    closed); the next one streams."""
    if "first" not in _DROPPED:
        _DROPPED.add("first")
        handler.close_connection = True
        return
    _stream(handler)


def _credentials(handler: BaseHTTPRequestHandler) -> None:
    expected = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    if handler.headers.get("Authorization") != expected:
        handler.send_response(401)
        handler.end_headers()
        return
    _json(handler, COMPLETION)


ANSWERS: dict[str, Callable[[BaseHTTPRequestHandler], None]] = {
    "list": lambda h: _json(h, [1, 2, 3]),
    "text": lambda h: _json(h, b"the model is sleeping", "text/plain"),
    "garbage": lambda h: _json(h, b"}{not json"),
    "no_choices": lambda h: _json(h, {"id": "x"}),
    "content_dict": lambda h: _json(h, {"choices": [{"message": {"content": {"a": 1}}}]}),
    "string_usage": lambda h: _json(h, {**COMPLETION, "usage": {"prompt_tokens": "many", "completion_tokens": 2}}),
    "drip": _drip,
    "silent_stream": _silent_stream,
    "stream": _stream,
    "drop_once": _drop_once,
    "credentials": _credentials,
}


class _Scripted(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ANSWERS[self.path.split("/")[1]](self)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _both(backend: OpenAIBackend) -> list[Callable[[], object]]:
    return [lambda: backend.chat(ASK, SHORT), lambda: asyncio.run(backend.achat(ASK, SHORT))]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ("list", "answered a JSON list, not a chat completion"),
        ("text", "answered text ('the model is sleeping'), not a chat completion"),
        ("garbage", "sent a malformed response (JSONDecodeError"),
        ("no_choices", "not a chat completion"),
        ("content_dict", "not a chat completion"),
    ],
)
def test_an_answer_that_is_not_a_completion_is_one_line(scripted: str, answer: str, said: str) -> None:
    backend = OpenAIBackend("m", f"{scripted}/{answer}/v1", max_retries=0, timeout=10)
    for call in _both(backend):
        with pytest.raises(BackendError) as caught:
            call()
        message = str(caught.value)
        assert said in message and "\n" not in message, message
        assert caught.value.__cause__ is None  # nothing holding a socket rides along across Ray
        assert str(pickle.loads(pickle.dumps(caught.value))) == message
    assert backend.usage.failures == 2


def test_odd_usage_counts_as_unknown_not_as_an_error(scripted: str) -> None:
    backend = OpenAIBackend("m", f"{scripted}/string_usage/v1", max_retries=0)
    completion = backend.chat(ASK, SHORT)  # type: ignore[arg-type]
    assert (completion.text, completion.prompt_tokens, completion.completion_tokens) == ("ok", 0, 2)


def test_an_endpoint_that_drips_meets_a_total_deadline(scripted: str) -> None:
    backend = OpenAIBackend("m", f"{scripted}/drip/v1", max_retries=0, timeout=1.0)
    for call in _both(backend):
        started = time.monotonic()
        with pytest.raises(BackendError, match="timed out after 1s"):
            call()
        assert time.monotonic() - started < 5  # the drip would have lasted 20 s


def test_progress_deadline_waits_on_tokens_and_fails_on_silence(scripted: str) -> None:
    streaming = OpenAIBackend("m", f"{scripted}/stream/v1", deadline="progress", timeout=0.5)
    for call in _both(streaming):  # 0.6 s in all, but never 0.5 s without a token
        completion = call()
        assert (completion.text, completion.completion_tokens, completion.finish_reason) == ("ok", 2, "stop")  # type: ignore[attr-defined]
    silent = OpenAIBackend("m", f"{scripted}/silent_stream/v1", deadline="progress", timeout=1.0, max_retries=3)
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"sent nothing for 1s .* too slow for the configured sizes"):
        asyncio.run(silent.achat(ASK, SHORT))  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    assert silent.attempts == 1  # a silent server is not asked again


def test_progress_deadline_retries_a_request_whose_connection_failed_before_the_stream(scripted: str) -> None:
    backend = OpenAIBackend("m", f"{scripted}/drop_once/v1", deadline="progress", timeout=5.0, max_retries=2)
    assert asyncio.run(backend.achat(ASK, SHORT)).text == "ok"  # type: ignore[arg-type]
    assert backend.attempts == 2


def test_url_credentials_travel_as_basic_auth_and_stay_secret(scripted: str) -> None:
    url = scripted.replace("http://", f"http://user:{PASSWORD}@") + "/credentials/v1"
    backend = OpenAIBackend("m", url, api_key="sk-ignored-by-this-server", max_retries=0)
    for call in _both(backend):
        assert call().text == "ok"  # type: ignore[attr-defined]
    assert PASSWORD not in backend.base_url
    assert secrets.redact(f"GET {url}") == f"GET {url.replace(PASSWORD, secrets.MASK)}"


def test_chat_command_says_what_the_endpoint_answered(scripted: str) -> None:
    code, out = memrl_in_process(["chat", "hi", "--endpoint", f"{scripted}/list/v1", "--model", "m", "--retries", "0"])
    assert code == 2 and "answered a JSON list, not a chat completion" in out and "Traceback" not in out, out
