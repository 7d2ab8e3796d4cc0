"""What the integration tests share: `memrl serve` on the tiny model."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import pytest
from support import MEMRL_ARGV


@pytest.fixture(scope="session")
def tiny_server(tiny_qwen2: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`memrl serve --model tiny-qwen2` on 127.0.0.1: (its URL, the model's name)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*MEMRL_ARGV, "serve", "--model", "tiny-qwen2", "--engine", "transformers", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=(tmp_path_factory.mktemp("serve") / "serve.log").open("w"),
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # serving 'NAME' with transformers at URL
        assert line.startswith("serving"), line
        name, url = line.split("'")[1], line.rsplit(" at ", 1)[1].strip()
        yield url, name
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
