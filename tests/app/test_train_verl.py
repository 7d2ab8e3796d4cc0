"""The verl path on CPU: recipe stages -> Hydra overrides checked against verl 0.9.1's own config and checks ->
commands (local, torchrun, `ray job submit`) -> FSDP checkpoint merge with the LoRA alpha repaired."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memrl.core.checkpoints import verl_shard_dir
from memrl.core.errors import ConfigError, MemrlError
from memrl.rewards.reward import RewardConfig
from memrl.rollout.config import OpenAIModelConfig
from memrl.rollout.serve import free_port
from memrl.train.config import ClusterConfig, GRPOStage, LoraConfig, SFTStage
from memrl.train.verl import merge as verl_merge
from memrl.train.verl import metrics as verl_metrics
from memrl.train.verl.command import RaySubmission, format_command, run_verl, secret_env, verl_command
from memrl.train.verl.overrides import grpo_overrides, hydra_value, sft_overrides
from memrl.train.verl.validate import PPO_CONFIG, SFT_CONFIG, compose, validate_overrides

DATA = Path("/data/reflection")
OUT = Path("/runs/reflector/grpo")
EIGHT_GPUS = ClusterConfig(nnodes=1, gpus_per_node=8)
LLM_JUDGE = {
    "judge": {
        "kind": "llm",
        "model": {
            "backend": "openai",
            "model": "meta-llama/Llama-3.3-70B-Instruct",
            "endpoint": "http://judge:8001/v1",
            "api_key": "sk-not-in-the-command",
        },
    }
}


def table5_grpo(**update: object) -> GRPOStage:
    """Paper Table 5 GRPO: lr 1e-6, 200 steps, batch 64, 8 rollouts, KL 0.003, prompt 2048, response 1024."""
    stage = GRPOStage(
        kind="grpo",
        trainer="verl",
        model="policy",
        data="data",
        lora=None,
        lr=1e-6,
        max_steps=200,
        batch_size=64,
        rollouts=8,
        micro_batch_size=2,
        kl_coef=0.003,
        loss="dr_grpo",
        max_prompt_length=2048,
        max_response_length=1024,
        cluster=EIGHT_GPUS,
        reward=RewardConfig.model_validate(LLM_JUDGE),
    )
    return stage.model_copy(update=update)


def table5_sft(**update: object) -> SFTStage:
    """Paper Table 5 SFT: lr 1e-6, 4 epochs, batch 64, cutoff 32768, full fine-tuning."""
    stage = SFTStage(
        kind="sft",
        trainer="verl",
        model="policy",
        data="data",
        lora=None,
        lr=1e-6,
        epochs=4,
        batch_size=64,
        micro_batch_size=1,
        max_length=32768,
        lr_scheduler="cosine",
        cluster=EIGHT_GPUS,
    )
    return stage.model_copy(update=update)


def grpo(stage: GRPOStage, **kwargs: object) -> list[str]:
    args: dict = {"model_path": "Qwen/Qwen2.5-7B-Instruct", "data_dir": DATA, "out_dir": OUT, "experiment": "qwen"}
    return grpo_overrides(stage, **(args | kwargs))


def sft(stage: SFTStage, **kwargs: object) -> list[str]:
    args: dict = {"model_path": "meta-llama/Llama-3.1-8B-Instruct", "data_dir": DATA, "out_dir": OUT}
    return sft_overrides(stage, **(args | {"experiment": "llama"} | kwargs))


def as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(item.lstrip("+").split("=", 1) for item in overrides)


# --- overrides ----------------------------------------------------------------------------------------------------


def test_grpo_overrides_carry_the_recipe() -> None:
    got = as_dict(grpo(table5_grpo(), logger="wandb"))
    assert got["algorithm.adv_estimator"] == "memrl_grpo"
    assert got["data.train_files"] == "/data/reflection/rl/train.parquet"
    assert got["data.val_files"] == "/data/reflection/rl/eval.parquet"
    assert (got["data.train_batch_size"], got["actor_rollout_ref.actor.ppo_mini_batch_size"]) == ("64", "64")
    assert (got["data.max_prompt_length"], got["data.max_response_length"]) == ("2048", "1024")
    assert got["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-7B-Instruct"
    assert float(got["actor_rollout_ref.actor.optim.lr"]) == 1e-6
    assert got["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "2"
    assert (got["actor_rollout_ref.rollout.n"], got["actor_rollout_ref.rollout.name"]) == ("8", "vllm")
    assert got["actor_rollout_ref.actor.use_kl_loss"] == "true"
    assert float(got["actor_rollout_ref.actor.kl_loss_coef"]) == 0.003
    assert got["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert got["trainer.total_training_steps"] == "200"
    assert (got["trainer.save_freq"], got["trainer.test_freq"]) == ("50", "50")
    assert got["trainer.default_local_dir"] == "/runs/reflector/grpo/checkpoints"
    assert got["trainer.logger"] == "[console,file,wandb]"
    assert (got["trainer.nnodes"], got["trainer.n_gpus_per_node"]) == ("1", "8")
    assert (got["trainer.project_name"], got["trainer.experiment_name"]) == ("memrl", "qwen")
    # by module always (reward workers sit on every node), local mode included.
    assert got["reward.custom_reward_function.path"] == "pkg://memrl.train.verl.rewards"
    assert got["reward.custom_reward_function.name"] == "compute_score_async"
    assert "actor_rollout_ref.model.lora_rank" not in got  # lora: null is full fine-tuning


def test_lora_and_no_kl() -> None:
    stage = table5_grpo(lora=LoraConfig(rank=32, alpha=64, target_modules=["q_proj", "v_proj"]), kl_coef=0.0)
    got = as_dict(grpo(stage, lora_adapter_path="/runs/sft/final"))
    assert (got["actor_rollout_ref.model.lora_rank"], got["actor_rollout_ref.model.lora_alpha"]) == ("32", "64")
    assert got["actor_rollout_ref.model.target_modules"] == "[q_proj,v_proj]"
    assert got["actor_rollout_ref.model.lora_adapter_path"] == "/runs/sft/final"
    assert got["actor_rollout_ref.rollout.load_format"] == "safetensors"
    assert got["actor_rollout_ref.actor.use_kl_loss"] == "false"
    assert "actor_rollout_ref.actor.kl_loss_coef" not in got
    with pytest.raises(ConfigError, match="adapter"):
        grpo(table5_grpo(), lora_adapter_path="/runs/sft/final")
    with pytest.raises(ConfigError, match="2 rollouts"):
        grpo(table5_grpo(rollouts=1))


@pytest.mark.parametrize(
    ("loss", "agg", "std_norm"),
    [
        ("grpo", "seq-mean-token-mean", "true"),
        ("dapo", "token-mean", "true"),
        ("dr_grpo", "seq-mean-token-sum-norm", "false"),
    ],
)
def test_loss_modes(loss: str, agg: str, std_norm: str) -> None:
    overrides = grpo(table5_grpo(loss=loss))
    got = as_dict(overrides)
    assert got["actor_rollout_ref.actor.loss_agg_mode"] == agg
    assert got["algorithm.norm_adv_by_std_in_grpo"] == std_norm
    assert ("actor_rollout_ref.actor.loss_scale_factor" in got) == (loss == "dr_grpo")
    # verl's own actor config rejects an aggregation name it does not implement.
    validate_overrides(PPO_CONFIG, overrides)


def test_sft_overrides_carry_the_recipe() -> None:
    got = as_dict(sft(table5_sft(lora=LoraConfig(rank=16, alpha=32), warmup_ratio=0.1)))
    assert got["data.train_files"] == "/data/reflection/sft/train.parquet"
    assert got["data.val_files"] == "/data/reflection/sft/eval.parquet"
    assert got["data.messages_key"] == "messages"
    assert (got["data.train_batch_size"], got["data.micro_batch_size_per_gpu"]) == ("64", "1")
    assert got["data.max_length"] == "32768"
    assert got["model.path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert (got["model.lora_rank"], got["model.lora_alpha"], got["model.target_modules"]) == ("16", "32", "all-linear")
    assert float(got["optim.lr"]) == 1e-6 and float(got["optim.lr_warmup_steps_ratio"]) == 0.1
    assert got["trainer.total_epochs"] == "4" and "trainer.total_training_steps" not in got
    assert got["trainer.resume_mode"] == "auto"
    assert as_dict(sft(table5_sft(max_steps=10, epochs=0.5)))["trainer.total_training_steps"] == "10"
    with pytest.raises(ConfigError, match="whole epochs"):
        sft(table5_sft(epochs=1.5))
    with pytest.raises(ConfigError, match="split evenly"):
        sft(table5_sft(batch_size=60))


def test_verl_runs_log_their_metrics_in_the_stage_folder() -> None:
    """verl runs logged to the console (and wandb) only, and left no curve. Now verl's `file` logger
    writes the stage's metrics JSONL, its path (and wandb's folder) in the env of verl's Ray workers."""
    overrides = grpo(table5_grpo(), logger="wandb")
    cfg = compose(PPO_CONFIG, overrides)
    assert list(cfg.trainer.logger) == ["console", "file", "wandb"]
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert str(OUT / "verl_metrics.jsonl") == env.VERL_FILE_LOGGER_PATH
    assert str(OUT) == env.WANDB_DIR
    assert "WANDB_DIR" not in compose(PPO_CONFIG, grpo(table5_grpo())).ray_kwargs.ray_init.runtime_env.env_vars
    assert list(compose(SFT_CONFIG, sft(table5_sft())).trainer.logger) == ["console", "file"]


