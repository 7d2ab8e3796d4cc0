"""Ray start-up: probe an address in one line, join a cluster or start a local Ray, and reap a killed driver's Ray."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any, cast

from memrl.core.errors import MemrlError, first_line

# The opening of an HTTP/2 connection (the client preface, then an empty SETTINGS frame): Ray's GCS is a gRPC
# server, and a gRPC server answers it with a SETTINGS frame of its own at once.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4  # the type of an HTTP/2 frame, its 4th byte
RAY_PROBE_S = 5.0


def probe_ray(address: str | None, timeout: float = RAY_PROBE_S) -> None:
    """Fail fast, in one line, on an address that is no Ray cluster: where nothing listens, or where a server that
    is not Ray (a web server, say) accepts the connection; ray.init would keep retrying for minutes. Takes the
    GCS's `HOST:PORT` and a Ray client's `ray://HOST:PORT` (both gRPC servers); `auto` (a cluster Ray finds) and
    `local` (a new one) are Ray's own."""
    if not address or address in ("auto", "local"):
        return
    scheme, sep, rest = address.rpartition("://")
    if sep and scheme != "ray":
        raise MemrlError(
            f"Ray address {address!r}: give the cluster's GCS address HOST:PORT (as `ray start --head` printed it), "
            "auto, or ray://HOST:PORT"
        )
    host, _, port = rest.rpartition(":")
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")  # the handshake below is cleartext HTTP/2
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            if tls:
                return
            sock.sendall(_HTTP2_PREFACE)
            head = _read(sock, 9)
    except (OSError, ValueError, OverflowError) as exc:  # OverflowError: a port past 65535
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {exc or type(exc).__name__}") from None
    if len(head) < 9 or head[3] != _SETTINGS:
        raise MemrlError(
            f"{address} is not a Ray cluster: the server there does not speak gRPC, as Ray's GCS does (give the "
            "address `ray start --head` printed, HOST:6379 by default)"
        )


def _read(sock: socket.socket, n: int) -> bytes:
    """Up to `n` bytes: fewer when the peer closes first."""
    data = b""
    while len(data) < n and (chunk := sock.recv(n - len(data))):
        data += chunk
    return data


def start_ray(address: str | None, stack: contextlib.ExitStack) -> None:
    """Connect to `address` (or start a local Ray) unless Ray is up already; the stack shuts down what it started."""
    import ray

    if ray.is_initialized():
        return
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    try:
        probe_ray(address or os.environ.get("RAY_ADDRESS"))  # ray.init reads RAY_ADDRESS when given no address
    except MemrlError as exc:
        raise MemrlError(f"{exc} (from $RAY_ADDRESS)" if not address else str(exc)) from None
    local = (address or os.environ.get("RAY_ADDRESS") or "local") == "local"  # a new Ray of this driver's own
    if local:
        # Ray's memory monitor kills the newest workers when the machine runs short, whoever holds the memory: on a
        # shared machine that is our sessions for another job's use. The kernel's OOM killer picks the hog instead.
        os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    try:
        context = ray.init(address=address, include_dashboard=False, runtime_env={"env_vars": env})
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {first_line(exc)}") from exc
    if local:
        session_dir = cast(Any, context).address_info["session_dir"]  # ray.init starts a local Ray: a RayContext
        stack.callback(_reaper(session_dir))  # runs after ray.shutdown, registered next
    stack.callback(ray.shutdown)


# Notes the driver's Ray processes twice a second (those naming the session folder, and Ray's agents and workers, titled
# `ray::...`) until its stdin closes, which happens when the driver exits however it exits (SIGKILL included), then
# kills those still running (psutil checks each one's start time, so a reused pid is spared).
_REAPER = """
import os, select, sys, psutil
driver, session, seen = psutil.Process(int(sys.argv[1])), sys.argv[2], {}
def note(p):
    try:
        line = " ".join(p.cmdline())
    except psutil.Error:  # gone already
        return
    if p.pid != os.getpid() and (session in line or line.startswith("ray::")):
        seen[p.pid] = p
while not (select.select([0], [], [], 0.5)[0] and not os.read(0, 1)):
    try:
        children = driver.children(recursive=True)
    except psutil.Error:  # the driver is gone
        break
    for p in children:
        note(p)
for p in seen.values():
    try:
        p.kill()
    except psutil.Error:
        pass
"""


def _reaper(session_dir: str) -> Callable[[], None]:
    """A watchdog for the local Ray this driver started: a killed driver could leave Ray's dashboard and runtime-env
    agents alive for a minute (each reporting to the dead GCS), holding memory and CPU that the rerun needs. Returns
    what releases it on a normal exit (after `ray.shutdown`)."""
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(os.getpid()), session_dir], stdin=subprocess.PIPE, start_new_session=True
    )
    stdin = watchdog.stdin
    assert stdin is not None

    def release() -> None:
        stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(10)  # what ray.shutdown left, if anything, is gone

    return release
