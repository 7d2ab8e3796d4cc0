"""What a training stage leaves behind, and how later stages, export and evaluation load it.

A stage writes `<stage>/final/`: a full model, or a PEFT adapter whose `adapter_config.json` names its base. Every
`final/` also carries `memrl_checkpoint.json` (base model, trainer, steps), so export can describe it in a card. A
verl run's FSDP checkpoint is told apart by its layout alone (`is_verl_checkpoint`): export merges it first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memrl.core import models
from memrl.core.errors import ConfigError
from memrl.core.files import read_json

INFO_FILE = "memrl_checkpoint.json"
ADAPTER_CONFIG = "adapter_config.json"
VERL_FSDP_CONFIG = "fsdp_config.json"  # beside verl's FSDP shards
VERL_TRACKER = "latest_checkpointed_iteration.txt"  # the newest step, in verl's checkpoint root


@dataclass(frozen=True)
class CheckpointInfo:
    base: str  # the model the adapter applies to, or the model itself for a full checkpoint
    trainer: str
    stage: str
    steps: int
    adapter: bool

    def save(self, folder: Path) -> None:
        (folder / INFO_FILE).write_text(json.dumps(asdict(self), indent=2))


def is_adapter(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file()


def final_dir(folder: Path) -> Path:
    """A stage folder's `final/` when it has one, else the folder itself."""
    return folder / "final" if (folder / "final").is_dir() else folder


def read_info(folder: Path) -> CheckpointInfo | None:
    path = folder / INFO_FILE
    if not path.is_file():
        return None
    data = read_json(path, ConfigError)
    try:
        return CheckpointInfo(**data)
    except TypeError:  # not an object, or other keys: a file of another tool under our name
        raise ConfigError(f"{path}: expected a JSON object with {', '.join(CheckpointInfo.__annotations__)}") from None


def adapter_base(folder: Path) -> str:
    """The base model a PEFT adapter was trained on (memrl's record first, PEFT's own field second)."""
    info = read_info(folder)
    if info is not None:
        return info.base
    config = read_json(folder / ADAPTER_CONFIG, ConfigError)
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base:
        raise ConfigError(f"{folder}: adapter_config.json names no base model; pass the base explicitly")
    return str(base)


def last_step_dir(
    stage_dir: Path, prefix: str = "checkpoint-", complete: Callable[[Path], bool] | None = None
) -> Path | None:
    """The newest `<prefix>N` folder a trainer saved (TRL: checkpoint-N, verl: global_step_N), or None; with
    `complete`, the newest for which it holds (a save cut short by a signal or a crash is passed over)."""
    step = re.compile(re.escape(prefix) + r"(\d+)$")
    found = [(int(m.group(1)), p) for p in stage_dir.glob(f"{prefix}*") if (m := step.search(p.name))]
    found = [(n, p) for n, p in found if complete is None or complete(p)]
    return max(found)[1] if found else None


def trainer_saved(folder: Path) -> bool:
    """Whether a Hugging Face Trainer checkpoint is whole: it writes trainer_state.json last."""
    try:
        return isinstance(json.loads((folder / "trainer_state.json").read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def verl_shard_dir(path: Path) -> Path:
    """The folder holding verl's FSDP shards. Accepts it directly, a `global_step_N` folder (PPO keeps the policy
    in `actor/`), or a run's checkpoint root, where the newest step is read from verl's tracker file."""
    path = path.expanduser()
    if (path / VERL_FSDP_CONFIG).is_file():
        return path
    if (path / "actor" / VERL_FSDP_CONFIG).is_file():
        return path / "actor"
    tracker = path / VERL_TRACKER
    if tracker.is_file():
        return verl_shard_dir(path / f"global_step_{tracker.read_text().strip()}")
    if (path / "checkpoints" / VERL_TRACKER).is_file():
        return verl_shard_dir(path / "checkpoints")
    raise ConfigError(
        f"{path}: no verl FSDP checkpoint ({VERL_FSDP_CONFIG}) here, in actor/, or named by {VERL_TRACKER}"
    )


def is_verl_checkpoint(path: Path) -> bool:
    """Whether `path` is (or holds, as a run or checkpoint root) a verl FSDP checkpoint."""
    try:
        verl_shard_dir(path)
    except ConfigError:
        return False
    return True


def resolve_model(ref: str) -> str:
    """A model reference (embedded name, path, hub id, or a stage's checkpoint folder) as `from_pretrained` wants it."""
    path = Path(ref).expanduser()
    if path.is_dir() and (path / "final").is_dir():
        path = path / "final"
    if path.is_dir():
        if not (is_adapter(path) or (path / "config.json").is_file()):
            raise ConfigError(f"{path} holds neither a model (config.json) nor a PEFT adapter (adapter_config.json)")
        return str(path)
    return models.resolve(ref)


def portable_ref(ref: str) -> str:
    """How a checkpoint records its base: embedded names and hub ids as given, local folders as absolute paths."""
    if models.lookup(ref) is not None or not Path(ref).expanduser().exists():
        return ref
    return str(Path(ref).expanduser().resolve())


def load_causal_lm(ref: str, *, trainable_adapter: bool = False, dtype: Any = None) -> Any:
    """Load a full model or base + adapter. A trainable adapter stays a PeftModel; otherwise it is merged."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path = resolve_model(ref)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    if not is_adapter(Path(path)):
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(adapter_base(Path(path))), **kwargs)
    model = PeftModel.from_pretrained(base, path, is_trainable=trainable_adapter)
    return model if trainable_adapter else model.merge_and_unload()


def tokenizer_source(ref: str) -> str:
    """Where the tokenizer lives: the checkpoint when it saved one, else its base model."""
    path = Path(resolve_model(ref))
    if path.is_dir() and ((path / "tokenizer_config.json").is_file() or not is_adapter(path)):
        return str(path)
    return resolve_model(adapter_base(path))
