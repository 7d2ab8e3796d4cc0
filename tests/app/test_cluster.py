"""A real two-node Ray cluster on this machine (two raylets, one with the dashboard / job server): collab actors
spread over both nodes, `memrl launch` runs a stage as a Ray job, the dry run masks secrets, bad addresses fail.

The cluster is stopped by killing the processes that carry its own temp dirs in their command line or open files,
never with `ray stop`, which would stop every other Ray instance on the machine as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import MemrlCLI, stop_ray

from memrl.rollout.serve import free_port, free_ports

BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")
SECRET = f"sekrit-{os.urandom(4).hex()}"  # this process's own: a test worker beside it has another
QUICKSTART_STAGES = ["pull", "data", "sft", "grpo", "export", "eval"]


# The cluster takes a token, as docs/cluster.md sets one up: its two nodes listen beyond loopback (a cluster of
# several nodes must), so without one anything on the network could run code on it. Its processes, the CLI runs
# and this process (job client, state API) all get it through the environment (`cluster_auth`), never a file.
AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(32).hex()}


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
        **AUTH,
        "RAY_USAGE_STATS_ENABLED": "0",
        # A worker node on 2 busy cores can take longer than Ray's 30 s to register with the head (seen once under
        # the full suite: "GCS cannot find the node ... Try increase the RAY_raylet_start_wait_time_s config").
        "RAY_raylet_start_wait_time_s": "120",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # job entrypoints call `memrl` by name
        **extra,
    }


@dataclass
class Cluster:
    gcs: str  # host:port, as `ray start --address` takes it
    dashboard: str  # http://host:port, the job server
    roots: list[Path]

    def node_ids(self) -> set[str]:
        from ray.util.state import list_nodes

        return {n.node_id for n in list_nodes(address=self.dashboard) if n.state == "ALIVE"}


NODE_PORTS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


def _node_args(root: Path, picked: list[int] | None = None) -> list[str]:
    """Two raylets share this host: every port is picked free (and distinct: `free_ports`) instead of Ray's fixed
    defaults."""
    ports = dict(zip(NODE_PORTS, picked or free_ports(len(NODE_PORTS)), strict=True))
    return [
        "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--object-store-memory", str(100 * 2**20),
        "--temp-dir", str(root), "--disable-usage-stats",
        *(item for flag, port in ports.items() for item in (flag, str(port))),
    ]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def cluster_auth() -> Iterator[None]:
    """This process holds the cluster's token while the module runs (Ray reads it again: the cache is reset)."""
    with pytest.MonkeyPatch.context() as patch:  # a module-scoped fixture gets no `monkeypatch`; this one restores too
        for name, value in AUTH.items():
            patch.setenv(name, value)
        _reload_token()
        yield
    _reload_token()


def _reload_token() -> None:
    raylet: Any = sys.modules.get("ray._raylet")
    if raylet is not None:
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


@pytest.fixture(scope="module")
def cluster(model_cache: Path) -> Iterator[Cluster]:
    # Short temp dirs: Ray's socket paths live under them and must stay under the OS limit of 107 characters.
    roots = [Path(tempfile.mkdtemp(prefix="mrh", dir="/tmp")), Path(tempfile.mkdtemp(prefix="mrw", dir="/tmp"))]
    port, dashboard_port, client_port, *head_ports = free_ports(3 + len(NODE_PORTS))
    gcs = f"127.0.0.1:{port}"
    try:
        started = time.monotonic()
        head = subprocess.run(
            [
                RAY, "start", "--head", "--port", str(port), "--include-dashboard", "true",
                "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
                "--ray-client-server-port", str(client_port), *_node_args(roots[0], head_ports),
            ],
            capture_output=True, text=True, env=_env(), timeout=180,
        )  # fmt: skip
        assert head.returncode == 0, head.stderr[-2000:]
        worker = subprocess.run(
            [RAY, "start", "--address", gcs, *_node_args(roots[1])],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=180,
        )
        assert worker.returncode == 0, worker.stderr[-2000:]
        found = Cluster(gcs, f"http://127.0.0.1:{dashboard_port}", roots)
        deadline = time.monotonic() + 60
        while len(found.node_ids()) < 2:
            assert time.monotonic() < deadline, "the second node never joined"
            time.sleep(1)
        print(f"two-node cluster up in {time.monotonic() - started:.1f}s")
        yield found
    finally:
        stop_ray(roots)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _assert_spread(nodes: set[str], cluster: Cluster) -> None:
    """Every session names a live node of this cluster, and together they cover both nodes."""
    alive = cluster.node_ids()
    assert nodes <= alive
    assert nodes == alive  # envs.pool.spawn_workers deals workers round-robin over the live nodes