def test_a_verl_stage_runs_with_its_metrics_file_and_draws_its_curves(tmp_path: Path) -> None:
    """The SFT command's own environment names the metrics file (its loggers run in that process); the
    runner keeps an earlier attempt's file, and draws the curves even when the run fails."""
    from rich.console import Console

    from memrl.app.recipe import load_recipe
    from memrl.app.stages.training import stage_run, verl_command
    from memrl.train.stage_run import CURVES_FILE
    from memrl.train.verl.backend import VerlCommand, run_command

    run = tmp_path / "run"
    loaded = load_recipe("reflector-qwen2.5-7b", [f"output_dir={run}"])
    ctx = loaded.recipe.context(run, Console(stderr=True))
    env = verl_command(loaded.recipe.stages["sft"], ctx, "sft", dry_run=True).env
    assert env is not None and env["VERL_FILE_LOGGER_PATH"] == str(run / "sft" / "verl_metrics.jsonl")
    assert env["WANDB_DIR"] == str(run / "sft")  # base recipe: wandb offline

    # A verl process that logs two steps with verl's own Tracking, then dies.
    (run / "sft").mkdir(parents=True)
    (run / "sft" / "verl_metrics.jsonl").write_text('{"step": 1, "data": {"train/loss": 3.0}}\n')  # attempt 1
    script = (
        "from verl.utils.tracking import Tracking\n"
        "t = Tracking('memrl', 'sft', default_backend=['file'])\n"
        "for step in (2, 3): t.log(data={'train/loss': 1.0 / step, 'train/lr': 1e-6}, step=step)\n"
        "t.finish()\nraise SystemExit(3)\n"
    )
    command = VerlCommand([sys.executable, "-c", script], env, "m")
    with pytest.raises(MemrlError):
        run_command(command, stage_run(ctx, "sft"), base="m", trainer="verl-sft", lora=None)
    assert (run / "sft" / "verl_metrics-1.jsonl").is_file()
    assert (run / "sft" / CURVES_FILE).read_bytes()[:4] == b"\x89PNG"
    assert [s for s, row in verl_metrics.read(run / "sft").items() if "train/loss" in row] == [1, 2, 3]


