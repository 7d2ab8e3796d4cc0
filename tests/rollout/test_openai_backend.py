"""The OpenAI-compatible backend against a real `transformers serve` on 127.0.0.1: no mocked HTTP."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import MEMRL_ARGV, MemrlCLI

from memrl.core.errors import BackendError
from memrl.rollout import SamplingParams
from memrl.rollout.openai_http import OpenAIBackend
from memrl.rollout.serve import LocalServer, client_netloc, free_port, free_ports, port_is_free

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
SHORT = SamplingParams(temperature=0, max_tokens=8)


def backend_for(server: LocalServer, **kwargs: float) -> OpenAIBackend:
    return OpenAIBackend(server.name, server.url, **kwargs)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("host", "netloc"),
    [("127.0.0.1", "127.0.0.1:8000"), ("0.0.0.0", "127.0.0.1:8000"), ("::", "[::1]:8000"), ("::1", "[::1]:8000")],
)
def test_a_client_reaches_a_listening_address_through_a_valid_url(host: str, netloc: str) -> None:
    assert client_netloc(host, 8000) == netloc
    assert LocalServer("tiny", port=8000, host=host).url == f"http://{netloc}/v1"


def test_ports_picked_together_are_distinct_and_bindable() -> None:
    """One at a time, a port closed before the next pick can come back twice (a Ray head refused to start so)."""
    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports[:8]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_chat_against_real_server(smollm2_server: LocalServer) -> None:
    backend = backend_for(smollm2_server)
    completion = backend.chat(QUESTION, SamplingParams(temperature=0, max_tokens=16))  # type: ignore[arg-type]
    assert "paris" in completion.text.lower()
    assert completion.prompt_tokens > 0 and completion.completion_tokens > 0
    assert backend.usage.requests == 1 and backend.attempts == 1
    assert backend.usage.completion_tokens == completion.completion_tokens


@pytest.mark.slow
def test_async_requests_respect_the_concurrency_bound(smollm2_server: LocalServer) -> None:
    backend = backend_for(smollm2_server, max_concurrency=2)
    prompts = [[{"role": "user", "content": f"Count to {n}."}] for n in range(6)]

    async def run() -> list[str]:
        return [c.text for c in await asyncio.gather(*(backend.achat(p, SHORT) for p in prompts))]  # type: ignore[arg-type]

    texts = asyncio.run(run())
    assert len(texts) == 6 and all(texts)
    assert backend.peak_in_flight == 2  # the bound was reached and never passed
    assert backend.usage.requests == 6 and backend.in_flight == 0


@pytest.mark.slow
def test_batched_generate_respects_the_bound(smollm2_server: LocalServer) -> None:
    backend = backend_for(smollm2_server, max_concurrency=3)
    prompts = [[{"role": "user", "content": f"Name color number {n}."}] for n in range(7)]
    completions = backend.generate(prompts, SHORT)  # type: ignore[arg-type]
    assert len(completions) == 7
    assert 1 < backend.peak_in_flight <= 3
    assert backend.usage.prompt_tokens == sum(c.prompt_tokens for c in completions)


@pytest.mark.slow
def test_timeout_is_a_backend_error(smollm2_server: LocalServer) -> None:
    backend = backend_for(smollm2_server, timeout=0.2, max_retries=1)
    with pytest.raises(BackendError, match=r"timed out after 0\.2s"):
        backend.chat(QUESTION, SamplingParams(max_tokens=400))  # type: ignore[arg-type]
    assert backend.attempts == 2 and backend.usage.failures == 1


@pytest.mark.slow
def test_client_error_is_not_retried(smollm2_server: LocalServer) -> None:
    backend = OpenAIBackend("not-the-served-model", smollm2_server.url, max_retries=3)
    with pytest.raises(BackendError, match="HTTP 4"):
        backend.chat(QUESTION, SHORT)  # type: ignore[arg-type]
    assert backend.attempts == 1


def test_unreachable_endpoint_retries_then_fails() -> None:
    backend = OpenAIBackend("m", f"http://127.0.0.1:{free_port()}/v1", max_retries=2)
    with pytest.raises(BackendError, match="unreachable"):
        backend.chat(QUESTION, SHORT)  # type: ignore[arg-type]
    assert backend.attempts == 3


@pytest.mark.slow
def test_async_failures_name_their_cause(smollm2_server: LocalServer) -> None:
    """The aiohttp transport reports a refused connection as unreachable and a slow answer as a timeout."""
    refused = OpenAIBackend("m", f"http://127.0.0.1:{free_port()}/v1", max_retries=1)
    with pytest.raises(BackendError, match="unreachable"):
        asyncio.run(refused.achat(QUESTION, SHORT))  # type: ignore[arg-type]
    assert refused.attempts == 2 and refused.in_flight == 0
    slow = backend_for(smollm2_server, timeout=0.2, max_retries=1)
    with pytest.raises(BackendError, match=r"timed out after 0\.2s"):
        asyncio.run(slow.achat(QUESTION, SamplingParams(max_tokens=400)))  # type: ignore[arg-type]
    assert slow.attempts == 2 and slow.in_flight == 0


@pytest.mark.slow
def test_each_event_loop_closes_its_connections(smollm2_server: LocalServer, caplog: pytest.LogCaptureFixture) -> None:
    backend = backend_for(smollm2_server)
    for _ in range(2):  # two event loops, an aiohttp session each
        asyncio.run(backend.achat(QUESTION, SHORT))  # type: ignore[arg-type]
    gc.collect()
    assert backend.usage.requests == 2
    assert not [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()]


@pytest.mark.slow
def test_retry_survives_a_killed_server(tiny_qwen2: str, tmp_path: Path) -> None:
    port = free_port()
    first = LocalServer("tiny-qwen2", port=port, engine="transformers", log=tmp_path / "first.log").start()
    backend = OpenAIBackend(first.name, first.url, max_retries=10, timeout=30)
    assert backend.chat(QUESTION, SHORT).completion_tokens > 0  # type: ignore[arg-type]
    assert first.process is not None
    os.killpg(first.process.pid, signal.SIGKILL)
    first.stop()
    result: dict[str, object] = {}
    request = threading.Thread(target=lambda: result.update(c=backend.chat(QUESTION, SHORT)))  # type: ignore[arg-type]
    request.start()
    time.sleep(1.0)  # the request is now retrying against a closed port
    with LocalServer("tiny-qwen2", port=port, engine="transformers", log=tmp_path / "second.log"):
        request.join(timeout=120)
    assert not request.is_alive() and "c" in result
    assert backend.attempts >= 3  # first call, a refused attempt or more, the one that got through
    assert backend.usage.requests == 2 and backend.usage.failures == 0


@pytest.mark.slow
def test_chat_cli_through_endpoint(smollm2_server: LocalServer, memrl_cli: MemrlCLI) -> None:
    question = "What is the capital of France? Answer in one word."
    out = memrl_cli(
        "chat", "--endpoint", smollm2_server.url, "--model", "smollm2", "--json", question, check=True, timeout=120
    )
    assert '"requests": 1' in out.stdout and "paris" in out.stdout.lower()


def _as_from_a_terminal() -> None:
    """Ctrl-C reaches the child as it would from a shell. A child inherits its parent's blocked signals, and after
    some of the suite's in-process work the test process has SIGINT blocked: `memrl serve` then never saw it."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_serve_cli_starts_answers_and_stops_on_ctrl_c(tiny_qwen2: str) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*MEMRL_ARGV, "serve", "--model", "tiny-qwen2", "--port", str(port), "--engine", "transformers"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in line and "tiny-qwen2" in line
        backend = OpenAIBackend("tiny-qwen2", f"http://127.0.0.1:{port}/v1")
        assert backend.chat(QUESTION, SHORT).completion_tokens > 0  # type: ignore[arg-type]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # drains both pipes: a full pipe would block the shutdown's writes
        assert proc.returncode == 0, err[-2000:]
        assert port_is_free("127.0.0.1", port)  # the server went down with it
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_server_dies_with_the_process_that_started_it(tiny_qwen2: str, tmp_path: Path) -> None:
    """A memrl run killed with SIGKILL must not leave its model server eating the CPU."""
    script = tmp_path / "start_and_die.py"
    script.write_text(
        "import os\n"
        "from memrl.rollout.serve import LocalServer, free_port\n"
        "server = LocalServer('tiny-qwen2', port=free_port(), engine='transformers').start()\n"
        "print(server.process.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    server_pid = int(result.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(server_pid, 9)
    raise AssertionError("the server outlived its parent")
