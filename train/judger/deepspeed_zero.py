"""DeepSpeed ZeRO configs for multi-GPU judger training (torchrun starts it: memrl.train.distributed)."""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

from memrl.core.errors import ConfigError

BUNDLED_DEEPSPEED = ("zero2", "zero3")


def deepspeed_config(ref: str, *, must_exist: bool = True) -> Path:
    """`zero2` / `zero3` name the configs memrl ships; anything else is a path to a DeepSpeed JSON.

    `must_exist` (a run, not a plan) also wants the JSON file and the deepspeed package, an optional extra.
    """
    if ref in BUNDLED_DEEPSPEED:
        path = Path(str(resources.files("memrl.recipes") / "deepspeed" / f"{ref}.json"))
    else:
        path = Path(ref).expanduser()
        if must_exist and not path.is_file():
            raise ConfigError(
                f"deepspeed: {ref!r} is neither {' nor '.join(BUNDLED_DEEPSPEED)} nor an existing JSON file"
            )
    if must_exist and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(f"deepspeed: {ref!r} needs the deepspeed package: pip install 'memrl[deepspeed]'")
    return path