def test_verl_sft_takes_the_seed_and_the_lr_schedule() -> None:
    """verl SFT ran with verl's seeds (trainer 1, engine 42) and a constant LR whatever the recipe."""
    overrides = sft(table5_sft(warmup_ratio=0.05), seed=7)
    validate_overrides(SFT_CONFIG, overrides)  # verl's FSDPOptimizerConfig accepts it
    cfg = compose(SFT_CONFIG, overrides)
    assert (cfg.trainer.seed, cfg.engine.seed) == (7, 7)
    assert cfg.optim.lr_scheduler_type == "cosine" and cfg.optim.lr_warmup_steps_ratio == pytest.approx(0.05)
    assert compose(SFT_CONFIG, sft(table5_sft(lr_scheduler="constant"))).optim.lr_scheduler_type == "constant"
    with pytest.raises(ConfigError, match="constant or cosine after the warm-up; lr_scheduler 'linear'"):
        sft(table5_sft(lr_scheduler="linear"))


VERL_JUDGE = {"judge": {"kind": "llm", "model": {"backend": "vllm", "model": "meta-llama/Llama-3.3-70B-Instruct",
                                                 "tensor_parallel_size": 4}}}  # fmt: skip


def test_a_vllm_judge_is_hosted_by_verl_on_the_training_gpus() -> None:
    """A verl stage could only reach its judge at an endpoint served beside the job. A vLLM judge model is
    now verl's generative reward model, colocated on every training GPU, reached through verl's reward router."""
    import types

    from memrl.train.verl.rewards import reward_config

    stage = table5_grpo(reward=RewardConfig.model_validate(VERL_JUDGE))
    overrides = grpo(stage)
    validate_overrides(PPO_CONFIG, overrides)
    cfg = compose(PPO_CONFIG, overrides)
    rm = cfg.reward.reward_model
    assert rm.enable and not rm.enable_resource_pool  # colocated: the policy keeps all 8 GPUs
    assert (rm.model_path, rm.rollout.name, rm.rollout.tensor_model_parallel_size) == (
        "meta-llama/Llama-3.3-70B-Instruct", "vllm", 4)  # fmt: skip
    assert rm.rollout.gpu_memory_utilization == 0.5  # verl's default, not the standalone engine's 0.85
    assert cfg.trainer.n_gpus_per_node == 8
    kwargs = dict(cfg.reward.custom_reward_function.reward_kwargs)
    assert kwargs["judge"] == "llm" and "endpoint" not in kwargs and "model" not in kwargs
    # What verl's reward manager adds at run time: the router, and the tokenizer of the model it serves.
    tokenizer = types.SimpleNamespace(name_or_path="/hf/llama-70b")
    routed = reward_config(kwargs | {"reward_router_address": "10.0.0.2:8123", "reward_model_tokenizer": tokenizer})
    assert routed.judge.model.endpoint == "http://10.0.0.2:8123/v1" and routed.judge.model.model == "/hf/llama-70b"
    # An endpoint judge keeps verl's reward model off.
    assert not compose(PPO_CONFIG, grpo(table5_grpo())).reward.reward_model.enable
    with pytest.raises(ConfigError, match="tensor_parallel_size 16 must divide the stage's 8 GPUs"):
        grpo(table5_grpo(reward=RewardConfig.model_validate({"judge": {**VERL_JUDGE["judge"], "model": {
            **VERL_JUDGE["judge"]["model"], "tensor_parallel_size": 16}}})))  # fmt: skip
    with pytest.raises(ConfigError, match=r"reward.judge.few_shot: a judge verl hosts"):
        grpo(table5_grpo(reward=RewardConfig.model_validate({"judge": {**VERL_JUDGE["judge"], "few_shot": False}})))