@dataclass
class Background:
    """A `memrl` CLI run started in the background: `wait()` gives its exit code, stdout and stderr."""

    process: subprocess.Popen[str]
    out: Path

    def wait(self, timeout: float = 600) -> tuple[int, str, str]:
        code = self.process.wait(timeout=timeout)
        return code, (self.out / "cli.stdout").read_text(), (self.out / "cli.stderr").read_text()


@pytest.fixture(scope="module")
def collab_eval(cluster: Cluster, tiny_qwen2: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    """`memrl eval collab` against the cluster's GCS, started once and left running: the launch test's Ray job runs
    beside it (both spread their actors over the two nodes; the actors ask for no CPU), and the collab test reads it."""
    from support import MEMRL_ARGV

    root = tmp_path_factory.mktemp("collab-eval")
    out = root / "collab"
    argv = [
        *MEMRL_ARGV, "eval", "collab", "--model", tiny_qwen2, "--users", "2", "--sessions", "1", "--max-turns", "2",
        "--max-tokens", "8", "--reflection-max-tokens", "8", "--workers", "2", "--ray-address", cluster.gcs,
        "--out", str(out),
    ]  # fmt: skip
    with open(root / "cli.stdout", "w") as stdout, open(root / "cli.stderr", "w") as stderr:
        process = subprocess.Popen(argv, stdout=stdout, stderr=stderr, text=True, env=_env())
    run = Background(process, root)
    try:
        yield run
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_launch_runs_a_stage_as_a_ray_job(
    cluster: Cluster, collab_eval: Background, tiny_qwen2: str, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    # `collab_eval` is requested only to start it now: it runs beside this job, test_collab_eval_... reads it.
    from ray.job_submission import JobStatus, JobSubmissionClient

    work, run_dir = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    (work / "notes.txt").write_text("uploaded as the job's working dir\n")
    result = memrl_cli(
        "launch", "quickstart", "--smoke", "--ray-address", cluster.gcs, "--stage", "data", f"output_dir={run_dir}",
        "stages.data.train_users=2", "stages.data.eval_users=1", "stages.data.collab.sessions=1",
        "stages.data.collab.workers=2", "stages.data.collab.sampling.agent.max_tokens=8",
        cwd=work, env=_env(WANDB_API_KEY=SECRET),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    assert "no authentication" not in result.stderr  # the cluster takes a token: nothing to warn about
    # The job's own log comes back on the console.
    assert "data: 2 train / 1 eval reflection samples" in result.stdout
    job_id = next(w for w in result.stderr.split() if w.startswith("raysubmit_"))
    info = JobSubmissionClient(cluster.dashboard).get_job_info(job_id)
    assert info.status == JobStatus.SUCCEEDED
    assert info.entrypoint.startswith("memrl run .memrl-launch/quickstart-")
    assert info.entrypoint.endswith("--stage data")
    assert info.runtime_env["env_vars"]["WANDB_API_KEY"] == SECRET  # the secret travelled in the submission only

    stats = json.loads((run_dir / "data" / "stats.json").read_text())
    assert stats["train"]["records"] == 2
    assert (run_dir / "data" / "sft").is_dir()
    assert (run_dir / "recipe.resolved.yaml").is_file()
    train = _records(run_dir / "data" / "collab-train" / "sessions.jsonl")
    assert len(train) == 2
    nodes = {r["node"] for r in train}

    written = [p for root in (run_dir, work) for p in root.rglob("*") if p.is_file()]
    assert any(p.parent.name == ".memrl-launch" for p in written)
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    _assert_spread(nodes, cluster)  # the job's collab actors used both nodes


@pytest.mark.slow
def test_collab_eval_spreads_over_both_nodes(cluster: Cluster, collab_eval: Background) -> None:
    code, _, stderr = collab_eval.wait()
    assert code == 0, stderr[-3000:]
    out = collab_eval.out / "collab"
    records = _records(out / "sessions.jsonl")
    assert len(records) == 2
    assert len({r["key"] for r in records}) == 2
    assert {r["session"] for r in records} == {0}
    assert len({r["user_id"] for r in records}) == 2
    assert all(r["turns"] for r in records)
    # Each worker records the node it ran on: two workers spread over two nodes run one session each.
    _assert_spread({r["node"] for r in records}, cluster)


# A verl stage's Ray job, its entrypoint swapped for this probe: is the key there, and on any command line of the host?
SECRET_PROBE = """
import hashlib, os, pathlib
key = os.environ.get("WANDB_API_KEY", "").encode()
print("key ok:", hashlib.sha256(key).hexdigest() == "{digest}")
lines = []
for proc in pathlib.Path("/proc").iterdir():
    try:
        lines.append((proc / "cmdline").read_bytes())
    except OSError:
        pass
print("command lines holding it:", sum(key in line for line in lines), "of", len(lines))
"""


@pytest.mark.slow
def test_verl_ray_job_gets_secrets_through_no_command_line(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The job's runtime_env went through `ray job submit --runtime-env-json` with the keys filled in."""
    import hashlib

    from memrl.train.config import ClusterConfig
    from memrl.train.verl.command import run_verl, verl_command

    for name, value in _env(WANDB_API_KEY=SECRET, HF_TOKEN=SECRET).items():
        monkeypatch.setenv(name, value)
    argv = verl_command("grpo", [], ClusterConfig(ray_address=cluster.dashboard), python=sys.executable)
    probe = SECRET_PROBE.format(digest=hashlib.sha256(SECRET.encode()).hexdigest())
    argv = [*argv[: argv.index("--") + 1], sys.executable, "-c", probe]
    log = tmp_path / "verl.log"
    assert run_verl(argv, log) == 0
    text = log.read_text()
    assert "key ok: True" in text  # the job got the key ...
    assert "command lines holding it: 0 of" in text  # ... while no process on the host had it in its argv
    out, err = capfd.readouterr()
    assert "key ok: True" in out and "Ray job raysubmit_" in err
    assert SECRET not in text + out + err
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


# A verl GRPO stage's Ray job (`memrl run` with cluster.ray_address, or `memrl launch`), its entrypoint swapped for
# this: like `memrl run`, it derives the judge's key and the unscored stop into the environment of the verl process,
# which joins the cluster through verl.main's ray.init and starts verl's own reward workers (verl's RewardLoopManager:
# round-robin over the nodes, each loading memrl's reward function by module); each says what it sees (the key only
# as a match, never its value).
VERL_JOB = """
import os, subprocess, sys
env = dict(os.environ) | {{"MEMRL_JUDGE_API_KEY": "{key}", "MEMRL_UNSCORED": '{{"stop": {{"steps": 2}}}}'}}
sys.exit(subprocess.run([sys.executable, "verl_process.py"], env=env).returncode)
"""
VERL_PROCESS = """
import hashlib, json, os, ray
from verl.experimental.reward_loop.reward_loop import RewardLoopManager
from memrl.train.verl import main as verl_main
from memrl.train.verl.validate import PPO_CONFIG, compose
cfg = compose(PPO_CONFIG, [
    "+ray_kwargs.ray_init.address=auto", "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_DIR=/from/verl/config",
    "actor_rollout_ref.model.path={model}", "reward.num_workers=2",
    "reward.custom_reward_function.path=pkg://memrl.train.verl.rewards",
    "reward.custom_reward_function.name=compute_score_async",
])
verl_main.init_ray(cfg)

def seen(worker):
    key = os.environ.get("MEMRL_JUDGE_API_KEY", "").encode()
    out = {{n: os.environ.get(n) for n in ("WANDB_MODE", "WANDB_DIR", "MEMRL_UNSCORED")}}
    out["key_ok"] = hashlib.sha256(key).hexdigest() == "{digest}"
    fn = worker.reward_manager.compute_score.args[0]  # verl's partial(call, raw function, reward_kwargs)
    out["reward_fn"] = f"{{fn.__module__}}.{{fn.__name__}}"
    return out | {{"node": ray.get_runtime_context().get_node_id()}}

workers = RewardLoopManager(cfg).reward_loop_workers
print("SEEN " + json.dumps(ray.get([w.__ray_call__.remote(seen) for w in workers])))
"""


@pytest.mark.slow
def test_verl_workers_on_every_node_see_the_jobs_environment(
    cluster: Cluster, tiny_qwen2: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of verl joining a cluster saw only verl's runtime_env: WANDB_MODE and the keys memrl
    derives in the job never arrived. WANDB_DIR in the job's runtime_env and in verl's made Ray
    refuse to merge them. Here: a `ray job submit` as `memrl run` sends it, WANDB_DIR in both."""
    import hashlib

    from memrl.train.config import ClusterConfig
    from memrl.train.verl.command import run_verl, verl_command

    for name, value in _env(WANDB_MODE="offline", WANDB_DIR="/from/the/job").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    (work / "verl_job.py").write_text(VERL_JOB.format(key=SECRET))
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    (work / "verl_process.py").write_text(VERL_PROCESS.format(digest=digest, model=tiny_qwen2))
    argv = verl_command("grpo", [], ClusterConfig(ray_address=cluster.dashboard), working_dir=work)
    assert "RAY_OVERRIDE_JOB_RUNTIME_ENV" not in argv[argv.index("--runtime-env-json") + 1]
    argv = [*argv[: argv.index("--") + 1], sys.executable, "verl_job.py"]
    log = tmp_path / "verl.log"
    run_verl(argv, log)
    text = log.read_text()
    seen = json.loads(next(line for line in text.splitlines() if line.startswith("SEEN "))[5:])
    assert {w["node"] for w in seen} == cluster.node_ids()  # a worker on each node, the job's own and the other
    for worker in seen:
        assert worker["reward_fn"] == "memrl.train.verl.rewards.compute_score_async", worker  # loaded by module
        assert worker["key_ok"], worker
        assert worker["WANDB_MODE"] == "offline"
        assert worker["WANDB_DIR"] == "/from/verl/config"  # the stage folder verl's config names wins
        assert json.loads(worker["MEMRL_UNSCORED"])["stop"]["steps"] == 2
    assert SECRET not in text


@pytest.mark.slow
def test_launch_sees_how_many_gpus_a_node_of_the_cluster_has(cluster: Cluster) -> None:
    """A TRL, LLaMA-Factory or one-process judger job asks Ray for its trainer's GPUs only where a node has some:
    `memrl launch` reads the live nodes through the job server (token auth included). This cluster's two nodes
    declare none; a third joins declaring 2 (Ray takes the count as given: no GPU needed here) and is stopped."""
    from memrl.train.ray_jobs import node_gpus

    assert node_gpus(cluster.dashboard) == 0
    root = Path(tempfile.mkdtemp(prefix="mrg", dir="/tmp"))
    try:
        joined = subprocess.run(
            [RAY, "start", "--address", cluster.gcs, *_node_args(root), "--num-gpus", "2"],
            capture_output=True, text=True, env=_env(), timeout=180,
        )  # fmt: skip
        assert joined.returncode == 0, joined.stderr[-2000:]
        deadline = time.monotonic() + 60
        while (seen := node_gpus(cluster.dashboard)) != 2:
            assert time.monotonic() < deadline, f"the GPU node never showed: {seen}"
            time.sleep(1)
    finally:
        stop_ray([root])
    deadline = time.monotonic() + 60
    while len(cluster.node_ids()) > 2:  # the tests after this one see the two nodes they started with
        assert time.monotonic() < deadline, "the GPU node never left"
        time.sleep(1)


@pytest.mark.slow
def test_dry_run_prints_every_stage_and_masks_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Both dry runs in this process (`memrl.app.cli.main.main`, as the `memrl` script runs it): they start nothing,
    so a fresh interpreter per run would only add its start-up."""
    from memrl.app.cli.main import main

    def memrl_here(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        with monkeypatch.context() as patch:
            patch.chdir(work)
            for name, value in _env(**env).items():
                patch.setenv(name, value)
            capfd.readouterr()
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            out, err = capfd.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    work, run_dir = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    result = memrl_here(
        "launch", "quickstart", "--ray-address", "http://127.0.0.1:9", "--dry-run", f"output_dir={run_dir}",
        WANDB_API_KEY=SECRET, HF_TOKEN=SECRET, MEMRL_PLAIN="shown",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for name in QUICKSTART_STAGES:
        assert f"stage {name} (" in out
        assert f" --stage {name}\n" in out
    assert out.count("entrypoint: memrl run .memrl-launch/quickstart-") == len(QUICKSTART_STAGES)
    runtime_envs = [
        json.loads(line.split("runtime_env: ", 1)[1]) for line in out.splitlines() if "runtime_env: " in line
    ]
    assert len(runtime_envs) == len(QUICKSTART_STAGES)
    env_vars = runtime_envs[0]["env_vars"]
    assert env_vars["WANDB_API_KEY"] == env_vars["HF_TOKEN"] == "***"
    assert env_vars["MEMRL_PLAIN"] == "shown"
    assert runtime_envs[0]["working_dir"] == str(work.resolve())
    assert {".venv", ".git", ".cache", "runs"} <= set(runtime_envs[0]["excludes"])
    assert SECRET not in out + result.stderr
    assert not run_dir.exists()
    assert not (work / ".memrl-launch").exists()

    # verl: the stage runs inside its job and joins the cluster; the recipe's nodes and GPUs reach verl.
    verl = memrl_here(
        "launch", "reflector-qwen2.5-7b", "--ray-address", "http://head:8265", "--dry-run", "--stage", "grpo"
    )
    assert verl.returncode == 0, verl.stderr[-3000:]
    assert "-m memrl.train.verl.main" in verl.stdout
    assert "+ray_kwargs.ray_init.address=auto" in verl.stdout
    assert "trainer.nnodes=1" in verl.stdout
    assert "trainer.n_gpus_per_node=4" in verl.stdout  # the judge's server keeps GPUs 4-7 (placement)
    assert "ray job submit" not in verl.stdout


def test_launch_keeps_the_outcome_reward_of_a_verl_grpo_stage(tmp_path: Path) -> None:
    """The job recipe appended `reward...path=pkg://memrl.rewards.verl_reward` after the stage's own
    reward, and Hydra kept the last: the next-session outcome reward was dropped under `memrl launch`."""
    import io

    from rich.console import Console

    from memrl.app import launch
    from memrl.app.recipe import load_recipe
    from memrl.app.stages.training import verl_command

    loaded = load_recipe(
        "reflector-outcome-quickstart",
        ["stages.grpo.trainer=verl", "stages.grpo.cluster.gpus_per_node=1", f"output_dir={tmp_path}"],
    )
    data, *_ = launch.job_recipe(loaded, "http://head:8265")
    recipe = launch.validate_job_recipe(data, loaded.recipe.name).recipe
    ctx = recipe.context(recipe.run_dir, Console(file=io.StringIO()))
    argv = verl_command(recipe.stages["grpo"], ctx, "grpo", dry_run=True).argv
    paths = [a.split("=", 1)[1] for a in argv if a.startswith("reward.custom_reward_function.path=")]
    assert paths == ["pkg://memrl.train.verl.rewards"]
    assert "+ray_kwargs.ray_init.address=auto" in argv


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["quickstart", "--ray-address", "127.0.0.1:{port}"], "cannot connect to the Ray cluster at 127.0.0.1:"),
        (["quickstart", "--ray-address", "http://127.0.0.1:{port}"], "cannot reach the Ray job server at http://"),
        (["quikstart", "--ray-address", "127.0.0.1:{port}"], "did you mean 'quickstart'"),
        (["quickstart", "--ray-address", "127.0.0.1:{port}", "seed=x"], "seed"),
    ],
)
def test_bad_input_fails_in_one_line(args: list[str], message: str, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    port = str(free_port())
    result = memrl_cli("launch", *(a.replace("{port}", port) for a in args), cwd=tmp_path, timeout=120, env=_env())
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("memrl: error: ")
    assert message in lines[0]
