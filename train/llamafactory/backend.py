"""SFT with LLaMA-Factory: a recipe stage becomes the YAML `llamafactory-cli train` reads, run in its own environment
(`run`; `describe` is that command), its output copied to the stage's `final/`.

The dataset is the `llamafactory/` folder data_gen writes (dataset_info.json names the train and eval splits).
On several GPUs LLaMA-Factory starts torchrun itself and memrl adds a DeepSpeed ZeRO-2 config; several nodes take
LLaMA-Factory's own variables (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT) on each node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from memrl.core.checkpoints import CheckpointInfo, is_adapter, portable_ref, resolve_model
from memrl.core.errors import ConfigError, MemrlError
from memrl.core.files import read_json
from memrl.core.outcomes import require_data
from memrl.core.yamlsafe import load_yaml
from memrl.train import loopback
from memrl.train.config import LoraConfig, SFTStage
from memrl.train.distributed import ranks_env
from memrl.train.placement import trainer_cluster, trainer_env
from memrl.train.processes import run_logged
from memrl.train.registry import StageRunner
from memrl.train.stage_run import StageRun

TRAIN_DATASET = "memrl_reflection_train"
EVAL_DATASET = "memrl_reflection_eval"
DATASET_SUBDIR = "llamafactory"
OUTPUT_SUBDIR = "llamafactory"  # in the stage folder: LLaMA-Factory's output_dir
YAML_FILE = "llamafactory.yaml"  # in the stage folder
DEEPSPEED_FILE = "ds_z2_config.json"
DEFAULT_TEMPLATE = "chatml"
_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")

# ZeRO-2 with every size left to the HF Trainer ("auto"), which fills them from the YAML's batch settings.
ZERO2: dict[str, Any] = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_allow_untested_optimizer": True,
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "allgather_partitions": True,
        "allgather_bucket_size": 500_000_000,
        "reduce_bucket_size": 500_000_000,
    },
}


def dataset_folder(data_dir: Path) -> Path:
    """The LLaMA-Factory dataset folder of a data_gen output (or that folder itself)."""
    for folder in (data_dir / DATASET_SUBDIR, data_dir):
        info = folder / "dataset_info.json"
        if info.is_file():
            entries = read_json(info, ConfigError)
            if not isinstance(entries, dict):
                raise ConfigError(f"{info}: expected a JSON object of datasets")
            missing = {TRAIN_DATASET, EVAL_DATASET} - set(entries)
            if missing:
                raise ConfigError(f"{info} does not define {sorted(missing)}")
            for name in (TRAIN_DATASET, EVAL_DATASET):  # LLaMA-Factory fails on an empty one far later, less clearly
                entry = entries[name]
                file = entry.get("file_name") if isinstance(entry, dict) else None
                if not isinstance(file, str):
                    raise ConfigError(f"{info}: {name} names no file_name")
                require_data(folder / file, f"LLaMA-Factory dataset {name}:", "run the reflection_data stage first")
            return folder
    raise ConfigError(f"{data_dir}: no {DATASET_SUBDIR}/dataset_info.json; run the reflection_data stage first")


def template_for(model_path: str) -> str:
    """LLaMA-Factory's chat template for a model: from its config.json when local, else from its name."""
    config_file = Path(model_path).expanduser() / "config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        model_type = str(config.get("model_type", ""))
        if model_type == "qwen3":
            return "qwen3"
        if model_type.startswith("qwen2"):
            return "qwen"
        # Llama 3.x has the 128k vocabulary; Llama 2 and other llama-shaped models keep the default.
        if model_type == "llama" and int(config.get("vocab_size", 0)) >= 128_000:
            return "llama3"
        return DEFAULT_TEMPLATE
    name = model_path.lower().replace("_", "-")
    if "qwen3" in name:
        return "qwen3"
    if "qwen2" in name or "qwen-2" in name:
        return "qwen"
    if "llama-3" in name or "llama3" in name:
        return "llama3"
    return DEFAULT_TEMPLATE


def _lora_target(lora: LoraConfig) -> str:
    if isinstance(lora.target_modules, str):
        return "all" if lora.target_modules == "all-linear" else lora.target_modules
    return ",".join(lora.target_modules)


