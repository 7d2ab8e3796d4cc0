"""OpenAI-compatible HTTP backend: vllm serve, transformers serve, or any hosted API.

Two deadlines, as `deadline` says:
- "total" (an endpoint somewhere else): `timeout` bounds each attempt from sending to the last byte, so an endpoint
  that drips a byte a second still times out; the openai client retries timeouts, 429, 5xx and connection errors
  (`max_retries`). A timed-out attempt's connection is closed first, which makes vLLM and hosted APIs drop it, so a
  retry does not run beside it.
- "progress" (a server memrl started on this machine): requests stream, and fail only after `timeout` seconds in
  which this process received nothing from the server while it waited; a busy machine makes each answer slower,
  never a failure, and a stall ends in one line saying the machine is too slow. The client retries only what
  failed before the stream began (a dropped keep-alive connection, 5xx); the server stops a streamed request whose
  connection closed, so a retry never runs beside the request it replaces (load made the queue longer that way).
This module adds a bound on requests in flight, usage accounting, credentials from the URL, and one-line errors
for whatever an endpoint answers. Async requests go through the SDK's aiohttp client (`openai[aiohttp]`): at
hundreds of requests per second it costs about a third less CPU per request than httpx's own connection pool.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import threading
import time
import urllib.parse
import urllib.request
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, cast

import aiohttp
import httpx2  # the HTTP client openai 3.x is built on
import openai

from memrl.core import secrets
from memrl.core.errors import BackendError
from memrl.core.files import json_type
from memrl.rollout.base import ChatBackend, Completion, Conversation, SamplingParams

# The SDK's generic `post` keeps its retries, timeouts and typed errors but skips the typed request transform and
# response models, which cost about 1 ms of CPU per call: the limit at hundreds of calls per second.
_CHAT = "/chat/completions"
Deadline = Literal["total", "progress"]
POLL_S = 2.0  # how often a waiting streamed request looks at the server's progress
# What a broken endpoint makes the transport or the SDK raise besides its own errors: garbage, a torn stream.
_WIRE_ERRORS = (openai.OpenAIError, httpx2.HTTPError, aiohttp.ClientError, ValueError, RecursionError)


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """`url` without its `user:password@` part, and the Basic authorization header that carries it instead.

    aiohttp refuses a URL with credentials beside the client's own authorization header; the header is how the
    credentials were meant to travel. Both parts become secrets of this process, masked wherever they are shown.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, {}
    secrets.register(secrets.url_credentials(url))
    user, password = urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{parts.port}" if parts.port else ""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    secrets.register([token])
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), {"Authorization": f"Basic {token}"}


