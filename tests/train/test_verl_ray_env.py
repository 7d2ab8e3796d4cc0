"""What verl's Ray workers see. `memrl.train.verl.main` starts Ray with one runtime_env: the
Ray job's variables, those forwarded from its own environment (wandb's, Hugging Face's, the API keys memrl hands
over by variable, MEMRL_UNSCORED), verl's defaults and the config's; none of it in verl's config, which verl prints.
A real cluster joined the way `memrl launch` joins it is in test_cluster.py (its two-node cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from memrl.rewards.config import RewardConfig
from memrl.train.config import ClusterConfig, GRPOStage
from memrl.train.verl.main import RAY_JOB_CONFIG_ENV, forwarded_env, ray_init_kwargs
from memrl.train.verl.overrides import grpo_overrides
from memrl.train.verl.validate import PPO_CONFIG, compose

SECRET = "sk-judge-7c1e"
ENVIRON = {
    "WANDB_MODE": "offline",
    "WANDB_DIR": "/runs/r",
    "HF_TOKEN": "hf-x",
    "VERL_FILE_LOGGER_PATH": "/runs/r/grpo/verl_metrics.jsonl",
    "MEMRL_JUDGE_API_KEY": SECRET,
    "MEMRL_USER_API_KEY": "sk-user",
    "MEMRL_OUTCOME_AGENT_API_KEY": "sk-agent",
    "MEMRL_UNSCORED": '{"stop": {"max_share": 0.5, "steps": 3}, "sources": []}',
    "PATH": "/usr/bin",
    "OPENAI_API_KEY": "sk-not-memrls",
    "HOME": "/root",
}
JUDGE = {"kind": "llm", "model": {"backend": "openai", "model": "j", "endpoint": "http://judge:8000/v1"}}


def test_forwarded_env_takes_what_the_workers_need_and_nothing_else() -> None:
    got = forwarded_env(ENVIRON)
    assert set(got) == {
        "WANDB_MODE",
        "WANDB_DIR",
        "HF_TOKEN",
        "VERL_FILE_LOGGER_PATH",
        "MEMRL_JUDGE_API_KEY",
        "MEMRL_USER_API_KEY",
        "MEMRL_OUTCOME_AGENT_API_KEY",
        "MEMRL_UNSCORED",
    }
    assert got["MEMRL_JUDGE_API_KEY"] == SECRET


def test_runtime_env_composes_job_forwarded_verl_and_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a Ray job whose runtime_env sets WANDB_DIR too: one runtime_env, the config's WANDB_DIR winning, the
    job's own variables kept, verl's defaults there, and the key in none of what verl prints."""
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)  # verl leaves out a default already set here
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_1.zip", "env_vars": {"WANDB_DIR": "/job", "JOB_ONLY": "1"}}}
    environ = ENVIRON | {RAY_JOB_CONFIG_ENV: json.dumps(job)}
    stage = GRPOStage(
        kind="grpo",
        trainer="verl",
        model="policy",
        data="data",
        batch_size=8,
        cluster=ClusterConfig(nnodes=1, gpus_per_node=8),
        reward=RewardConfig.model_validate({"judge": JUDGE}),
    )
    overrides = grpo_overrides(
        stage, model_path="m", data_dir=Path("/data"), out_dir=Path("/runs/r/grpo"), experiment="e", logger="wandb"
    )
    cfg = compose(PPO_CONFIG, [*overrides, "+ray_kwargs.ray_init.address=auto"])
    kwargs = ray_init_kwargs(cfg, environ)
    assert kwargs["address"] == "auto"
    env = kwargs["runtime_env"]["env_vars"]
    assert env["JOB_ONLY"] == "1"  # the job's
    assert env["WANDB_MODE"] == "offline" and env["MEMRL_JUDGE_API_KEY"] == SECRET  # forwarded
    assert env["MEMRL_UNSCORED"] == ENVIRON["MEMRL_UNSCORED"]
    assert env["VLLM_LOGGING_LEVEL"] == "WARN"  # verl's default
    assert env["WANDB_DIR"] == "/runs/r/grpo"  # the config's (the stage folder) over the job's and this process's
    assert env["VERL_USE_EXTERNAL_MODULES"] == "memrl.train.verl.compat,memrl.train.verl.advantage"
    assert "PATH" not in env and "OPENAI_API_KEY" not in env
    assert "working_dir" not in kwargs["runtime_env"]  # inside a job, the job's working dir stays
    assert SECRET not in OmegaConf.to_yaml(cfg)  # verl prints its config: never the key
    # Outside a job: verl's own choice, no working dir upload.
    assert ray_init_kwargs(cfg, ENVIRON)["runtime_env"]["working_dir"] is None