# --- against verl's config schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["reflector-qwen2.5-7b", "reflector-llama3.1-8b"])
def test_table5_recipes_compose_against_verl(recipe: str) -> None:
    from memrl.app.recipe import load_recipe

    stages = load_recipe(recipe).recipe.stages
    validate_overrides(PPO_CONFIG, grpo(stages["grpo"]))
    validate_overrides(SFT_CONFIG, sft(stages["sft"]))


def test_composed_config_holds_the_values() -> None:
    stage = table5_grpo(overrides=["actor_rollout_ref.rollout.n=4", "trainer.val_before_train=false"])
    cfg = compose(PPO_CONFIG, grpo(stage))
    assert cfg.actor_rollout_ref.rollout.n == 4  # the passthrough override wins over the recipe's 8
    assert cfg.trainer.val_before_train is False
    assert cfg.actor_rollout_ref.actor.kl_loss_coef == pytest.approx(0.003)


def test_reward_config_reaches_the_reward_adapter_through_verl() -> None:
    """verl's own loader builds the reward call from the composed config; memrl's adapter reads the same config."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from memrl.train.verl.rewards import compute_score_async, reward_config

    recipe = LLM_JUDGE | {"coverage_weight": 2.0, "length_penalty": {"budget": 120}}
    recipe["judge"] = recipe["judge"] | {"cache_dir": "/tmp/judge cache, it's \\'here'"}
    stage = table5_grpo(reward=RewardConfig.model_validate(recipe))
    cfg = compose(PPO_CONFIG, grpo(stage))
    # verl resolves its config twice (to print it, then in place).
    OmegaConf.resolve(cfg)
    OmegaConf.resolve(cfg)
    call = get_custom_reward_fn(cfg)
    assert call is not None
    function, kwargs = call.args
    assert function.__qualname__ == "compute_score_async"
    assert function.__code__.co_filename == compute_score_async.__code__.co_filename
    sent = reward_config(kwargs)
    expected = stage.reward.model_copy(deep=True)
    assert isinstance(expected.judge.model, OpenAIModelConfig)
    expected.judge.model.api_key = None
    expected.judge.model.max_concurrency = 16 // 8  # the recipe's bound over verl's 8 reward workers
    assert sent == expected
    assert sent.judge.cache_dir == "/tmp/judge cache, it's \\'here'"
    assert "sk-not-in-the-command" not in " ".join(grpo(stage))
    assert secret_env(stage) == {"MEMRL_JUDGE_API_KEY": "sk-not-in-the-command"}
    with pytest.raises(ConfigError, match="interpolation"):
        grpo(table5_grpo(reward=RewardConfig.model_validate({"judge": {"cache_dir": "${HOME}/j"}})))


def test_awkward_strings_survive_hydra() -> None:
    values = ["it's", "C:\\dir\\", '{"a": "b,c"}', "/a b/c", "123", "true", "null", "a=b", "", "1e-3", "x ${y}"]
    overrides = [f"+trainer.t{i}={hydra_value(v)}" for i, v in enumerate(values)]
    overrides.append("+trainer.nested=" + hydra_value({"k": ["a b", 1, None], "v": {"w": "it's"}}))
    cfg = compose(PPO_CONFIG, overrides)
    assert [cfg.trainer[f"t{i}"] for i in range(len(values))] == values
    assert cfg.trainer.nested == {"k": ["a b", 1, None], "v": {"w": "it's"}}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor_rollout_ref.actor.optim.lrr=1e-5", "no key 'actor_rollout_ref.actor.optim.lrr' (did you mean"),
        ("trainer.totl_epochs=3", "did you mean 'trainer.total_epochs'"),
        ("actor_rollout_ref.actor.optim.lr=fast", "optim.lr must be a number, got 'fast'"),
        ("trainer.val_before_train=maybe", "must be true or false"),
        ("data.train_batch_size=32", "ppo_mini_batch_size"),
        ("actor_rollout_ref.actor.loss_agg_mode=mean", "Invalid loss_agg_mode: mean"),
        ("actor_rollout_ref.model.lora_rank=1024", "lora_rank 1024 exceeds"),
        ("trainer.logger=[console", "verl ppo_trainer:"),
        ("trainer.logger", "is not key=value"),
    ],
)
def test_bad_passthrough_override_fails_in_one_line(override: str, message: str) -> None:
    overrides = grpo(table5_grpo(overrides=[override]))
    with pytest.raises(ConfigError) as err:
        validate_overrides(PPO_CONFIG, overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_sft_typo_fails_against_the_sft_schema() -> None:
    with pytest.raises(ConfigError, match=r"has no key 'data\.messages_ky' \(did you mean 'data\.messages_key'\?\)"):
        validate_overrides(SFT_CONFIG, sft(table5_sft(overrides=["data.messages_ky=m"])))


# --- commands -----------------------------------------------------------------------------------------------------


def test_local_commands() -> None:
    overrides = grpo(table5_grpo())
    argv = verl_command("grpo", overrides, EIGHT_GPUS)
    assert argv[:3] == [sys.executable, "-m", "memrl.train.verl.main"] and argv[3:] == overrides
    argv = verl_command("sft", ["model.path=m"], EIGHT_GPUS, python="python3")
    assert argv == [
        "python3",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=8",
        "-m",
        "verl.trainer.sft_trainer",
        "model.path=m",
    ]
    with pytest.raises(ConfigError, match="ray_address"):
        verl_command("sft", [], ClusterConfig(nnodes=2))
    # The printed command is what a shell would run, argument for argument.
    grpo_argv = verl_command("grpo", overrides, EIGHT_GPUS)
    assert shlex.split(format_command(grpo_argv, multiline=False)) == grpo_argv


def test_ray_job_submit_names_secrets_by_reference(tmp_path: Path) -> None:
    cluster = ClusterConfig(nnodes=2, gpus_per_node=8, ray_address="http://head:8265")
    stage = table5_grpo(cluster=cluster)
    overrides = grpo(stage)
    environ = {"WANDB_API_KEY": "wandb-s3cret", "HF_TOKEN": "hf-s3cret", "HOME": "/root"} | secret_env(stage)
    argv = verl_command("grpo", overrides, cluster, working_dir=tmp_path, environ=environ)
    assert argv[:5] == ["ray", "job", "submit", "--address", "http://head:8265"]
    split = argv.index("--")
    assert argv[split + 1 : split + 4] == ["python", "-m", "memrl.train.verl.main"]
    runtime = json.loads(argv[argv.index("--runtime-env-json") + 1])
    assert runtime["working_dir"] == str(tmp_path)
    assert runtime["env_vars"] == {
        "HF_TOKEN": "${HF_TOKEN}",
        "MEMRL_JUDGE_API_KEY": "${MEMRL_JUDGE_API_KEY}",
        "WANDB_API_KEY": "${WANDB_API_KEY}",
    }
    # On a cluster the reward function is imported by module name, not by a path of this machine.
    assert as_dict(overrides)["reward.custom_reward_function.path"] == "pkg://memrl.train.verl.rewards"
    printed = format_command(argv)
    assert "s3cret" not in printed and "sk-not-in-the-command" not in printed
    assert printed.splitlines()[1].strip().startswith("algorithm.adv_estimator=memrl_grpo")
    # A shell running the printed command fills the references from its own environment.
    shell = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + printed.split(" ", 1)[1]],
        env={"PATH": os.environ["PATH"], "WANDB_API_KEY": "from-the-shell"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")[:-1]
    assert shell[0] == "job" and shell[-1] == argv[-1]
    assert json.loads(shell[shell.index("--runtime-env-json") + 1])["env_vars"]["WANDB_API_KEY"] == "from-the-shell"
    # run_verl reads the argv back and fills the references in memory, for Ray's client.
    job = RaySubmission.parse(argv, environ)
    assert job is not None and job.address == "http://head:8265" and job.entrypoint == argv[split + 1 :]
    assert job.runtime_env["env_vars"]["HF_TOKEN"] == "hf-s3cret"
    assert job.runtime_env["working_dir"] == str(tmp_path)
    assert RaySubmission.parse(verl_command("grpo", overrides, EIGHT_GPUS), environ) is None
    sft_argv = verl_command("sft", ["model.path=m"], cluster, environ={})
    assert "verl.trainer.sft_trainer_ray" in sft_argv and json.loads(sft_argv[6]) == {}


def test_ray_stage_puts_no_secret_on_any_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With cluster.ray_address, run_verl ran `ray job submit --runtime-env-json` holding the keys, in
    `ps` for the whole run. Now nothing is spawned: the job goes to Ray's client in this process."""
    spawned: list[str] = []
    popen_init = subprocess.Popen.__init__

    def record(self: subprocess.Popen[bytes], args: object, *rest: object, **kwargs: object) -> None:
        spawned.append(" ".join(map(str, args)) if isinstance(args, list | tuple) else str(args))
        popen_init(self, args, *rest, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess.Popen, "__init__", record)
    stage = table5_grpo(cluster=ClusterConfig(nnodes=2, gpus_per_node=8, ray_address=f"http://127.0.0.1:{free_port()}"))
    environ = {"WANDB_API_KEY": "wandb-s3cret", "HF_TOKEN": "hf-s3cret", "PATH": os.environ["PATH"]}
    environ |= secret_env(stage)
    argv = verl_command("grpo", grpo(stage), stage.cluster, environ=environ)
    log = tmp_path / "verl.log"
    with pytest.raises(MemrlError, match=r"cannot reach the Ray job server at http://127\.0\.0\.1:") as err:
        run_verl(argv, log, env=environ)
    secrets = ("wandb-s3cret", "hf-s3cret", "sk-not-in-the-command")
    for text in [*spawned, log.read_text(), str(err.value)]:
        assert not any(secret in text for secret in secrets), text
    assert "${WANDB_API_KEY}" in log.read_text()  # the log names the variables it passes, not their values


