"""LLaMA-Factory SFT: the generated YAML (keys, values, DeepSpeed) and, where its environment exists, a real run."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest
import yaml

from memrl.core.errors import ConfigError, MemrlError
from memrl.train.config import ClusterConfig, LoggingTarget, LoraConfig, SFTStage
from memrl.train.llamafactory import backend as lf

# Argument names LLaMA-Factory 0.9.5 accepts, read from its source (llamafactory/hparams/model_args.py,
# data_args.py, finetuning_args.py, training_args.py) and the HF Seq2SeqTrainingArguments it extends. Its own
# parser cannot run in our environment (its pins clash with ours), so the YAML is checked against this list here;
# the slow test below runs the real parser, which rejects unknown keys.
LLAMAFACTORY_KEYS = {
    # ModelArguments
    "model_name_or_path", "adapter_name_or_path", "trust_remote_code", "cache_dir", "flash_attn", "resize_vocab",
    "disable_gradient_checkpointing", "quantization_bit", "infer_backend",
    # DataArguments
    "template", "dataset", "eval_dataset", "dataset_dir", "cutoff_len", "overwrite_cache", "max_samples",
    "preprocessing_num_workers", "val_size", "packing", "train_on_prompt", "mask_history", "default_system",
    # FinetuningArguments (+ Lora/Freeze/RLHF mixins)
    "stage", "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_rslora",
    "use_dora", "plot_loss", "pure_bf16",
    # TrainingArguments (LLaMA-Factory adds overwrite_output_dir back for transformers 5)
    "overwrite_output_dir", "output_dir", "do_train", "do_eval", "per_device_train_batch_size",
    "per_device_eval_batch_size", "gradient_accumulation_steps", "learning_rate", "num_train_epochs", "max_steps",
    "lr_scheduler_type", "warmup_ratio", "warmup_steps", "logging_steps", "save_steps", "save_strategy",
    "save_total_limit", "eval_strategy", "eval_steps", "report_to", "run_name", "seed", "bf16", "fp16", "use_cpu",
    "deepspeed", "ddp_timeout", "dataloader_num_workers", "resume_from_checkpoint", "gradient_checkpointing",
}  # fmt: skip


def stage(**update: object) -> SFTStage:
    base = SFTStage(
        kind="sft",
        trainer="llamafactory",
        model="policy",
        data="data",
        lora=LoraConfig(rank=16, alpha=32, dropout=0.1),
        lr=1e-6,
        epochs=4,
        batch_size=64,
        micro_batch_size=2,
        max_length=32768,
        cluster=ClusterConfig(nnodes=1, gpus_per_node=8),
    )
    return base.model_copy(update=update)


def build(sft: SFTStage, *, cpu: bool = False, model: str = "Qwen/Qwen2.5-7B-Instruct", **kwargs: object) -> dict:
    return lf.sft_yaml(
        sft, model_path=model, dataset_dir=Path("/d/llamafactory"), out_dir=Path("/o"), cpu=cpu, **kwargs
    )


def test_yaml_carries_the_stage() -> None:
    args = build(stage(warmup_ratio=0.05), report_to="wandb", run_name="reflector-sft", seed=7)
    assert args["model_name_or_path"] == "Qwen/Qwen2.5-7B-Instruct"
    assert (args["stage"], args["do_train"], args["finetuning_type"]) == ("sft", True, "lora")
    assert (args["lora_rank"], args["lora_alpha"], args["lora_dropout"], args["lora_target"]) == (16, 32, 0.1, "all")
    assert (args["dataset"], args["eval_dataset"]) == ("memrl_reflection_train", "memrl_reflection_eval")
    assert args["dataset_dir"] == "/d/llamafactory"
    assert (args["template"], args["cutoff_len"]) == ("qwen", 32768)
    assert (args["learning_rate"], args["num_train_epochs"], args["warmup_ratio"]) == (1e-6, 4.0, 0.05)
    # 64 sequences per step = 2 per device x 8 devices x 4 accumulation steps
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == (2, 4)
    assert (args["save_steps"], args["eval_steps"], args["logging_steps"]) == (50, 50, 1)
    assert (args["output_dir"], args["report_to"], args["run_name"], args["seed"]) == (
        "/o",
        "wandb",
        "reflector-sft",
        7,
    )
    assert args["bf16"] is True and "use_cpu" not in args
    assert args["deepspeed"] == lf.DEEPSPEED_FILE
    assert args["overwrite_output_dir"] is False  # resume from the newest checkpoint-N
    assert "max_steps" not in args


def test_full_finetuning_on_cpu_and_overrides() -> None:
    args = build(
        stage(lora=None, max_steps=5, batch_size=4, micro_batch_size=2, overrides=["learning_rate=2e-5", "template=x"]),
        cpu=True,
        resume=False,
    )
    assert args["finetuning_type"] == "full" and not any(k.startswith("lora_") for k in args)
    assert (args["use_cpu"], args["bf16"], args["dataloader_num_workers"]) == (True, False, 0)
    assert "deepspeed" not in args  # one device
    assert (args["gradient_accumulation_steps"], args["max_steps"]) == (2, 5)
    assert args["learning_rate"] == 2e-5 and isinstance(args["learning_rate"], float)
    assert args["template"] == "x"
    assert args["overwrite_output_dir"] is True
    with pytest.raises(ConfigError, match="not a multiple"):
        build(stage(micro_batch_size=3))
    with pytest.raises(ConfigError, match="key=value"):
        build(stage(overrides=["learning_rate"]))


def test_keys_are_ones_llamafactory_accepts() -> None:
    """Checked against a list taken from LLaMA-Factory 0.9.5's source, not its parser (see LLAMAFACTORY_KEYS)."""
    variants = [
        build(stage(), report_to="wandb", run_name="r"),
        build(stage(lora=None, max_steps=3), cpu=True),
        build(stage(lora=LoraConfig(target_modules=["q_proj", "v_proj"]), cluster=ClusterConfig(gpus_per_node=1))),
    ]
    for args in variants:
        assert set(args) <= LLAMAFACTORY_KEYS, set(args) - LLAMAFACTORY_KEYS
    assert variants[2]["lora_target"] == "q_proj,v_proj"