class OpenAIBackend(ChatBackend):
    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        max_concurrency: int = 16,
        deadline: Deadline = "total",
    ) -> None:
        super().__init__()
        self.model = model
        url, headers = split_credentials(base_url.rstrip("/"))
        self.base_url = url
        self.timeout = timeout
        self.deadline = deadline
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.batch_size = max_concurrency
        self._api_key = api_key or "EMPTY"  # local servers ignore it; the client insists on one
        self._headers = headers
        self._wire_lock = threading.Lock()
        self.attempts = 0  # HTTP requests sent, retries included
        self.in_flight = 0  # requests sent whose response has not arrived, as the transport sees them
        self.peak_in_flight = 0
        self._heard_at = 0.0  # when this process last received a streamed chunk (progress deadline)
        self._waiting = 0  # streamed requests of this process not finished
        total = deadline == "total"
        self._client = openai.OpenAI(
            base_url=self.base_url,
            api_key=self._api_key,
            timeout=self._timeouts(),
            max_retries=self.max_retries,
            default_headers=headers,
            http_client=httpx2.Client(
                transport=_CountingTransport(_transport(self.base_url), self, timeout if total else None)
            ),
        )
        self._slots = threading.BoundedSemaphore(max_concurrency)
        # aiohttp sessions and asyncio semaphores belong to one event loop each.
        self._per_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[openai.AsyncOpenAI, asyncio.Semaphore, AsyncGenerator[None, None]]
        ] = weakref.WeakKeyDictionary()

    def _timeouts(self) -> httpx2.Timeout:
        if self.deadline == "total":
            return httpx2.Timeout(self.timeout)
        # Waiting for the server's next token is bounded by its progress (`_stream`), not by the socket.
        return httpx2.Timeout(self.timeout, read=None, pool=None)

    def _sent(self) -> None:
        with self._wire_lock:
            self.attempts += 1
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def _done(self) -> None:
        with self._wire_lock:
            self.in_flight -= 1

    def _request(self, messages: Conversation, params: SamplingParams) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if params.stop:
            request["stop"] = list(params.stop)
        if params.seed is not None:
            request["seed"] = params.seed
        if self.deadline == "progress":
            request["stream"] = True
        return request

    def _not_a_completion(self, what: str) -> BackendError:
        self.usage.record_failure()
        return BackendError(f"endpoint {self.base_url} answered {what}, not a chat completion (model {self.model!r})")

    def _completion(self, response: object) -> Completion:
        """The completion in a parsed response, or one line saying what the endpoint sent instead."""
        if isinstance(response, str):  # a body the SDK left as text (no JSON content type): a completion if it parses
            text = response
            try:
                response = json.loads(text)
            except (ValueError, RecursionError):
                response = text
            if isinstance(response, str):
                raise self._not_a_completion(f"text ({text[:60]!r})")
        if not isinstance(response, dict):
            raise self._not_a_completion(_a_json(response))
        choices = response.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        message = choice.get("message") if isinstance(choice, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(message, dict) or not isinstance(content, str | None):
            raise self._not_a_completion("JSON without choices[0].message.content")
        assert isinstance(choice, dict)
        return self._record(content or "", response.get("usage"), choice.get("finish_reason"))

    def _record(self, text: str, usage: object, finish_reason: object) -> Completion:
        counts = usage if isinstance(usage, dict) else {}
        completion = Completion(
            text=text,
            prompt_tokens=_count(counts.get("prompt_tokens")),
            completion_tokens=_count(counts.get("completion_tokens")),
            finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        )
        self.usage.record(completion)
        return completion

    def _error(self, exc: Exception) -> BackendError:
        self.usage.record_failure()
        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, openai.APITimeoutError):
            why = f"timed out after {self.timeout:g}s"
        elif isinstance(exc, openai.APIConnectionError):
            proxy = _proxy_for(self.base_url)  # a dead proxy makes every endpoint look down
            why = f"is unreachable through the proxy {proxy[0]}={proxy[1]}" if proxy else "is unreachable"
        elif isinstance(exc, openai.APIStatusError):
            why = f"answered HTTP {exc.status_code}: {_first(exc.message)}"
        elif isinstance(exc, openai.OpenAIError):
            why = f"failed: {_first(str(exc))}"
        elif isinstance(exc, RecursionError):
            why = "sent a malformed response (JSON nested too deeply)"
        else:  # garbage on the wire: bad JSON, a torn or malformed response
            why = f"sent a malformed response ({type(exc).__name__}: {_first(str(exc))})"
        return BackendError(f"endpoint {self.base_url} {why} ({self.max_retries} retries, model {self.model!r})")

    def chat(self, messages: Conversation, params: SamplingParams | None = None) -> Completion:
        request = self._request(messages, params or SamplingParams())
        with self._slots:
            try:
                if self.deadline == "progress":
                    return self._join(self._stream_sync(request))
                response = self._client.post(_CHAT, body=request, cast_to=object)
            except _WIRE_ERRORS as exc:
                raise self._error(exc) from None  # the cause may hold sockets: it stays out of what crosses Ray
        return self._completion(response)

    def _stream_sync(self, request: dict[str, Any]) -> Iterator[object]:
        """Streamed chunks; waiting is bounded per chunk (`timeout` of silence), which is progress for one caller."""
        stream = self._client.with_options(timeout=httpx2.Timeout(self.timeout)).post(
            _CHAT, body=request, cast_to=object, stream=True, stream_cls=openai.Stream[object]
        )
        with stream:
            yield from stream

    async def _loop_state(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key,
                timeout=self._timeouts(),
                max_retries=self.max_retries,
                default_headers=self._headers,
                http_client=_CountingAioHttpClient(self, self.timeout if self.deadline == "total" else None),
            )
            closer = _close_with_loop(client)
            state = (client, asyncio.Semaphore(self.max_concurrency), closer)
            self._per_loop[loop] = state
            await anext(closer)
        return state[0], state[1]

    async def achat(self, messages: Conversation, params: SamplingParams | None = None) -> Completion:
        client, slots = await self._loop_state()
        request = self._request(messages, params or SamplingParams())
        async with slots:
            try:
                if self.deadline == "progress":
                    return self._join([chunk async for chunk in self._stream(client, request)])
                response = await client.post(_CHAT, body=request, cast_to=object)
            except _WIRE_ERRORS as exc:
                raise self._error(exc) from None  # the cause may hold sockets: it stays out of what crosses Ray
        return self._completion(response)

    async def _stream(self, client: openai.AsyncOpenAI, request: dict[str, Any]) -> AsyncIterator[object]:
        """Streamed chunks as they come. The wait fails only when this process heard nothing from the server for
        `timeout` seconds since this request was sent: a request queued behind others waits as long as the server
        answers someone."""
        sent = time.monotonic()
        self._waiting += 1
        pending: asyncio.Future[object] | None = None
        try:
            stream = await client.post(
                _CHAT, body=request, cast_to=object, stream=True, stream_cls=openai.AsyncStream[object]
            )
            try:
                chunks = stream.__aiter__()
                while True:
                    pending = asyncio.ensure_future(anext(chunks))
                    while not (await asyncio.wait({pending}, timeout=min(POLL_S, self.timeout)))[0]:
                        if time.monotonic() - max(sent, self._heard_at) > self.timeout:
                            raise self._stalled()
                    try:
                        chunk = pending.result()
                    except StopAsyncIteration:
                        return
                    self._heard_at = time.monotonic()
                    yield chunk
            finally:
                if pending is not None and not pending.done():
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        await pending
                await stream.close()  # a request left behind is cancelled by the server when its connection closes
        finally:
            self._waiting -= 1

    def _stalled(self) -> BackendError:
        self.usage.record_failure()
        return BackendError(
            f"endpoint {self.base_url} (a server this run started) sent nothing for {self.timeout:g}s while "
            f"{self._waiting} requests of this process waited: the machine is too slow for the configured sizes "
            "(lower max_in_flight, the users or max_tokens, or raise the model's timeout)"
        )

    def _join(self, chunks: Sequence[object] | Iterator[object]) -> Completion:
        """One completion from streamed chunks (text deltas, then a last chunk with finish_reason and usage)."""
        text: list[str] = []
        finish: object = None
        usage: object = None
        for chunk in chunks:
            if not isinstance(chunk, dict):
                raise self._not_a_completion(f"a stream holding {_a_json(chunk)}")
            usage = chunk.get("usage") or usage
            choices = chunk.get("choices")
            choice = choices[0] if isinstance(choices, list) and choices else {}
            delta = choice.get("delta") if isinstance(choice, dict) else None
            piece = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(piece, str):
                text.append(piece)
            if isinstance(choice, dict) and choice.get("finish_reason"):
                finish = choice["finish_reason"]
        return self._record("".join(text), usage, finish)

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams | None = None) -> list[Completion]:
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(lambda c: self.chat(c, params), conversations))

    def list_models(self) -> list[str]:
        """The served model names (GET /models), read as plain JSON: the SDK's typed page breaks with a traceback
        on a body of another shape (a JSON list, null)."""
        try:
            listing = self._client.get("/models", cast_to=object)
        except _WIRE_ERRORS as exc:
            raise self._error(exc) from None
        models = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(models, list) or not all(
            isinstance(m, dict) and isinstance(m.get("id"), str) for m in models
        ):
            shape = _a_json(listing) if not isinstance(listing, dict) else "JSON without data[].id"
            self.usage.record_failure()
            raise BackendError(f"endpoint {self.base_url} answered {shape}, not a list of models (GET /models)")
        return [m["id"] for m in models]

    def close(self) -> None:
        self._client.close()