def test_run_verl_streams_to_the_log_and_raises_with_the_tail(tmp_path: Path) -> None:
    log = tmp_path / "verl.log"
    check = "import os; print('key ok:', os.environ['WANDB_API_KEY'] == 'v')"
    argv = [sys.executable, "-c", check]
    assert run_verl(argv, log, env={"WANDB_API_KEY": "v", "PATH": os.environ["PATH"]}) == 0
    assert "key ok: True" in log.read_text()
    failing = [sys.executable, "-c", "import sys\nfor i in range(30): print('line', i)\nsys.exit(3)"]
    with pytest.raises(MemrlError) as err:
        run_verl(failing, log)
    message = str(err.value)
    assert message.splitlines()[0].startswith("verl exited with code 3")
    assert "line 29" in message and "line 5" not in message
    assert "line 29" in log.read_text()


# --- merge --------------------------------------------------------------------------------------------------------


def _adapter(folder: Path, alpha: int) -> Path:
    (folder / "lora_adapter").mkdir(parents=True)
    path = folder / "lora_adapter" / "adapter_config.json"
    path.write_text(json.dumps({"r": 8, "lora_alpha": alpha, "peft_type": "LORA", "base_model_name_or_path": None}))
    return path


def test_merge_command(tmp_path: Path) -> None:
    actor = tmp_path / "checkpoints" / "global_step_20" / "actor"
    assert verl_merge.merge_command(actor, tmp_path / "hf", python="py") == [
        "py",
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor),
        "--target_dir",
        str(tmp_path / "hf"),
    ]