def test_write_yaml_puts_zero2_next_to_it(tmp_path: Path) -> None:
    path = lf.write_yaml(build(stage()), tmp_path / "sft" / "llamafactory.yaml")
    loaded = yaml.safe_load(path.read_text())
    ds = Path(loaded["deepspeed"])
    assert ds == (tmp_path / "sft" / lf.DEEPSPEED_FILE).resolve()
    zero = json.loads(ds.read_text())
    assert zero["zero_optimization"]["stage"] == 2
    assert zero["train_micro_batch_size_per_gpu"] == "auto"  # the Trainer fills it from the YAML
    assert loaded["learning_rate"] == 1e-6 and loaded["lora_target"] == "all"
    single = lf.write_yaml(build(stage(), cpu=True), tmp_path / "cpu" / "llamafactory.yaml")
    assert "deepspeed" not in yaml.safe_load(single.read_text())
    assert not (tmp_path / "cpu" / lf.DEEPSPEED_FILE).exists()


def test_cli_env() -> None:
    assert lf.cli_env(stage(), cpu=True) == {"CUDA_VISIBLE_DEVICES": ""}
    assert lf.cli_env(stage(cluster=ClusterConfig(nnodes=2, gpus_per_node=8)), cpu=False) == {
        "NPROC_PER_NODE": "8",
        "NNODES": "2",
        "FORCE_TORCHRUN": "1",
    }
    assert "FORCE_TORCHRUN" not in lf.cli_env(stage(cluster=ClusterConfig(gpus_per_node=1)), cpu=False)


