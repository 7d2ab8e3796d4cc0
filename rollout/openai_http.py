"""OpenAI-compatible HTTP backend: vllm serve, transformers serve, or any hosted API.

Retries with exponential backoff on 429, 5xx, timeouts and connection errors are the openai client's own
(`max_retries`); this module adds a bound on requests in flight, usage accounting and one-line errors.
Async requests go through the SDK's aiohttp client (`openai[aiohttp]`): at hundreds of requests per second it
costs about a third less CPU per request than httpx's own connection pool, which polls every pooled socket.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import aiohttp
import httpx2  # the HTTP client openai 3.x is built on
import openai

from memrl.core.errors import BackendError
from memrl.rollout.base import ChatBackend, Completion, Conversation, SamplingParams

# The SDK's generic `post` keeps its retries, timeouts and typed errors but skips the typed request transform and
# response models, which cost about 1 ms of CPU per call: the limit at hundreds of calls per second.
_CHAT = "/chat/completions"


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
    ) -> None:
        super().__init__()
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.batch_size = max_concurrency
        self._api_key = api_key or "EMPTY"  # local servers ignore it; the client insists on one
        self._wire_lock = threading.Lock()
        self.attempts = 0  # HTTP requests sent, retries included
        self.in_flight = 0  # requests sent whose response has not arrived, as the transport sees them
        self.peak_in_flight = 0
        self._client = openai.OpenAI(
            base_url=self.base_url,
            api_key=self._api_key,
            timeout=timeout,
            max_retries=max_retries,
            http_client=httpx2.Client(transport=_CountingTransport(httpx2.HTTPTransport(), self)),
        )
        self._slots = threading.BoundedSemaphore(max_concurrency)
        # aiohttp sessions and asyncio semaphores belong to one event loop each.
        self._per_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[openai.AsyncOpenAI, asyncio.Semaphore, AsyncGenerator[None, None]]
        ] = weakref.WeakKeyDictionary()

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
        return request

    def _completion(self, response: dict[str, Any]) -> Completion:
        choices = response.get("choices") or []
        if not choices:
            raise BackendError(f"endpoint {self.base_url} returned no choices")
        choice = choices[0]
        usage = response.get("usage") or {}
        completion = Completion(
            text=(choice.get("message") or {}).get("content") or "",
            prompt_tokens=usage.get("prompt_tokens") or 0,
            completion_tokens=usage.get("completion_tokens") or 0,
            finish_reason=choice.get("finish_reason"),
        )
        self.usage.record(completion)
        return completion

    def _error(self, exc: openai.OpenAIError) -> BackendError:
        self.usage.record_failure()
        if isinstance(exc, openai.APITimeoutError):
            why = f"timed out after {self.timeout:g}s"
        elif isinstance(exc, openai.APIConnectionError):
            why = "is unreachable"
        elif isinstance(exc, openai.APIStatusError):
            why = f"answered HTTP {exc.status_code}: {exc.message}"
        else:
            why = f"failed: {exc}"
        return BackendError(f"endpoint {self.base_url} {why} ({self.max_retries} retries, model {self.model!r})")

    def chat(self, messages: Conversation, params: SamplingParams | None = None) -> Completion:
        request = self._request(messages, params or SamplingParams())
        with self._slots:
            try:
                response = cast("dict[str, Any]", self._client.post(_CHAT, body=request, cast_to=object))
            except openai.OpenAIError as exc:
                raise self._error(exc) from exc
        return self._completion(response)

    async def _loop_state(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key,
                timeout=self.timeout,
                max_retries=self.max_retries,
                http_client=_CountingAioHttpClient(self),
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
                response = cast("dict[str, Any]", await client.post(_CHAT, body=request, cast_to=object))
            except openai.OpenAIError as exc:
                raise self._error(exc) from exc
        return self._completion(response)

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams | None = None) -> list[Completion]:
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(lambda c: self.chat(c, params), conversations))

    def list_models(self) -> list[str]:
        try:
            return [m.id for m in self._client.models.list()]
        except openai.OpenAIError as exc:
            raise self._error(exc) from exc

    def close(self) -> None:
        self._client.close()


async def _close_with_loop(client: openai.AsyncOpenAI) -> AsyncGenerator[None, None]:
    """Paused for the life of its event loop: the loop's shutdown (asyncio.run) resumes it, closing the client's
    aiohttp session, which would otherwise warn that it was never closed."""
    try:
        yield
    finally:
        await client.close()


class _CountingTransport(httpx2.BaseTransport):
    """Counts attempts and requests on the wire, failed ones included."""

    def __init__(self, inner: httpx2.BaseTransport, owner: OpenAIBackend) -> None:
        self.inner, self.owner = inner, owner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.owner._sent()
        try:
            return self.inner.handle_request(request)
        finally:
            self.owner._done()

    def close(self) -> None:
        self.inner.close()


class _CountingAioHttpClient(openai.DefaultAioHttpClient):
    """The SDK's aiohttp-backed client, its transport wrapped to count attempts."""

    def __init__(self, owner: OpenAIBackend) -> None:
        self._owner = owner
        super().__init__()

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return _AsyncCountingTransport(super()._init_transport(*args, **kwargs), self._owner)


class _AsyncCountingTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, owner: OpenAIBackend) -> None:
        self.inner, self.owner = inner, owner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.owner._sent()
        try:
            return await self.inner.handle_async_request(request)
        except httpx2.ConnectTimeout as exc:
            # The aiohttp adapter reports every failed connection as a connect timeout; a refused or dropped one is
            # a connection error, which openai retries just the same but reports as such, not as a timeout.
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, asyncio.TimeoutError):
                raise httpx2.ConnectError(str(cause), request=request) from cause
            raise
        finally:
            self.owner._done()

    async def aclose(self) -> None:
        await self.inner.aclose()