def test_fix_lora_alpha(tmp_path: Path) -> None:
    assert verl_merge.fix_lora_alpha(tmp_path) is None  # full fine-tuning: no adapter
    config = _adapter(tmp_path / "a", alpha=0)
    assert verl_merge.fix_lora_alpha(tmp_path / "a", lora_alpha=16) == 16
    written = json.loads(config.read_text())
    assert written["lora_alpha"] == 16
    assert written["base_model_name_or_path"] == str((tmp_path / "a").resolve())
    # The step folder's training metadata (where verl's SFT trainer writes it) when the recipe gives none.
    step = tmp_path / "global_step_3"
    (step / "actor").mkdir(parents=True)
    (step / "lora_train_meta.json").write_text('{"r": 8, "lora_alpha": 24}')
    _adapter(tmp_path / "b", alpha=0)
    assert verl_merge.fix_lora_alpha(tmp_path / "b", local_dir=step / "actor") == 24
    _adapter(tmp_path / "c", alpha=32)  # a trained value is kept
    assert verl_merge.fix_lora_alpha(tmp_path / "c", lora_alpha=16) == 32
    _adapter(tmp_path / "d", alpha=0)
    with pytest.raises(ConfigError, match="lora_alpha 0"):
        verl_merge.fix_lora_alpha(tmp_path / "d", local_dir=tmp_path)