def _transport(url: str) -> httpx2.HTTPTransport:
    """The sync transport: no TLS set-up for a plain http:// endpoint (a broken SSL_CERT_FILE then does not matter),
    and a TLS set-up that fails says which of the variables that point at certificates to fix."""
    if urllib.parse.urlsplit(url).scheme == "http":
        return httpx2.HTTPTransport(verify=False)  # no TLS on this connection: nothing to verify
    try:
        return httpx2.HTTPTransport()
    except (ssl.SSLError, OSError) as exc:
        named = [f"{name}={os.environ[name]}" for name in ("SSL_CERT_FILE", "SSL_CERT_DIR") if os.environ.get(name)]
        where = f" from {' '.join(named)}" if named else ""
        raise BackendError(f"cannot load TLS certificates{where} for {url}: {_first(str(exc))}") from None


def _proxy_for(url: str) -> tuple[str, str] | None:
    """The proxy variable (name, value) that requests to `url` go through, as the HTTP clients read them."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    name = next((n for n in (f"{parts.scheme}_proxy", f"{parts.scheme.upper()}_PROXY") if n in os.environ), "proxy")
    return name, proxy


def _a_json(value: object) -> str:
    """ "a JSON list", "a JSON null", "a JSON string": what an endpoint sent instead of what was asked."""
    return "a JSON " + json_type(value).removeprefix("an ").removeprefix("a ")


def _count(value: object) -> int:
    """A token count as servers send it; anything else (a string, a float, null) counts as unknown: 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _first(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0][:200] if lines else ""