def test_template_by_model_family(tmp_path: Path) -> None:
    def local(name: str, **config: object) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return str(tmp_path / name)

    # A local folder's config.json decides, whatever the folder is called.
    assert lf.template_for(local("tiny-qwen2", model_type="qwen2", vocab_size=1024)) == "qwen"
    assert lf.template_for(local("Llama-3-lookalike", model_type="llama", vocab_size=1024)) == "chatml"
    assert lf.template_for(local("ckpt", model_type="llama", vocab_size=128256)) == "llama3"
    assert lf.template_for(local("q3", model_type="qwen3")) == "qwen3"
    assert lf.template_for("Qwen/Qwen2.5-7B-Instruct") == "qwen"
    assert lf.template_for("Qwen/Qwen3-8B") == "qwen3"
    assert lf.template_for("meta-llama/Llama-3.1-8B-Instruct") == "llama3"
    assert lf.template_for("HuggingFaceTB/SmolLM2-135M-Instruct") == "chatml"


def write_dataset(folder: Path, train: int = 8, evaluation: int = 4) -> Path:
    """A reflection dataset folder in the layout data_gen writes for LLaMA-Factory."""
    from memrl.data_gen.writers import LLAMAFACTORY_NAMES, llamafactory_entry

    target = folder / lf.DATASET_SUBDIR
    target.mkdir(parents=True)
    gold = json.dumps({"user_preferences_reasoning": "asked twice for brevity", "agent_notes": "Keep answers short."})
    info = {}
    for split, count in (("train", train), ("eval", evaluation)):
        rows = [
            {
                "messages": [
                    {"role": "user", "content": f"Session {i}: the user said 'shorter, please' twice."},
                    {"role": "assistant", "content": gold},
                ]
            }
            for i in range(count)
        ]
        name = LLAMAFACTORY_NAMES[split]
        (target / f"{name}.json").write_text(json.dumps(rows))
        info[name] = llamafactory_entry(f"{name}.json")
    (target / "dataset_info.json").write_text(json.dumps(info))
    return target


def test_dataset_folder(tmp_path: Path) -> None:
    target = write_dataset(tmp_path / "data")
    assert lf.dataset_folder(tmp_path / "data") == target
    assert lf.dataset_folder(target) == target
    with pytest.raises(ConfigError, match="reflection_data"):
        lf.dataset_folder(tmp_path / "nothing")
    (target / "dataset_info.json").write_text(json.dumps({"other": {}}))
    with pytest.raises(ConfigError, match="memrl_reflection_eval"):
        lf.dataset_folder(tmp_path / "data")


def test_a_failing_run_raises_with_its_last_lines(tmp_path: Path) -> None:
    cli = tmp_path / "llamafactory-cli"
    cli.write_text('#!/bin/sh\nfor i in $(seq 1 30); do echo "step $i"; done\necho "args: $*"\nexit 4\n')
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "lf.log"
    with pytest.raises(MemrlError) as err:
        lf.run_llamafactory(tmp_path / "sft.yaml", cli, log)
    message = str(err.value)
    assert message.splitlines()[0].startswith("llamafactory-cli train exited with code 4")
    assert f"args: train {tmp_path / 'sft.yaml'}" in message
    assert "step 12\n" in message and "step 11\n" not in message  # the last 20 lines
    assert "step 1" in log.read_text()


# --- a real run, where LLaMA-Factory's environment exists ---------------------------------------------------------


