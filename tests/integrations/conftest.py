"""What the integration tests share: `memrl serve` on the tiny model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import announced

from memrl.rollout.serve import free_port


@pytest.fixture(scope="session")
def tiny_server(tiny_qwen2: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`memrl serve --model tiny-qwen2` on 127.0.0.1: (its URL, the model's name)."""
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("w")
    args = ["serve", "--model", "tiny-qwen2", "--engine", "transformers", "--port", port]
    with announced(args, "serving", stderr=log, start_new_session=True) as line:  # serving 'NAME' with ... at URL
        yield line.rsplit(" at ", 1)[1].strip(), line.split("'")[1]
