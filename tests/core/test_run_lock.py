"""Files and processes. The run folder's lock never writes through a link planted at its path, and
names the right file when a write fails; a Ray address where a server that is not Ray listens fails in one line
within seconds, where ray.init would retry for 10+ minutes."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FIXTURES, memrl_in_process

from memrl.core.errors import MemrlError
from memrl.core.runfolder import LOCK_FILE, hold

MSTOD = FIXTURES / "mstod"


def test_a_link_planted_at_the_lock_is_replaced_never_written_through(tmp_path: Path) -> None:
    out, target = tmp_path / "out", tmp_path / "precious.txt"
    out.mkdir()
    target.write_text("keep me\n")
    (out / LOCK_FILE).symlink_to(target)
    with hold(out):
        lock = out / LOCK_FILE
        assert not lock.is_symlink() and lock.read_text() == f"{os.getpid()}\n"
    assert target.read_text() == "keep me\n" and not (out / LOCK_FILE).exists()


def test_a_second_run_reads_the_owner_without_following_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "pid"
    elsewhere.write_text("4242\n")
    with hold(tmp_path / "out"):
        (tmp_path / "out" / LOCK_FILE).unlink()
        (tmp_path / "out" / LOCK_FILE).symlink_to(elsewhere)
        with pytest.raises(MemrlError, match=r"in use by another memrl run \(its pid not written yet\)"):
            _hold(tmp_path / "out")


def test_a_folder_at_the_lock_path_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "out" / LOCK_FILE).mkdir(parents=True)
    with pytest.raises(MemrlError, match=f"cannot write the run folder's lock file {tmp_path / 'out' / LOCK_FILE}"):
        _hold(tmp_path / "out")


def _hold(out: Path) -> None:
    with hold(out):
        pass


def test_a_failed_lock_write_names_the_lock(tmp_path: Path) -> None:
    """A file size limit of 0 fails the pid's `write` (EFBIG) as a full disk does (ENOSPC): no file name in it."""
    script = (
        "import resource, signal, sys\nfrom pathlib import Path\nfrom memrl.core.runfolder import hold\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nresource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))\n"
        "with hold(Path(sys.argv[1])):\n    pass\n"
    )
    run = subprocess.run([sys.executable, "-c", script, tmp_path / "out"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert f"MemrlError: cannot write the run folder's lock file {tmp_path / 'out' / LOCK_FILE}: file too large" in (
        run.stderr
    )


def test_a_failed_write_in_the_run_is_reported_not_the_lock(tmp_path: Path) -> None:
    """A read-only remount fails the lock's removal too: the error is still the run's own, naming its file."""
    out = tmp_path / "out"
    data = out / "sessions.jsonl"
    with pytest.raises(OSError, match="No space left") as caught:
        _fail_to_write(out, data)
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(data)


def _fail_to_write(out: Path, data: Path) -> None:
    with hold(out):
        (out / LOCK_FILE).unlink()
        (out / LOCK_FILE / "x").mkdir(parents=True)  # its removal fails (EISDIR), as on a read-only disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(data))


# ---- a Ray address where no Ray listens ----------------------------------------------------------------------------


@pytest.fixture
def not_ray() -> Iterator[int]:
    """A port that accepts connections and answers each with bytes no HTTP client nor Ray understands."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"garbage \x00\xff not a protocol\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def _one_line(code: int, err: str, started: float) -> str:
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert time.monotonic() - started < 30
    return err.strip().splitlines()[-1]


def test_a_ray_address_that_is_no_ray_fails_in_one_line(tmp_path: Path, not_ray: int) -> None:
    started = time.monotonic()
    argv = ["eval", "tod", "--data", MSTOD, "--reader", "template", "--retriever", "bm25", "--judger", "none"]
    line = _one_line(
        *memrl_in_process([*argv, "--out", tmp_path / "tod", "--ray-address", f"127.0.0.1:{not_ray}"]), started
    )
    assert f"127.0.0.1:{not_ray} is not a Ray cluster" in line
    line = _one_line(
        *memrl_in_process([*argv, "--out", tmp_path / "tod", "--ray-address", "http://127.0.0.1:1"]), started
    )
    assert "Ray address 'http://127.0.0.1:1': give the cluster's GCS address HOST:PORT" in line
    check = ["preflight", "quickstart", "--stage", "export", "--ray", f"127.0.0.1:{not_ray}", f"output_dir={tmp_path}"]
    line = _one_line(*memrl_in_process(check), started)
    assert line == f"memrl: preflight: ray: 127.0.0.1:{not_ray} is not a Ray cluster: " + (
        "the server there does not speak gRPC, as Ray's GCS does (give the address `ray start --head` printed, "
        "HOST:6379 by default)"
    )


@pytest.mark.parametrize("scheme", ["", "http://"])
def test_launch_at_a_server_that_is_no_ray_fails_in_one_line(tmp_path: Path, not_ray: int, scheme: str) -> None:
    started = time.monotonic()
    code, err = memrl_in_process(["launch", "endpoint", "--ray-address", f"{scheme}127.0.0.1:{not_ray}"], cwd=tmp_path)
    line = _one_line(code, err, started)
    assert f"127.0.0.1:{not_ray}" in line and (
        "is not a Ray cluster" in line or "cannot reach the Ray job server" in line
    )


@pytest.mark.parametrize("address", ["garbage", "http://", "head:99999", "auto", "http://head:port", ":6379"])
def test_launch_refuses_a_malformed_address_even_in_a_dry_run(tmp_path: Path, address: str) -> None:
    code, err = memrl_in_process(["launch", "endpoint", "--ray-address", address, "--dry-run"], cwd=tmp_path)
    line = _one_line(code, err, time.monotonic())
    assert line == f"memrl: error: --ray-address {address!r}: give the job server (http://HOST:8265) or the GCS " + (
        "address (HOST:PORT)"
    )
