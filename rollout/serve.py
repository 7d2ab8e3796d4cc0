"""Start a local OpenAI-compatible server: `vllm serve` on GPU machines, `transformers serve` elsewhere.

The model is served under a short name: an embedded model's canonical name, a local folder's name, or the
hub id. Clients send that name in `model` (see `served_name`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Literal

import httpx2

from memrl.core import interrupts, models
from memrl.core.errors import BackendError, ConfigError

Engine = Literal["auto", "transformers", "vllm"]


def served_name(model: str) -> str:
    """The name a server started by memrl exposes for `model`; clients send it as `model`."""
    embedded = models.lookup(model)
    if embedded is not None:
        return embedded.name
    path = Path(model).expanduser()
    return path.resolve().name if path.exists() else model


def pick_engine(engine: Engine) -> Literal["transformers", "vllm"]:
    if engine != "auto":
        return engine
    has_vllm = importlib.util.find_spec("vllm") is not None
    return "vllm" if has_vllm and _cuda_available() else "transformers"


def shared_server_args(engine: Literal["transformers", "vllm"]) -> tuple[str, ...]:
    """Extra flags for a server that many concurrent clients share (vLLM batches on its own).

    transformers serve batches only with continuous batching; on CPU it also runs bf16, which measured 2.5x
    faster than fp32 for 4 concurrent SmolLM2 requests of ~800 prompt tokens on 2 cores.
    """
    if engine == "vllm":
        return ()
    return ("--continuous-batching",) if _cuda_available() else ("--continuous-batching", "--dtype", "bfloat16")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _console_script(name: str, extra: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise BackendError(f"`{name}` is not installed: pip install 'memrl[{extra}]'")
    return found


LOOPBACK = "127.0.0.1"  # where every server memrl starts listens unless told otherwise (`memrl serve --host`)
STOP_GRACE_S = 15.0  # a server's own shutdown (SIGINT) before SIGTERM; shorter when this process was told to stop
_HOSTNAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def check_host(host: str) -> str:
    """An address to listen on, as given: an IP address or a host name; anything else fails in one line."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    if _HOSTNAME.fullmatch(host):
        return host
    raise ConfigError(f"--host {host[:100]!r}: give an address to listen on, such as 127.0.0.1 or 0.0.0.0")


def client_netloc(host: str, port: int) -> str:
    """HOST:PORT as a client on this machine writes it in a URL: a wildcard address is reached through loopback,
    an IPv6 one goes in brackets."""
    host = {"0.0.0.0": LOOPBACK, "::": "::1"}.get(host, host)
    return f"{f'[{host}]' if ':' in host else host}:{port}"


def port_is_free(host: str, port: int) -> bool:
    """Whether nothing accepts connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return False
    except OSError:
        return True


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports free now: each socket stays bound until all are picked, since one closed before the next
    bind may be handed out again (two components of one process given the same port)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


class LocalServer:
    """A server process on 127.0.0.1 (or `host`) that stops cleanly (SIGINT, then SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        model: str,
        port: int = 8000,
        engine: Engine = "auto",
        host: str = LOOPBACK,
        log: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.model = model
        self.port = port
        self.host = host
        self.engine = pick_engine(engine)
        self.name = served_name(model)
        self.log = log
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The base URL a client on this machine uses (a wildcard address is reached through loopback)."""
        return f"http://{client_netloc(self.host, self.port)}/v1"

    def command(self) -> tuple[list[str], Path | None]:
        """The server's argv and the working directory it must run in."""
        path = models.resolve(self.model)  # a broken folder fails here in one line, not in the server's child
        local = Path(path)
        if local.is_dir():
            models.check_chat_template(local)  # the server renders every request with it
        if self.engine == "vllm":
            argv = [_console_script("vllm", "vllm"), "serve", path, "--served-model-name", self.name]
            return [*argv, "--host", self.host, "--port", str(self.port), *self.extra_args], None
        argv = [_console_script("transformers", "serve"), "serve", "--host", self.host, "--port", str(self.port)]
        if not _cuda_available():
            argv += ["--device", "cpu"]
        # transformers serve pins the model under the string it was given: run it from the folder's parent
        # and give it the folder's name, so clients send the short name.
        if local.exists():
            return [*argv, *self.extra_args, local.resolve().name], local.resolve().parent
        return [*argv, *self.extra_args, path], None

    def start(self, ready_timeout: float = 300.0) -> LocalServer:
        if not port_is_free(self.host, self.port):
            raise BackendError(f"port {self.port} on {self.host} is already in use")
        argv, cwd = self.command()
        out: IO[bytes] | int = sys.stderr.fileno()  # the server's own log never mixes into our stdout
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            out = self._log_handle = self.log.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.engine == "transformers":
            # OpenMP threads that spin while they wait lose their time slice to whatever else runs on a busy machine:
            # 8 streamed requests beside 2 busy loops on 2 cores took 29.4 s spinning, 11.7 s passive (quiet: 8.2 s
            # and 7.4 s). A user's own setting wins.
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        # start_new_session: Ctrl-C in the terminal reaches us, and we stop the server deliberately.
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self.wait_ready(ready_timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        health = self.url.removesuffix("/v1") + "/health"
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise BackendError(
                    f"{self.engine} server exited with code {code} before it was ready{self._log_hint()}"
                )
            try:
                if httpx2.get(health, timeout=2.0).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise BackendError(f"{self.engine} server not ready after {timeout:g}s{self._log_hint()}")

    def _log_hint(self) -> str:
        return f" (log: {self.log})" if self.log else ""

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        process, self.process = self.process, None
        if interrupts.stopping():  # a signal: requests in flight are dropped, not finished; the process ends soon
            grace = min(grace, 2.0)
        if process is not None and process.poll() is None:
            for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None

    def __enter__(self) -> LocalServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def die_with_parent() -> None:
    """Linux: SIGKILL a child process (`preexec_fn`) when the process that started it dies, even by SIGKILL (no
    orphan eats the CPU)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