def two_steps() -> SFTStage:
    """A LoRA SFT of two steps on one GPU's worth of settings, small enough for a CPU."""
    return stage(
        lora=LoraConfig(rank=4, alpha=8),
        lr=1e-3,
        max_steps=2,
        batch_size=2,
        micro_batch_size=1,
        max_length=256,
        checkpoints=LoggingTarget(save_steps=2),
        cluster=ClusterConfig(gpus_per_node=1),
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_real_lora_sft_two_steps(tiny_qwen2: str, tmp_path: Path, llamafactory_venv: Path) -> None:
    from memrl.train.llamafactory.venv import cli_path

    sft = two_steps()
    write_dataset(tmp_path / "data")
    data = lf.dataset_folder(tmp_path / "data")
    # The default logging of a recipe run (wandb), kept offline: the environment must have what the YAML names.
    args = lf.sft_yaml(
        sft, model_path=tiny_qwen2, dataset_dir=data, out_dir=tmp_path / "out", cpu=True, report_to="wandb"
    )
    path = lf.write_yaml(args, tmp_path / "llamafactory.yaml")
    wandb_env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    started = time.monotonic()
    lf.run_llamafactory(
        path, cli_path(llamafactory_venv), tmp_path / "lf.log", env=lf.cli_env(sft, cpu=True) | wandb_env
    )
    print(f"LLaMA-Factory 2-step LoRA SFT on CPU: {time.monotonic() - started:.1f}s")
    out = tmp_path / "out"
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (4, 8)
    assert adapter["base_model_name_or_path"] == tiny_qwen2
    assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file()
    steps = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    losses = [s["loss"] for s in steps if "loss" in s]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    assert json.loads((out / "all_results.json").read_text())["eval_loss"] > 0
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run.glob("run-*.wandb"))  # the losses went to wandb's offline log


def test_save_final_keeps_the_model_not_the_checkpoints(tmp_path: Path) -> None:
    from memrl.core.checkpoints import read_info

    output = tmp_path / lf.OUTPUT_SUBDIR
    for name in ("adapter_config.json", "checkpoint-2/adapter_model.safetensors", "runs/events"):
        (output / name).parent.mkdir(parents=True, exist_ok=True)
        (output / name).write_text("{}")
    (output / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    final = lf.save_final(tmp_path, base="Qwen/x", stage="sft")
    assert sorted(p.name for p in final.iterdir()) == [
        "adapter_config.json",
        "memrl_checkpoint.json",
        "trainer_state.json",
    ]
    info = read_info(final)
    assert info is not None
    assert (info.base, info.trainer, info.stage, info.steps, info.adapter) == (
        "Qwen/x",
        "llamafactory-sft",
        "sft",
        2,
        True,
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_backend_runs_a_stage_into_final(
    tiny_qwen2: str, tmp_path: Path, llamafactory_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run` from a StageRun: the YAML it describes, LLaMA-Factory in its own environment, then `final/`."""
    from rich.console import Console

    from memrl.core.checkpoints import read_info
    from memrl.train.llamafactory import venv as lfe
    from memrl.train.stage_run import StageRun

    monkeypatch.setattr(lfe, "default_env_dir", lambda: llamafactory_venv)  # the environment this machine has
    sft = two_steps()
    write_dataset(tmp_path / "data")
    where = StageRun(tmp_path / "run" / "sft", "sft", "lf", "memrl", False, 3, frozenset(), Console(stderr=True))
    yaml_path = where.out_dir / lf.YAML_FILE
    command, plan = lf.describe(sft, where, tiny_qwen2, tmp_path / "data")  # what a GPU node would run, its plan
    assert command == f"NPROC_PER_NODE=1 NNODES=1 llamafactory-cli train {yaml_path}"
    assert plan.startswith("placement: 1 GPUs")
    lf.run(sft, where, tiny_qwen2, tmp_path / "data")
    written = yaml.safe_load(yaml_path.read_text())
    assert (written["run_name"], written["seed"], written["report_to"]) == ("lf-sft", 3, "none")
    info = read_info(where.out_dir / "final")
    assert info is not None and (info.trainer, info.stage, info.steps, info.adapter) == (
        "llamafactory-sft",
        "sft",
        2,
        True,
    )
    assert not list((where.out_dir / "final").glob("checkpoint-*"))
