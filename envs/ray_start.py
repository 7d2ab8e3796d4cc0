"""Ray start-up: probe an address in one line, join a cluster or start a local Ray, and reap a killed driver's Ray.

A local Ray (no address, or `local`) is this machine's only: every process of it listens on 127.0.0.1 and accepts
only callers holding a token made for this process (`local_ray`). A cluster memrl joins is the user's; `cluster_auth`
says whether it asks for a token, so that `memrl preflight` and `memrl launch` can warn when it does not.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

from memrl.core import interrupts, secrets
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


# Ray's switch for a cluster of one machine (its default on macOS and Windows): the node's address is 127.0.0.1, so
# the GCS, raylet, workers, agents, dashboard and metrics all listen there, and no other node may join.
ONE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_token: str | None = None  # this process's local Ray token: made once, so Ray's cached copy never goes stale


def local_token() -> str:
    """The token of the local Rays this process starts: random, held in this process's environment while one runs
    (Ray's processes inherit it), never on a command line or in a file, masked wherever memrl prints."""
    global _token
    if _token is None:
        _token = os.urandom(32).hex()
        secrets.register([_token])
    return _token


@contextlib.contextmanager
def local_ray() -> Iterator[dict[str, Any]]:
    """The environment a local Ray starts in, for the body (the `ray.init` that starts it); yields its arguments.

    Token authentication with `local_token()` (Ray's own default would write a token to ~/.ray/auth_token for every
    later Ray on the machine to share), node address 127.0.0.1 and ONE_MACHINE (ray.init turns a 127.0.0.1 it is
    given into the machine's network address otherwise). Ray's processes keep the environment they started with."""
    wanted = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": local_token(), ONE_MACHINE: "0"}
    before = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    constants: Any = sys.modules.get("ray._private.ray_constants")  # read once at import: set here if Ray is loaded
    was = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        raylet = sys.modules.get("ray._raylet")
        if raylet is not None:  # Ray caches its config (the auth mode) and the token once read: read them again
            raylet.Config.initialize("")
            raylet.AuthenticationTokenLoader.instance().reset_cache()
        yield {"_node_ip_address": "127.0.0.1", "include_dashboard": False}
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = was


def start_ray(address: str | None, stack: contextlib.ExitStack) -> None:
    """Connect to `address` (or start a local Ray, `local_ray`) unless Ray is up already; the stack shuts down what
    it started."""
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
    setup = local_ray() if local else contextlib.nullcontext({"include_dashboard": False})
    if local:  # watches from before ray.init: a start-up that fails half-way leaves nothing running either
        stack.callback(_reaper())  # runs after ray.shutdown, registered below
    try:
        # ray.init replaces the SIGTERM handler (Ray's core worker aborts with a stack dump): memrl's stays.
        with interrupts.kept(), setup as options:
            ray.init(address="local" if local else address, runtime_env={"env_vars": env}, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {first_line(exc)}") from exc
    except Exception as exc:  # Ray's own "timed out during startup": a machine too busy to start it in time
        if not local:
            raise
        raise MemrlError(f"cannot start a local Ray: {first_line(exc)}") from exc
    stack.callback(ray.shutdown)


def cluster_auth(address: str, timeout: float = RAY_PROBE_S) -> bool:
    """Whether the Ray cluster whose GCS is at `address` (HOST:PORT) refuses callers without its token: one request
    sent with none. A cluster that answers it runs code for anyone who reaches it."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    request: Any = gcs_service_pb2.GetClusterIdRequest()  # type: ignore[attr-defined]  # generated: no stubs

    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(request, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return True
            raise MemrlError(f"cannot connect to the Ray cluster at {address}: {exc.details()}") from None
    return False


def job_server_auth(url: str, timeout: float = RAY_PROBE_S) -> bool:
    """Whether the Ray job server (dashboard) at `url` takes jobs only with the cluster's token: its public
    /api/authentication_mode says so (a Ray without token authentication has no such page)."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/authentication_mode", timeout=timeout) as reply:
            mode = json.loads(reply.read(2**16))
    except (urllib.error.URLError, OSError, ValueError, RecursionError):
        return False
    return isinstance(mode, dict) and mode.get("authentication_mode") == "token"


def token_headers() -> dict[str, str]:
    """The Authorization header Ray's own clients send a job server that takes a token: with RAY_AUTH_MODE=token
    and the token in this process's environment (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH) or ~/.ray/auth_token; none
    otherwise."""
    try:
        from ray._private.authentication import http_token_authentication as http_auth
    except ImportError:
        return {}
    return dict(http_auth.get_auth_headers_if_auth_enabled({}))


def no_token_line(where: str) -> str:
    """The one line for a cluster that refused this process: it takes a token that this shell does not hold."""
    return (
        f"the Ray cluster at {where} takes a token and refused this one (or none): export RAY_AUTH_MODE=token with "
        "the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN (see docs/cluster.md)"
    )


def no_auth_warning(where: str) -> str:
    """The one line that says a cluster takes no token, and the one-line fix."""
    return (
        f"the Ray cluster at {where} has no authentication: anyone who can reach it can run code as you. "
        "Start it with `RAY_AUTH_MODE=token ray start ...` and give memrl the same token (RAY_AUTH_TOKEN); "
        "see docs/cluster.md"
    )


# Notes the driver's Ray processes twice a second (those naming a Ray session folder, and Ray's agents and workers,
# titled `ray::...`) until its stdin closes, which happens when the driver exits however it exits (SIGKILL included),
# then kills those still running (psutil checks each one's start time, so a reused pid is spared).
_REAPER = """
import os, select, sys, psutil
driver, session, seen = psutil.Process(int(sys.argv[1])), "/session_", {}
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


def _reaper() -> Callable[[], None]:
    """A watchdog for the local Ray this driver started: a killed driver could leave Ray's dashboard and runtime-env
    agents alive for a minute (each reporting to the dead GCS), holding memory and CPU that the rerun needs. Returns
    what releases it on a normal exit (after `ray.shutdown`)."""
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(os.getpid())], stdin=subprocess.PIPE, start_new_session=True
    )
    stdin = watchdog.stdin
    assert stdin is not None

    def release() -> None:
        stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(10)  # what ray.shutdown left, if anything, is gone

    return release
