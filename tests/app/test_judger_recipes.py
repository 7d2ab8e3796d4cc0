"""The judger recipes: they resolve, the 8B one prints its torchrun + ZeRO-3 launch, bad data fails in one line,
and end to end on the shipped MS-TOD fixture: `memrl data judger` -> `memrl run judger-minilm-cpu --smoke`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from support import FIXTURES, MemrlCLI, memrl_in_process

from memrl.app.recipe import load_recipe
from memrl.app.runner import run_recipe
from memrl.app.stages.registry import KINDS
from memrl.core.errors import ConfigError
from memrl.train.config import ClusterConfig, JudgerStage
from memrl.train.distributed import resolve_refs, torchrun_command
from memrl.train.judger.deepspeed_zero import deepspeed_config
from memrl.train.processes import format_command


def test_both_recipes_resolve() -> None:
    cpu = load_recipe("judger-minilm-cpu", ["data=J"]).recipe
    judger, evaluation = cpu.stages["judger"], cpu.stages["eval"]
    assert isinstance(judger, JudgerStage) and isinstance(evaluation, KINDS["eval_judger"].config)
    assert (cpu.data, judger.head, judger.lora, judger.pos_weight, judger.distributed) == (
        "J", "cross_encoder", None, "auto", False
    )  # fmt: skip
    assert cpu.models["judger"].model == "all-minilm-l6-v2" and str(evaluation.judger) == "judger"
    smoke = load_recipe("judger-minilm-cpu", smoke=True).recipe.stages["judger"]
    assert isinstance(smoke, JudgerStage) and smoke.max_steps == 3

    big = load_recipe("judger-llama3.1-8b").recipe
    stage = big.stages["judger"]
    assert isinstance(stage, JudgerStage)
    assert big.models["judger"].model == "meta-llama/Llama-3.1-8B-Instruct"
    assert (stage.head, stage.deepspeed, stage.bf16, stage.world_size) == ("yes_no", "zero3", True, 8)
    assert stage.lora is not None and stage.batch_size % (stage.micro_batch_size * stage.world_size) == 0


@pytest.mark.parametrize(
    ("name", "smoke"),
    [("judger-minilm-cpu", False), ("judger-minilm-cpu", True), ("tod", False), ("tod", True),
     ("judger-llama3.1-8b", False)],
)  # fmt: skip
def test_the_judger_trains_on_what_eval_ranks_and_eval_takes_its_alpha(name: str, smoke: bool) -> None:
    stages = load_recipe(name, ["data=J"], smoke=smoke).recipe.stages
    judger, evaluation = stages["judger"], stages["eval"]
    assert isinstance(judger, JudgerStage)
    assert (judger.selection.retriever, judger.selection.top_units) == (evaluation.retriever, evaluation.top_units)
    assert judger.selection.require_positive and judger.alpha_dev_fraction > 0
    assert evaluation.alpha is None  # the alpha the judger chose on its dev individuals


def test_8b_dry_run_prints_the_torchrun_launch(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    result = memrl_cli(
        "run", "judger-llama3.1-8b", "--dry-run", "data=J", f"output_dir={tmp_path / 'run'}", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout + result.stderr
    launch = "-m memrl.train.loopback torchrun --nnodes=1 --standalone --nproc-per-node=8 -m memrl.app.stage_main"
    assert launch in out and "GLOO_SOCKET_IFNAME=lo" in out  # one node: loopback only (train/loopback.py)
    assert f"{tmp_path / 'run'}/recipe.resolved.yaml --stage judger" in out
    assert "deepspeed/zero3.json" in out and "memrl eval judger" in out
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_deepspeed_configs_parse() -> None:
    pytest.importorskip("deepspeed")  # an optional extra (memrl[deepspeed]); the HF config parser needs it
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = TrainingArguments(output_dir="unused", per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             bf16=True, use_cpu=True, report_to="none")  # fmt: skip
    for name, stage in (("zero2", 2), ("zero3", 3)):
        config = HfTrainerDeepSpeedConfig(str(deepspeed_config(name)))
        config.trainer_config_process(args)  # fills the "auto" values from the Trainer's arguments
        assert config.get_value("zero_optimization.stage") == stage
        assert config.get_value("train_micro_batch_size_per_gpu") == 4 and config.get_value("bf16.enabled")
    with pytest.raises(ConfigError, match="neither zero2 nor zero3 nor an existing JSON file"):
        deepspeed_config("zero4")


def test_multi_node_command_keeps_rendezvous_references() -> None:
    argv = torchrun_command("memrl.app.stage_main", Path("r.yaml"), "judger", ClusterConfig(nnodes=2, gpus_per_node=8))
    shown = format_command(argv)
    assert '"--node-rank=${NODE_RANK}"' in shown and "--nnodes=2" in shown and "--standalone" not in shown
    env = {"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"}
    assert "--rdzv-endpoint=10.0.0.1:29500" in resolve_refs(argv, env)
    with pytest.raises(ConfigError, match="set MASTER_ADDR on every node"):
        resolve_refs(argv, {"NODE_RANK": "0"})
    with pytest.raises(ConfigError, match="torchrun, not Ray"):
        torchrun_command(
            "memrl.app.stage_main", Path("r.yaml"), "judger", ClusterConfig(ray_address="ray://head:10001")
        )


def test_missing_data_fails_in_one_line(tmp_path: Path) -> None:
    console = Console(stderr=True, quiet=True)
    loaded = load_recipe("judger-minilm-cpu", ["data=null", f"output_dir={tmp_path / 'a'}"])
    with pytest.raises(ConfigError, match=r"stages.judger.data: no judger data; .* data=DIR") as err:
        run_recipe(loaded, console, only=["judger"], dry_run=True)
    assert "\n" not in str(err.value)
    loaded = load_recipe("judger-minilm-cpu", [f"data={tmp_path / 'J'}", f"output_dir={tmp_path / 'b'}"])
    with pytest.raises(ConfigError, match=r"J/train/pairs.jsonl does not exist: build judger data with `memrl data"):
        run_recipe(loaded, console, only=["judger"])


@pytest.fixture(scope="module")
def judger_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`memrl data judger` on the shipped MS-TOD fixture (4 train and 2 eval individuals)."""
    from typer.testing import CliRunner

    from memrl.app.cli.data import data_app

    out = tmp_path_factory.mktemp("judger-data") / "J"
    args = ["judger", "--tod-dir", str(FIXTURES / "mstod"), "--out", str(out), "--eval-fraction", "0.34"]
    result = CliRunner().invoke(data_app, args)
    assert result.exit_code == 0, result.output
    return out


