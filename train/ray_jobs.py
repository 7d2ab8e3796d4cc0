"""Ray jobs through the job server's Python client, in this process: the runtime_env (and the secrets in its
env_vars) goes to the server over HTTP, never onto a command line where `ps` shows it.

Used by `memrl launch` (a stage per job) and by verl stages with `cluster.ray_address` (one job per stage run).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memrl.core.errors import MemrlError, first_line
from memrl.core.secrets import redact

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}

Write = Callable[[str], None]


def connect(address: str) -> Any:
    """A JobSubmissionClient for the job server at `address` (http://HOST:8265, or what Ray resolves)."""
    from ray.job_submission import JobSubmissionClient

    logging.getLogger("ray").setLevel(logging.WARNING)  # not a line per file Ray leaves out of the upload
    try:
        return JobSubmissionClient(address)
    except Exception as exc:
        raise MemrlError(f"cannot reach the Ray job server at {address}: {first_line(exc)}") from None


def node_gpus(address: str) -> int:
    """The most GPUs one live node of the cluster at `address` declares (Ray's state API, through its dashboard):
    what a job's process, which runs on one node, can be given."""
    from ray.util.state import list_nodes

    try:
        nodes = list_nodes(address=address, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
    except Exception as exc:
        raise MemrlError(f"cannot list the nodes of the Ray cluster at {address}: {first_line(exc)}") from None
    return int(max((node.resources_total.get("GPU", 0) for node in nodes), default=0))


def follow(client: Any, job_id: str, write: Write) -> tuple[str, str]:
    """Stream the job's logs to `write` until it ends; return its final status and Ray's message. Ctrl-C stops the
    job, then propagates."""

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(chunk)

    try:
        try:
            asyncio.run(tail())
        except Exception as exc:  # the log stream broke; the status below still says how the job ended
            write(f"(log stream interrupted: {first_line(exc)})\n")
        while True:
            info = client.get_job_info(job_id)
            status = str(getattr(info.status, "value", info.status))
            if status in TERMINAL:
                return status, info.message or ""
            time.sleep(1)
    except KeyboardInterrupt:
        client.stop_job(job_id)
        raise


def run_job_logged(
    address: str,
    entrypoint: Sequence[str],
    runtime_env: dict[str, Any],
    log_path: Path,
    *,
    name: str,
    shown: str,
    tail: int = 20,
) -> str:
    """Submit `entrypoint` with `runtime_env` and wait for it, copying its output (secrets redacted) to `log_path`
    and stdout; `shown` is what the log records as the command. A failure raises with the last lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    last: collections.deque[str] = collections.deque(maxlen=tail)
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"$ {redact(shown)}\n")
        log.flush()
        client = connect(address)
        try:
            job_id = client.submit_job(entrypoint=shlex.join(entrypoint), runtime_env=runtime_env)
        except Exception as exc:
            raise MemrlError(f"the Ray job server at {address} refused the {name} job: {first_line(exc)}") from None
        log.write(f"(Ray job {job_id})\n")
        print(f"{name}: Ray job {job_id} on {address}", file=sys.stderr)

        def emit(line: str) -> None:
            sys.stdout.write(line)
            log.write(line)
            last.append(line.rstrip("\n"))

        lines = _Lines(emit)
        status, message = follow(client, job_id, lines.write)
        lines.close()
    if status != "SUCCEEDED":
        why = f": {first_line(Exception(message))}" if message else ""
        body = "\n".join(f"  {line}" for line in last)
        raise MemrlError(f"{name} Ray job {job_id} {status.lower()}{why} (log: {log_path}); its last lines:\n{body}")
    return str(job_id)


class _Lines:
    """Log chunks cut into whole lines, each redacted: a secret split over two chunks is still found."""

    def __init__(self, emit: Callable[[str], object]) -> None:
        self.emit = emit
        self.pending = ""

    def write(self, chunk: str) -> None:
        *lines, self.pending = (self.pending + chunk).split("\n")
        for line in lines:
            self.emit(redact(line) + "\n")

    def close(self) -> None:
        if self.pending:
            self.emit(redact(self.pending) + "\n")
            self.pending = ""
