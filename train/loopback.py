"""A distributed launcher for one node that listens on 127.0.0.1 only: `python -m memrl.train.loopback torchrun
ARGS` is `torchrun ARGS`, `... loopback accelerate launch ARGS` is `accelerate launch ARGS` (which runs torchrun's
code in its own process).

torchrun's rendezvous and its workers' key-value store are TCPStore servers, and a TCPStore server listens on every
interface (`::`) whatever host it is given: anyone who reaches the machine could join or disturb the run. The one
way torch offers to choose where a store listens is a socket handed to it (`master_listen_fd`); this entry point gives
each store server a socket bound to 127.0.0.1, then runs the launcher. The ranks' own traffic (gloo, NCCL's
bootstrap) stays on the loopback interface through GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (`distributed.py`).
Several nodes need stores the others reach: they run the launcher as it is.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _loopback_stores() -> None:
    """Make every TCPStore server created in this process (torchrun's) listen on 127.0.0.1."""
    import torch.distributed as dist

    base = dist.TCPStore
    listening: list[socket.socket] = []  # the stores use these sockets for as long as the process lives

    class LoopbackTCPStore(base):  # type: ignore[misc, valid-type]
        def __init__(self, host_name: str, port: int, *args: Any, **kwargs: Any) -> None:
            master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
            if master and kwargs.get("master_listen_fd") is None and host_name in LOOPBACK_HOSTS:
                sock = socket.create_server(("127.0.0.1", port))
                listening.append(sock)
                port = sock.getsockname()[1]
                kwargs["master_listen_fd"] = sock.fileno()
            super().__init__(host_name, port, *args, **kwargs)

    dist.TCPStore = LoopbackTCPStore  # type: ignore[misc]


def main() -> None:
    tool, args = sys.argv[1], sys.argv[2:]
    _loopback_stores()  # before the launcher's modules import the name
    if tool == "torchrun":
        from torch.distributed.run import main as torchrun

        torchrun(args)
    elif tool == "accelerate":
        from accelerate.commands.accelerate_cli import main as accelerate

        sys.argv = ["accelerate", *args]
        accelerate()
    else:
        raise SystemExit(f"usage: python -m memrl.train.loopback torchrun|accelerate ARGS (not {tool!r})")


if __name__ == "__main__":
    main()