def _memrl_here(*args: object, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """`memrl ARGS` in this process: the stages below train in this process (or under torchrun, in processes of
    their own) either way, so a fresh interpreter for the CLI would only add its start-up."""
    return memrl_in_process(list(args), cwd=cwd)


@pytest.mark.slow
def test_end_to_end_on_the_mstod_fixture(
    judger_data: Path, tmp_path: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stderr = _memrl_here(
        "run", "judger-minilm-cpu", "--smoke", f"data={judger_data}", "output_dir=run", cwd=tmp_path,
        monkeypatch=monkeypatch,
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    assert {"recall@5", "retrieval_recall@5", "judger_recall@5", "auc", "alpha_sweep"} <= set(metrics)
    assert metrics["queries"] > 0 and metrics["positives"] > 0
    info = json.loads((tmp_path / "run" / "judger" / "final" / "memrl_checkpoint.json").read_text())
    assert info["steps"] == 3 and info["trainer"] == "judger-cross_encoder"
    # A rerun skips the finished stage.
    console = Console(record=True, file=io.StringIO())
    again = load_recipe("judger-minilm-cpu", [f"data={judger_data}", f"output_dir={tmp_path / 'run'}"], smoke=True)
    run_recipe(again, console, only=["judger"])
    assert "judger: already finished" in console.export_text()


DISTRIBUTED = """\
extends: judger-minilm-cpu
name: judger-two-processes
logging: {backend: none}
models:
  judger: {backend: hf, model: tiny-qwen2}
stages:
  judger: {head: seq_cls, lora: {rank: 4, alpha: 8}, max_steps: 2, batch_size: 4, micro_batch_size: 2,
           max_length: 400, cluster: {gpus_per_node: 2}}
"""


@pytest.mark.slow
def test_two_processes_run_under_torchrun_and_save_an_adapter(
    judger_data: Path, tmp_path: Path, tiny_qwen2: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The multi-GPU path on CPU: torchrun starts two processes (gloo); the adapter is saved, merged on load."""
    from memrl.data_gen.judger_pairs import read_pairs
    from memrl.rollout.judger import load_judger

    (tmp_path / "two.yaml").write_text(DISTRIBUTED)
    code, stderr = _memrl_here(
        "run", "two.yaml", f"data={judger_data}", "output_dir=run", "--stage", "judger", cwd=tmp_path,
        monkeypatch=monkeypatch,
    )  # fmt: skip
    assert code == 0, stderr[-3000:]
    assert "--nproc-per-node=2 -m memrl.app.stage_main" in (tmp_path / "run" / "judger" / "judger.log").read_text()
    final = tmp_path / "run" / "judger" / "final"
    assert json.loads((final / "memrl_judger.json").read_text())["adapter"] is True
    assert "score" in json.loads((final / "adapter_config.json").read_text())["modules_to_save"]
    rows = read_pairs(judger_data / "eval" / "pairs.jsonl")[:4]
    items = [r.judger_input() for r in rows]
    scorer = load_judger(final)
    assert scorer.score(items) == pytest.approx([scorer.score([item])[0] for item in items], abs=1e-5)


def test_launch_asks_ray_for_a_distributed_judgers_gpus() -> None:
    """`memrl launch`: torchrun runs on the job's own node, so the job asks Ray for that node's GPUs."""
    from memrl.app.launch import job_recipe

    dashboard = "http://head:8265"
    assert job_recipe(load_recipe("judger-llama3.1-8b", ["data=J"]), dashboard)[1] == {"judger": 8}
    assert job_recipe(load_recipe("judger-minilm-cpu", ["data=J"]), dashboard)[1] == {}  # in-process on CPU
    two_nodes = load_recipe("judger-llama3.1-8b", ["data=J", "stages.judger.cluster.nnodes=2"])
    with pytest.raises(ConfigError, match=r"nnodes=2: under `memrl launch` a judger stage runs on one node"):
        job_recipe(two_nodes, dashboard)