@pytest.fixture
def fsdp_lora_checkpoint(
    tiny_qwen2: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, object, object]:
    """A real verl FSDP2 checkpoint of tiny-qwen2 + LoRA, written by verl's checkpoint manager on CPU (gloo, one
    rank), and the input/logits of the model that was saved."""
    import tempfile

    import torch
    import torch.distributed as dist
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.trainer.config import CheckpointConfig
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    # verl's local_mkdir_safe leaves a ckpt_<hash>.lock in the temp dir for each folder it makes: this test's own.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    # Random B matrices: the adapter changes the output, so a lost alpha shows.
    lora = PeftLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(model, lora)
    with torch.no_grad():  # verl's merger writes bf16; start from bf16-exact weights so outputs can match exactly
        for param in model.parameters():
            param.copy_(param.bfloat16().float())
    inputs = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        reference = model(input_ids=inputs).logits
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
        for layer in model.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        manager = FSDPCheckpointManager(
            model=model,
            processing_class=AutoTokenizer.from_pretrained(tiny_qwen2),
            checkpoint_config=CheckpointConfig(save_contents=["model"], load_contents=["model"]),
        )
        actor = tmp_path / "checkpoints" / "global_step_1" / "actor"
        manager.save_checkpoint(local_path=str(actor), global_step=1)
    finally:
        dist.destroy_process_group()
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    return tmp_path, inputs, reference