async def _close_with_loop(client: openai.AsyncOpenAI) -> AsyncGenerator[None, None]:
    """Paused for the life of its event loop: the loop's shutdown (asyncio.run) resumes it, closing the client's
    aiohttp session, which would otherwise warn that it was never closed."""
    try:
        yield
    finally:
        await client.close()


def _expired(request: httpx2.Request, seconds: float) -> httpx2.ReadTimeout:
    return httpx2.ReadTimeout(f"no complete answer within {seconds:g}s", request=request)


class _DeadlineStream(httpx2.SyncByteStream):
    """A response body that must arrive whole by a deadline: checked at every piece, however small."""

    def __init__(self, inner: Any, request: httpx2.Request, seconds: float, until: float) -> None:
        self.inner, self.request, self.seconds, self.until = inner, request, seconds, until

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.inner:
            if time.monotonic() > self.until:
                raise _expired(self.request, self.seconds)
            yield piece

    def close(self) -> None:
        self.inner.close()


class _AsyncDeadlineStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, request: httpx2.Request, seconds: float, until: float) -> None:
        self.inner, self.request, self.seconds, self.until = inner, request, seconds, until

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pieces = self.inner.__aiter__()
        while True:
            try:
                async with asyncio.timeout(max(0.0, self.until - time.monotonic())):
                    piece = await anext(pieces)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise _expired(self.request, self.seconds) from None
            yield piece

    async def aclose(self) -> None:
        await self.inner.aclose()


class _CountingTransport(httpx2.BaseTransport):
    """Counts attempts and requests on the wire, failed ones included; with `total`, an attempt's whole answer
    must arrive within that many seconds (a per-read timeout never fires on an endpoint that drips)."""

    def __init__(self, inner: httpx2.BaseTransport, owner: OpenAIBackend, total: float | None) -> None:
        self.inner, self.owner, self.total = inner, owner, total

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.owner._sent()
        until = time.monotonic() + (self.total or 0.0)
        try:
            response = self.inner.handle_request(request)
        finally:
            self.owner._done()
        if self.total is not None:
            response.stream = _DeadlineStream(response.stream, request, self.total, until)
        return response

    def close(self) -> None:
        self.inner.close()


class _CountingAioHttpClient(openai.DefaultAioHttpClient):
    """The SDK's aiohttp-backed client, its transport wrapped to count attempts (and bound them, see above)."""

    def __init__(self, owner: OpenAIBackend, total: float | None) -> None:
        self._owner, self._total = owner, total
        super().__init__()

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return _AsyncCountingTransport(super()._init_transport(*args, **kwargs), self._owner, self._total)


class _AsyncCountingTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, owner: OpenAIBackend, total: float | None) -> None:
        self.inner, self.owner, self.total = inner, owner, total

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.owner._sent()
        until = time.monotonic() + (self.total or 0.0)
        try:
            async with asyncio.timeout(self.total):
                response = await self.inner.handle_async_request(request)
        except TimeoutError:
            raise _expired(request, cast(float, self.total)) from None
        except httpx2.ConnectTimeout as exc:
            # The aiohttp adapter reports every failed connection as a connect timeout; a refused or dropped one is
            # a connection error, which openai retries just the same but reports as such, not as a timeout.
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, asyncio.TimeoutError):
                raise httpx2.ConnectError(str(cause), request=request) from cause
            raise
        finally:
            self.owner._done()
        if self.total is not None:
            response.stream = _AsyncDeadlineStream(response.stream, request, self.total, until)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()
