"""`memrl preflight`: one line per problem and exit 2, or a table and exit 0."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from support import MemrlCLI

KEY = "preflight-test-key"


class _Chat(BaseHTTPRequestHandler):
    """The OpenAI chat-completions shape, nothing more: this tests the HTTP probe, not a model. A request without
    the key gets 401, as a keyed vLLM server answers."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self._send(401, {"error": {"message": "invalid api key"}})
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        return self._send(
            200,
            {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice], "usage": usage},
        )

    def _send(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def chat_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_a_cpu_recipe_against_a_live_keyed_endpoint_is_ready(
    chat_server: str, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    env = {"MEMRL_ENDPOINT": chat_server, "OPENAI_API_KEY": KEY, "PATH": "/usr/bin:/bin"}
    args = ("preflight", "endpoint", f"output_dir={tmp_path / 'run'}")
    ready = memrl_cli(*args, cwd=tmp_path, env=env, timeout=120)
    assert ready.returncode == 0, ready.stderr[-2000:]
    assert "endpoint: ready" in ready.stdout and chat_server in ready.stdout and "writable" in ready.stdout
    assert not (tmp_path / "run").exists()  # a preflight writes nothing

    refused = memrl_cli(*args, cwd=tmp_path, env=env | {"OPENAI_API_KEY": "wrong"}, timeout=120)
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memrl: preflight: endpoint: generate policy")
    assert "401" in lines[0] and "wrong" not in lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this node has GPUs: the check would pass")
def test_the_gpu_recipe_on_a_cpu_node_names_the_missing_gpus_and_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """In this process (`memrl.app.cli.main.main`, as the `memrl` script runs it): verl's config check imports verl
    here, where the suite has usually imported it already; the import check still runs in its own interpreter."""
    from memrl.app.cli.main import main

    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    try:
        main(["preflight", "reflector-qwen2.5-7b", "--stage", "grpo"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capfd.readouterr()
    assert code == 2, out[-2000:] + err[-2000:]
    problems = err.strip().splitlines()
    assert all(line.startswith("memrl: preflight: ") for line in problems)
    assert "memrl: preflight: GPUs: stage grpo asks for 8 GPUs on this node; torch sees no CUDA device" in problems
    assert any("package: vllm does not import" in line for line in problems)
    assert any("endpoint: grpo judge" in line and "127.0.0.1:8000" in line for line in problems)


@pytest.mark.slow
def test_a_ray_worker_sees_the_variables_the_job_forwards(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """`--ray local` starts a real local Ray and one task, with the runtime env memrl's verl entry builds."""
    env = {**os.environ, "WANDB_MODE": "offline", "MEMRL_JUDGE_API_KEY": "k"}
    result = memrl_cli(
        "preflight", "quickstart", "--stage", "export", "--ray", "local", f"output_dir={tmp_path / 'run'}",
        cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "a worker sees" in result.stdout


# ---- a Ray cluster without authentication: a warning, with the fix ------------------------------------------------

NO_AUTH = "has no authentication: anyone who can reach it can run code as you"
TOKEN = "0123456789abcdef" * 4  # the stand-in job server's token


@pytest.mark.slow
def test_preflight_warns_on_a_ray_cluster_without_authentication(
    tmp_path: Path, memrl_cli: MemrlCLI, ray_head: dict[str, str]
) -> None:
    """A head started as `RAY_AUTH_MODE=disabled ray start --head` gets the one-line warning (and its fix); the
    session's head, which takes a token, and `--ray local` (memrl's own) get none."""
    from support import ray_head_node

    args = ("preflight", "quickstart", "--stage", "export", f"output_dir={tmp_path / 'run'}")
    with ray_head_node({"RAY_AUTH_MODE": "disabled"}) as open_head:
        env = {**os.environ, **open_head}
        result = memrl_cli(*args, "--ray", open_head["RAY_ADDRESS"], cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]  # a warning, not a problem: the cluster is the user's
    warnings = [line for line in result.stderr.splitlines() if line.startswith("memrl: preflight: warning: ")]
    assert len(warnings) == 1 and NO_AUTH in warnings[0] and "RAY_AUTH_MODE=token" in warnings[0], result.stderr
    assert open_head["RAY_ADDRESS"] in warnings[0]
    result = memrl_cli(*args, "--ray", ray_head["RAY_ADDRESS"], cwd=tmp_path, env={**os.environ, **ray_head})
    assert result.returncode == 0 and NO_AUTH not in result.stderr, result.stderr[-2000:]


class _Dashboard(BaseHTTPRequestHandler):
    """A Ray job server's two public pages, with the authentication mode the path's first part names."""

    def do_GET(self) -> None:
        mode, _, page = self.path.lstrip("/").partition("/")
        answers = {"api/version": {"ray_version": "2.60.0"}, "api/authentication_mode": {"authentication_mode": mode}}
        if page not in answers or (page == "api/authentication_mode" and mode == "old"):  # a Ray before tokens
            self.send_response(404)
            self.end_headers()
            return
        if page == "api/version" and mode == "token" and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)  # as Ray's job server answers a request without the cluster's token
            self.end_headers()
            return
        data = json.dumps(answers[page]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("mode", "warned"), [("disabled", True), ("old", True), ("token", False)])
def test_launch_warns_on_a_job_server_without_authentication(
    mode: str, warned: bool, dashboard: str, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    from memrl.envs.ray_start import job_server_auth

    url = f"{dashboard}/{mode}"
    assert job_server_auth(url) is not warned
    # A process of its own: Ray's loggers keep the stream they first saw, which in-process runs close behind them.
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}  # the token is sent where one is asked
    result = memrl_cli("launch", "generate", "--ray-address", url, cwd=tmp_path, timeout=300, env=env)
    code, stderr = result.returncode, result.stderr
    # The stand-in takes no job: the launch then fails in its one line, after the warning.
    assert code == 2 and "Traceback" not in stderr and stderr.splitlines()[-1].startswith("memrl: error: "), stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("memrl: warning: ")]
    assert warnings == ([f"memrl: warning: the Ray cluster at {url} {NO_AUTH}. Start it with `RAY_AUTH_MODE=token "
                         "ray start ...` and give memrl the same token (RAY_AUTH_TOKEN); see docs/cluster.md"]
                        if warned else []), stderr  # fmt: skip


@pytest.mark.parametrize("held", [None, "another-token-" * 3])
def test_launch_without_the_clusters_token_is_one_line(
    held: str | None, dashboard: str, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    """A job server that takes a token, and a shell that holds none or another: one line saying what to set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp_path)}
    if held is not None:
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": held}
    result = memrl_cli("launch", "generate", "--ray-address", f"{dashboard}/token", cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"memrl: error: the Ray cluster at {dashboard}/token takes a token and refused this one (or none): export "
        "RAY_AUTH_MODE=token with the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN (see docs/cluster.md)"
    ], result.stderr