def test_real_fsdp_checkpoint_merges_and_alpha_is_restored(
    fsdp_lora_checkpoint: tuple[Path, object, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import verl.model_merger.__main__ as merger
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run, inputs, reference = fsdp_lora_checkpoint
    actor = verl_shard_dir(run)
    # Checkpoints without verl's metadata file are the ones that come out with lora_alpha 0.
    (actor / "lora_train_meta.json").unlink()
    target = run / "hf"
    argv = verl_merge.merge_command(actor, target)
    monkeypatch.setattr(sys, "argv", argv[2:])  # verl's merger CLI in-process, on exactly our arguments
    merger.main()
    config = json.loads((target / "lora_adapter" / "adapter_config.json").read_text())
    assert config["lora_alpha"] == 0  # the known issue, reproduced
    assert verl_merge.fix_lora_alpha(target, lora_alpha=8, local_dir=actor) == 8

    base = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        base_error = (base(input_ids=inputs).logits - reference).abs().max().item()  # what alpha 0 amounts to
        model = PeftModel.from_pretrained(base, target / "lora_adapter")
        fixed_error = (model(input_ids=inputs).logits - reference).abs().max().item()
    assert fixed_error < 1e-4
    assert base_error > 0.1  # the adapter matters: with alpha 0 the output is the base model's


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_merge_checkpoint_runs_verls_merger(fsdp_lora_checkpoint: tuple[Path, object, object]) -> None:
    run, inputs, reference = fsdp_lora_checkpoint
    (verl_shard_dir(run) / "lora_train_meta.json").unlink()
    loadable = verl_merge.merge_verl_checkpoint(run, run / "hf", lora_alpha=8)
    target = run / "hf"
    assert loadable == target / "lora_adapter"
    assert (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file()
    assert json.loads((target / "lora_adapter" / "adapter_config.json").read_text())["lora_alpha"] == 8
    assert "Saving lora adapter" in (run / "hf-merge.log").read_text()
    # memrl's own loader reads the returned folder as base + adapter and reproduces the trained model.
    import torch

    from memrl.core.checkpoints import load_causal_lm

    with torch.no_grad():
        logits = load_causal_lm(str(loadable), dtype=torch.float32)(input_ids=inputs).logits
    assert (logits - reference).abs().max().item() < 1e-4


# --- concurrency over verl's workers, local endpoints on several nodes, the job's environment ----------


def _stage_command(recipe: str, stage: str, overrides: list[str], tmp_path: Path) -> Any:
    from rich.console import Console

    from memrl.app.recipe import load_recipe
    from memrl.app.stages import online_rl, training

    loaded = load_recipe(recipe, [f"output_dir={tmp_path}", *overrides])
    ctx = loaded.recipe.context(tmp_path, Console(stderr=True))
    spec = loaded.recipe.stages[stage]
    build = online_rl.verl_command if spec.kind == "collab_grpo" else training.verl_command
    return build(spec, ctx, stage, dry_run=True)


@pytest.mark.parametrize(("bound", "workers", "each"), [(64, 8, 8), (4, 4, 1), (20, 8, 2)])
def test_judge_concurrency_is_divided_over_the_reward_workers(bound: int, workers: int, each: int) -> None:
    """8 reward workers each held a scorer with the recipe's whole max_concurrency (8x the bound)."""
    recipe = json.loads(json.dumps(LLM_JUDGE))
    recipe["judge"]["model"]["max_concurrency"] = bound
    got = as_dict(grpo(table5_grpo(reward=RewardConfig.model_validate(recipe))))
    assert got["reward.num_workers"] == str(workers)
    cfg = compose(PPO_CONFIG, grpo(table5_grpo(reward=RewardConfig.model_validate(recipe))))
    judge = cfg.reward.custom_reward_function.reward_kwargs.judge
    assert cfg.reward.num_workers == workers and judge.model.max_concurrency == each
    assert workers * each <= bound  # what the judge's server sees at most
    # A stage that names its own worker count keeps it, and the bound is divided over that many.
    stage = table5_grpo(reward=RewardConfig.model_validate(recipe), overrides=["reward.num_workers=2"])
    cfg = compose(PPO_CONFIG, grpo(stage))
    assert cfg.reward.num_workers == 2
    assert cfg.reward.custom_reward_function.reward_kwargs.judge.model.max_concurrency == bound // 2


def test_user_concurrency_is_divided_over_the_agent_loop_workers(tmp_path: Path) -> None:
    """Every agent-loop worker built its own LLM user client with the recipe's whole bound."""
    from memrl.app.recipe import load_recipe
    from memrl.train.verl.online_overrides import loop_settings

    bound = ["stages.collab.env.user_model.max_concurrency=24"]
    argv = _stage_command("collaborator-qwen2.5-7b", "collab", bound, tmp_path).argv
    assert "actor_rollout_ref.rollout.agent.num_workers=8" in argv
    stage = load_recipe("collaborator-qwen2.5-7b", bound).recipe.stages["collab"]
    user = loop_settings(stage).env.user_model  # type: ignore[arg-type]  # what the rows hand every worker
    assert isinstance(user, OpenAIModelConfig) and user.max_concurrency == 24 // 8


@pytest.mark.parametrize(
    ("recipe", "stage", "role"),
    [("reflector-qwen2.5-7b", "grpo", "judge"), ("collaborator-qwen2.5-7b", "collab", "user")],
)
def test_a_multi_node_stage_refuses_a_local_endpoint(recipe: str, stage: str, role: str, tmp_path: Path) -> None:
    """127.0.0.1 is a different host on every node of the run."""
    local = {"judge": "stages.grpo.reward.judge.model.endpoint", "user": "stages.collab.env.user_model.endpoint"}[role]
    one = [f"{local}=http://127.0.0.1:8000/v1"]
    _stage_command(recipe, stage, one, tmp_path)  # one node: fine
    two = [f"stages.{stage}.cluster.nnodes=2", f"stages.{stage}.placement.{role}=endpoint"]  # no GPUs kept here
    with pytest.raises(ConfigError, match=rf"^{role} at http://127\.0\.0\.1:8000/v1 .*2-node stage"):
        _stage_command(recipe, stage, [*one, *two], tmp_path)
    _stage_command(recipe, stage, [f"{local}=http://judge-host:8000/v1", *two], tmp_path)


def test_grpo_job_environment_carries_the_unscored_stop(tmp_path: Path) -> None:
    """The memrl_grpo estimator in verl's trainer learns the stop and the endpoints from MEMRL_UNSCORED."""
    from memrl.rewards.unscored import UNSCORED_ENV, UnscoredWatch

    command = _stage_command(
        "reflector-qwen2.5-7b",
        "grpo",
        ["stages.grpo.unscored.steps=2", "stages.grpo.reward.judge.model.api_key=sk-x"],
        tmp_path,
    )
    env = command.env
    assert env["MEMRL_JUDGE_API_KEY"] == "sk-x"
    watch = UnscoredWatch.from_env(env)
    assert watch.stop.steps == 2
    assert len(watch.sources) == 1 and watch.sources[0].startswith("judge at http://")
    assert "sk-x" not in env[UNSCORED_ENV]
    watch.observe(4, 4)
    with pytest.raises(MemrlError, match=r"training stopped: .* check judge at http://"):
        watch.observe(4, 4)


def test_a_judge_url_with_credentials_is_refused_before_it_reaches_verl() -> None:
    """verl prints and saves its config, so a URL credential would land in both; the key goes as api_key."""
    recipe = json.loads(json.dumps(LLM_JUDGE))
    recipe["judge"]["model"]["endpoint"] = "http://judge:url-secret-26@127.0.0.1:9/v1"
    with pytest.raises(ConfigError) as caught:
        grpo(table5_grpo(reward=RewardConfig.model_validate(recipe)))
    assert "url-secret-26" not in str(caught.value) and "credential in the URL" in str(caught.value)
