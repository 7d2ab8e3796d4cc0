"""The reflection pipeline end to end on a tiny model: data -> SFT -> GRPO -> export -> eval -> report; resume."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support import MemrlCLI


@pytest.mark.slow
def test_smoke_runs_every_stage_and_reports(smoke_run: Path) -> None:
    report = json.loads((smoke_run / "report.json").read_text())
    assert list(report["mean_reward"]) == ["base", "sft", "grpo"]
    for label in ("base", "sft", "grpo"):
        held_out = report["held_out"][label]
        assert held_out["n"] == 3 and held_out["judge_failures"] == 0
        assert 0.0 <= held_out["score"] <= 2.0 and 0.0 <= held_out["format"] <= 1.0
    assert set(report["gains"]) == {"sft_minus_base", "grpo_minus_sft"}
    assert report["held_out_decoding"] == "greedy"  # the quickstart's eval sampling is temperature 0
    assert (smoke_run / "reward_curve.png").stat().st_size > 0
    # The GRPO stage logged its reward parts per step, and checkpoints carry what export needs.
    history = json.loads((smoke_run / "grpo" / "log_history.json").read_text())
    assert any("rewards/coverage/mean" in row for row in history)
    info = json.loads((smoke_run / "grpo" / "final" / "memrl_checkpoint.json").read_text())
    assert info["adapter"] and info["trainer"] == "trl-grpo" and info["steps"] == 2


@pytest.mark.slow
def test_export_is_a_standalone_model_with_a_card(smoke_run: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = smoke_run / "export"
    assert (export / "model.safetensors").is_file() and not (export / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert model.config.vocab_size >= len(tokenizer) - 8
    card = (export / "README.md").read_text()
    assert "base_model: tiny-qwen2" in card and "quickstart/grpo" in card  # eval numbers landed in the card


@pytest.mark.slow
def test_export_merge_matches_base_plus_adapter(smoke_run: Path, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from memrl.core.checkpoints import adapter_base, resolve_model

    adapter = smoke_run / "sft" / "final"
    out = tmp_path / "sft-export"
    result = memrl_cli("export", "--checkpoint", str(smoke_run / "sft"), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    base = AutoModelForCausalLM.from_pretrained(resolve_model(adapter_base(adapter)))
    reference = PeftModel.from_pretrained(base, adapter).eval()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[5, 17, 42, 99, 3]])
    with torch.no_grad():
        assert torch.allclose(reference(ids).logits, merged(ids).logits, atol=1e-4)


@pytest.mark.slow
def test_rerun_skips_finished_stages(smoke_run: Path, memrl_cli: MemrlCLI) -> None:
    before = (smoke_run / "grpo" / "final" / "memrl_checkpoint.json").stat().st_mtime
    result = memrl_cli(
        "run", "quickstart", "--smoke", f"output_dir={smoke_run}", "--stage", "sft", "--stage", "grpo", cwd=smoke_run
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "already finished" in result.stderr
    assert (smoke_run / "grpo" / "final" / "memrl_checkpoint.json").stat().st_mtime == before


@pytest.mark.slow
def test_eval_reflector_cli_resumes_and_scores(smoke_run: Path, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "eval"
    args = ("eval", "reflector", "--model", str(smoke_run / "export"), "--data", str(smoke_run / "data"))
    result = memrl_cli(*args, "--out", str(out), "--max-samples", "2", "--max-tokens", "16", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert metrics["n"] == 2 and metrics["judge_failures"] == 0
    assert {"score", "coverage", "format", "hallucination_rate", "notes_tokens"} <= set(metrics)
    generated = (out / "generations.jsonl").read_text()
    again = memrl_cli(*args, "--out", str(out), "--max-samples", "2", "--max-tokens", "16", cwd=tmp_path)
    assert again.returncode == 0 and (out / "generations.jsonl").read_text() == generated  # nothing regenerated


def test_eval_reflector_missing_data_is_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    result = memrl_cli(
        "eval",
        "reflector",
        "--model",
        "tiny-qwen2",
        "--data",
        str(tmp_path / "nope"),
        "--out",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "does not exist" in result.stderr


@pytest.mark.slow
def test_online_check_compares_collab_runs_with_each_reflector(
    smoke_run: Path, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    out = tmp_path / "online"
    result = memrl_cli(
        "eval", "reflector", "--model", str(smoke_run / "export"), "--data", str(smoke_run / "data"),
        "--out", str(out), "--max-samples", "1", "--max-tokens", "8",
        "--online-users", "1", "--online-sessions", "2", "--online-max-turns", "2", "--agent-model", "tiny-qwen2",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    online = json.loads((out / "metrics.json").read_text())["online"]
    assert list(online) == ["baseline", "reflector"]  # the baseline defaults to the export's base model
    for label in online:
        assert online[label]["sessions"] == 2
        sessions = [json.loads(line) for line in (out / "online" / label / "sessions.jsonl").read_text().splitlines()]
        assert all(len([t for t in s["turns"] if t["role"] == "assistant"]) <= 2 for s in sessions)
    deltas = online["reflector"]["deltas_vs_baseline"]
    assert [d["session"] for d in deltas] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["reflector-qwen2.5-7b", "reflector-llama3.1-8b"])
def test_table5_recipes_resolve_and_dry_run_prints_verl_commands(
    recipe: str, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    from memrl.app.recipe import load_recipe

    stages = load_recipe(recipe).recipe.stages
    sft, grpo = stages["sft"], stages["grpo"]
    assert (sft.lr, sft.epochs, sft.batch_size, sft.max_length) == (1e-6, 4, 64, 32768)
    assert (grpo.lr, grpo.max_steps, grpo.batch_size, grpo.rollouts, grpo.kl_coef) == (1e-6, 200, 64, 8, 0.003)
    assert (grpo.max_prompt_length, grpo.max_response_length) == (2048, 1024)

    result = memrl_cli("run", recipe, "--dry-run", f"output_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout + result.stderr
    assert "verl.trainer.sft_trainer" in out and "memrl.train.verl.main" in out
    for override in (
        "algorithm.adv_estimator=memrl_grpo",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.kl_loss_coef=0.003",
        "actor_rollout_ref.actor.optim.lr=1e-06",
        "data.train_batch_size=64",
        "data.max_prompt_length=2048",
        "data.max_response_length=1024",
        "trainer.total_training_steps=200",
        "trainer.n_gpus_per_node=4",  # the 70B server keeps GPUs 4-7 (placement)
        "reward.custom_reward_function.name=compute_score_async",
    ):
        assert override in out, override
    assert f"{tmp_path / 'run'}/sft/final" in out  # GRPO starts from the SFT stage's output
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_dry_run_refuses_an_unknown_verl_override(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    result = memrl_cli(
        "run", "reflector-qwen2.5-7b", "--dry-run", "--stage", "grpo",
        "stages.grpo.overrides=[actor_rollout_ref.actor.optim.lrr=1e-5]", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]  # progress lines come first; the error is one line
    assert last.startswith("memrl: error: ") and "did you mean 'actor_rollout_ref.actor.optim.lr'" in last


@pytest.mark.slow
def test_full_fine_tuning_saves_a_whole_model(smoke_run: Path, tmp_path: Path) -> None:
    """`lora: null` trains every weight; `final/` is then a full model, not an adapter."""
    from memrl.core.checkpoints import is_adapter, read_info
    from memrl.core.errors import ConfigError
    from memrl.train.config import SFTStage
    from memrl.train.hf_trainer import TrainContext
    from memrl.train.trl.sft import train_sft

    stage = SFTStage(kind="sft", model="policy", data="data", lora=None, lr=1e-4, max_steps=1, batch_size=2,
                     micro_batch_size=2, max_length=4096)  # fmt: skip
    ctx = TrainContext(tmp_path / "sft", "sft", seed=0, report_to="none", run_name="full")
    with pytest.raises(ConfigError, match="max_length=64: no SFT sample fits"):
        train_sft(stage.model_copy(update={"max_length": 64}), "tiny-qwen2", smoke_run / "data", ctx)
    final = train_sft(stage, "tiny-qwen2", smoke_run / "data", ctx)
    assert not is_adapter(final) and (final / "model.safetensors").is_file()
    info = read_info(final)
    assert info is not None and info.steps == 1 and not info.adapter and info.base == "tiny-qwen2"


@pytest.mark.slow
def test_eval_reflector_with_an_llm_judge_behind_an_endpoint(
    smoke_run: Path, smollm2_server: Any, tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    """The LLM judge names no preference ids: failures are counted and no hallucination rate is made up."""
    out = tmp_path / "eval-llm"
    result = memrl_cli(
        "eval", "reflector", "--model", str(smoke_run / "export"), "--data", str(smoke_run / "data"),
        "--out", str(out), "--max-samples", "2", "--max-tokens", "8",
        "--judge", "llm", "--endpoint", smollm2_server.url, "--judge-model", smollm2_server.name,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads(result.stdout)
    scored = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert metrics["n"] == 2 and len(scored) == 2
    assert metrics["judge_failures"] == sum(s["judge_failed"] for s in scored)
    assert metrics["hallucination_rate"] is None
    for s in scored:
        assert s["judge_failed"] or 0.0 <= s["judge_score"] <= 3.0


def test_eval_reflector_plan_names_the_stages_decoding(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """`memrl run --dry-run` prints for each model the `eval reflector` command that draws its notes as the stage
    does (sampling, seed, draws), and that command refuses several greedy draws in one line."""
    result = memrl_cli("run", "reflector-quickstart", "--dry-run", f"output_dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = result.stderr.splitlines()  # the plan is the run's console, on stderr
    plans = {line.split("/eval/")[1].split()[0]: line for line in printed if "eval reflector" in line}
    assert set(plans) == {"base", "sft", "grpo"}
    assert all("--max-tokens 160 --temperature 0.7 --seed 0" in line for line in plans.values())
    assert all("--max-samples 48" in line for line in plans.values())  # the recipe judges the first 48 sessions
    assert "--draws 2" in plans["sft"] and "--draws 2" in plans["grpo"] and "--draws" not in plans["base"]
    data = tmp_path / "data.jsonl"
    data.write_text("")
    greedy = memrl_cli(
        "eval", "reflector", "--model", "tiny-qwen2", "--data", str(data), "--out", str(tmp_path / "o"), "--draws", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert greedy.returncode == 2 and greedy.stderr.strip().count("\n") == 0
    assert "more than one draw needs a sampling temperature above 0" in greedy.stderr
    flat = memrl_cli(
        "eval", "reflector", "--model", "tiny-qwen2", "--data", str(data), "--out", str(tmp_path / "o"), "--top-p", "0",
        cwd=tmp_path,
    )  # fmt: skip
    assert flat.returncode == 2 and flat.stderr.strip() == "memrl: error: --top-p must lie above 0, got 0"


def test_eval_reflector_plan_names_an_endpoint_judge(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """With an LLM judge behind an endpoint (the 7B recipe's 70B), the printed command names that endpoint and model:
    `--judge llm` alone would judge with the embedded SmolLM2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMRL_JUDGE_")}  # the recipe's own defaults
    result = memrl_cli(
        "run", "reflector-qwen2.5-7b", "--dry-run", "--stage", "eval", f"output_dir={tmp_path / 'run'}",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    plans = [line for line in result.stderr.splitlines() if "eval reflector" in line]
    assert len(plans) == 3
    judge = "--judge llm --endpoint http://127.0.0.1:8000/v1 --judge-model meta-llama/Llama-3.3-70B-Instruct"
    assert all(judge in line for line in plans)