def sft_yaml(
    stage: SFTStage,
    *,
    model_path: str,
    dataset_dir: Path,
    out_dir: Path,
    cpu: bool,
    report_to: str = "none",
    run_name: str | None = None,
    seed: int = 42,
    resume: bool = True,
) -> dict[str, Any]:
    """The `llamafactory-cli train` arguments for an SFT stage; `stage.overrides` (`key=value`) are applied last.

    `dataset_dir` is the folder holding dataset_info.json (see `dataset_folder`). A relative `deepspeed` entry is
    resolved next to the YAML by `write_yaml`, which also writes the ZeRO-2 config there.
    """
    world = 1 if cpu else stage.cluster.nnodes * trainer_cluster(stage).gpus_per_node
    per_step = stage.micro_batch_size * world
    if stage.batch_size % per_step:
        raise ConfigError(
            f"LLaMA-Factory SFT: batch_size {stage.batch_size} is not a multiple of "
            f"micro_batch_size {stage.micro_batch_size} x {world} device(s)"
        )
    args: dict[str, Any] = {
        "model_name_or_path": model_path,
        "trust_remote_code": False,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full" if stage.lora is None else "lora",
    }
    if stage.lora is not None:
        args |= {
            "lora_rank": stage.lora.rank,
            "lora_alpha": stage.lora.alpha,
            "lora_dropout": stage.lora.dropout,
            "lora_target": _lora_target(stage.lora),
        }
    args |= {
        "dataset": TRAIN_DATASET,
        "eval_dataset": EVAL_DATASET,
        "dataset_dir": str(dataset_dir),
        "template": template_for(model_path),
        "cutoff_len": stage.max_length,
        "overwrite_cache": True,
        "output_dir": str(out_dir),
        "logging_steps": stage.checkpoints.logging_steps,
        "save_strategy": "steps",
        "save_steps": stage.checkpoints.save_steps,
        "save_total_limit": stage.checkpoints.keep,
        "plot_loss": True,
        # LLaMA-Factory resumes from the newest checkpoint-N in output_dir unless told to overwrite it.
        "overwrite_output_dir": not resume,
        "report_to": report_to,
        "per_device_train_batch_size": stage.micro_batch_size,
        "gradient_accumulation_steps": stage.batch_size // per_step,
        "learning_rate": stage.lr,
        "num_train_epochs": float(stage.epochs),
        "warmup_ratio": stage.warmup_ratio,
        "lr_scheduler_type": stage.lr_scheduler,
        "seed": seed,
        "per_device_eval_batch_size": stage.micro_batch_size,
        "eval_strategy": "steps",
        "eval_steps": stage.checkpoints.save_steps,
    }
    if stage.max_steps is not None:
        args["max_steps"] = stage.max_steps
    if run_name is not None:
        args["run_name"] = run_name
    if cpu:
        # fp32 on CPU; no worker processes on a small shared machine.
        args |= {"use_cpu": True, "bf16": False, "dataloader_num_workers": 0}
    else:
        args |= {"bf16": True, "ddp_timeout": 180_000}
        if world > 1:
            args["deepspeed"] = DEEPSPEED_FILE
    return apply_overrides(args, stage.overrides)


def apply_overrides(args: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`key=value` pairs (values read as YAML) set or replace arguments; LLaMA-Factory's parser checks the keys."""
    out = dict(args)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"LLaMA-Factory override {item!r} is not key=value")
        out[key] = _scalar(raw, f"LLaMA-Factory override {item!r}")
    return out


def _scalar(raw: str, where: str) -> Any:
    """A YAML value, with `2e-5` read as the number it means (YAML 1.1 wants `2.0e-5`)."""
    value = load_yaml(raw, where, ConfigError) if raw.strip() else ""
    if isinstance(value, str) and _EXPONENT.match(value):
        return float(value)
    return value


