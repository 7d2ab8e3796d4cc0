"""Score with a trained judger: `load_judger(folder).score(items)` -> P(relevant) per item, batched."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memrl.core.checkpoints import final_dir, resolve_model
from memrl.core.errors import ConfigError
from memrl.rollout.judger.heads import Head, build_head
from memrl.rollout.judger.inputs import JudgerInput

JUDGER_FILE = "memrl_judger.json"


@dataclass(frozen=True)
class JudgerInfo:
    """What a scorer needs to rebuild the judger: the head, its base, the input budget, adapter or merged."""

    head: str
    base: str
    max_length: int
    adapter: bool

    def save(self, folder: Path) -> None:
        (folder / JUDGER_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, folder: Path) -> JudgerInfo:
        path = folder / JUDGER_FILE
        if not folder.is_dir():
            raise ConfigError(f"judger {folder} does not exist")
        if not path.is_file():
            raise ConfigError(f"{folder} is not a trained judger: {JUDGER_FILE} is missing")
        try:
            data = json.loads(path.read_text())
            return cls(str(data["head"]), str(data["base"]), int(data["max_length"]), bool(data["adapter"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ConfigError(f"{path}: expected a JSON object with head, base, max_length, adapter") from None


class JudgerScorer:
    """A judger model in eval mode. Items are batched by similar length; the output keeps the input order."""

    def __init__(self, model: Any, head: Head, device: str = "cpu") -> None:
        self.model = model.eval()
        self.head = head
        self.device = device

    def score(self, items: Sequence[JudgerInput], batch_size: int = 32) -> list[float]:
        import torch

        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        order = sorted(range(len(items)), key=lambda i: _rough_length(items[i]))
        out = [0.0] * len(items)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                batch = {k: v.to(self.device) for k, v in self.head.encode([items[i] for i in chunk]).items()}
                probs = torch.sigmoid(self.head.logits(self.model, batch).float()).tolist()
                for i, p in zip(chunk, probs, strict=True):
                    out[i] = float(p)
        return out


def _rough_length(item: JudgerInput) -> int:
    return sum(len(t["utterance"]) for t in item.context) + len(item.question) + len(item.answer)


def judger_folder(path: str | Path) -> Path:
    """A stage folder names its `final/`; anything else is the judger folder itself."""
    return final_dir(Path(path).expanduser())


def load_judger(path: str | Path, device: str | None = None) -> JudgerScorer:
    """The judger saved in `path` (a stage folder or its final/), on the GPU when there is one."""
    import torch
    from transformers import AutoTokenizer

    folder = judger_folder(path)
    info = JudgerInfo.read(folder)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else None
    head = build_head(info.head, AutoTokenizer.from_pretrained(str(folder)), info.max_length)
    if info.adapter:
        from peft import PeftModel

        base = head.load_model(resolve_model(info.base), dtype=dtype)
        model = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    else:
        model = head.load_model(str(folder), dtype=dtype)
    return JudgerScorer(model.to(device), head, device)