def write_yaml(args: Mapping[str, Any], path: Path) -> Path:
    """Write the YAML (and, when it names a relative DeepSpeed file, our ZeRO-2 config next to it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = dict(args)
    deepspeed = out.get("deepspeed")
    if isinstance(deepspeed, str) and not Path(deepspeed).is_absolute():
        ds_path = path.parent / deepspeed
        if not ds_path.exists():
            ds_path.write_text(json.dumps(ZERO2, indent=2) + "\n")
        out["deepspeed"] = str(ds_path.resolve())
    path.write_text(yaml.safe_dump(out, sort_keys=False))
    return path


def cli_env(stage: SFTStage, cpu: bool) -> dict[str, str]:
    """Variables LLaMA-Factory's launcher reads: torchrun across the GPUs of this node the placement plan leaves the
    trainer (the others hold served models), and the node count."""
    if cpu:
        return {"CUDA_VISIBLE_DEVICES": ""}
    per_node = trainer_cluster(stage).gpus_per_node
    env = {"NPROC_PER_NODE": str(per_node), "NNODES": str(stage.cluster.nnodes), **trainer_env(stage)}
    if stage.cluster.nnodes * per_node > 1:
        env["FORCE_TORCHRUN"] = "1"
        env |= ranks_env(stage.cluster)  # one node: the ranks' own sockets on the loopback interface
    return env


def loopback_torchrun(bin_dir: Path, python: Path) -> Path:
    """A `torchrun` for LLaMA-Factory's launcher to find first on PATH (it runs torchrun by name): memrl's loopback
    launcher (`memrl.train.loopback`), run by path with LLaMA-Factory's own python, so that on one node torchrun's
    stores listen on 127.0.0.1 only. Its environment lacks memrl; the module needs only torch. Returns `bin_dir`."""
    run = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "torchrun"
    argv = shlex.join([str(python), "-c", run, str(Path(loopback.__file__).resolve()), "torchrun"])
    shim.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def command(yaml_path: Path, cli_path: Path) -> list[str]:
    return [str(cli_path), "train", str(yaml_path)]


def run_llamafactory(
    yaml_path: Path, cli_path: Path, log: Path, *, env: Mapping[str, str] | None = None, tail: int = 20
) -> None:
    """Run `llamafactory-cli train` from its own environment; output goes to the console and `log`."""
    if not cli_path.is_file():
        raise MemrlError(f"{cli_path} does not exist: create the environment with `memrl env llamafactory`")
    base = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PIP_CONSTRAINT"}}
    base["PATH"] = f"{cli_path.parent}:{base.get('PATH', '')}"
    env = dict(env or {})
    if env.get("FORCE_TORCHRUN") == "1" and env.get("NNODES", "1") == "1":
        base["PATH"] = f"{loopback_torchrun(log.parent / '.bin', cli_path.parent / 'python')}:{base['PATH']}"
    argv = command(yaml_path, cli_path)
    run_logged(argv, log, name="llamafactory-cli train", shown=" ".join(argv), env=base | env, tail=tail)


def save_final(out: Path, *, base: str, stage: str) -> Path:
    """A finished run's `final/`: LLaMA-Factory's output folder without its intermediate checkpoints, with the
    checkpoint info written last, so that its presence means the stage finished."""
    final = out / "final"
    shutil.rmtree(final, ignore_errors=True)
    shutil.copytree(out / OUTPUT_SUBDIR, final, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    state = final / "trainer_state.json"
    steps = json.loads(state.read_text()).get("global_step", 0) if state.is_file() else 0
    CheckpointInfo(base, "llamafactory-sft", stage, int(steps), is_adapter(final)).save(final)
    return final


def _stage_yaml(stage: SFTStage, where: StageRun, base: str, data: Path, *, dry_run: bool) -> dict[str, Any]:
    import torch

    return sft_yaml(
        stage,
        model_path=base if dry_run else resolve_model(base),
        dataset_dir=dataset_folder(data),
        out_dir=where.out_dir / OUTPUT_SUBDIR,
        cpu=not torch.cuda.is_available(),
        report_to=where.report_to,
        run_name=where.experiment,
        seed=where.seed,
    )


def run(stage: SFTStage, where: StageRun, base: str, data: Path) -> None:
    """Write the stage's YAML, run it in LLaMA-Factory's own environment (created on first use), save `final/`."""
    import torch

    from memrl.train.llamafactory.venv import default_env_dir, ensure_env

    yaml_path = write_yaml(_stage_yaml(stage, where, base, data, dry_run=False), where.out_dir / YAML_FILE)
    with where.console.status("preparing LLaMA-Factory's own environment"):
        cli = ensure_env(default_env_dir())
    env = cli_env(stage, not torch.cuda.is_available())
    run_llamafactory(yaml_path, cli, where.out_dir / "llamafactory.log", env=env)
    save_final(where.out_dir, base=portable_ref(base), stage=where.stage)


def describe(stage: SFTStage, where: StageRun, base: str, data: Path) -> list[str]:
    """The command with the variables it runs under on a GPU node, then the stage's placement plan."""
    from memrl.train.placement import stage_plan

    _stage_yaml(stage, where, base, data, dry_run=True)  # refuses knobs LLaMA-Factory lacks, here too
    env = " ".join(f"{k}={v}" for k, v in cli_env(stage, cpu=False).items())
    return [f"{env} llamafactory-cli train {where.out_dir / YAML_FILE}", stage_plan(stage, base).text()]


SFT = StageRunner(run, describe)
