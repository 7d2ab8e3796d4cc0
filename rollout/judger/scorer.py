"""Score with a trained judger: `load_judger(folder).score(items)` -> P(relevant) per item, batched."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memrl.core.checkpoints import final_dir, resolve_model
from memrl.core.errors import ConfigError
from memrl.rollout.judger.heads import Columns, Head, build_head
from memrl.rollout.judger.inputs import JudgerInput

JUDGER_FILE = "memrl_judger.json"
PAD_SLACK = 1.125  # in a batch, the longest item is at most this many times the shortest


@dataclass(frozen=True)
class JudgerInfo:
    """What a scorer needs to rebuild the judger: the head, its base, the input budget, adapter or merged; and the
    fusion alpha chosen on the training individuals (None: not chosen, e.g. a judger trained before it existed) with
    how it was chosen, in a few words (None in files written before the rule was recorded)."""

    head: str
    base: str
    max_length: int
    adapter: bool
    alpha: float | None = None
    alpha_rule: str | None = None

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
            alpha, rule = data.get("alpha"), data.get("alpha_rule")
            info = cls(str(data["head"]), str(data["base"]), int(data["max_length"]), bool(data["adapter"]),
                       None if alpha is None else float(alpha), None if rule is None else str(rule))  # fmt: skip
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(f"{path}: expected a JSON object with head, base, max_length, adapter") from None
        if info.alpha is not None and not 0.0 <= info.alpha <= 1.0:
            raise ConfigError(f"{path}: alpha must lie in [0, 1], got {info.alpha}")
        return info


class JudgerScorer:
    """A judger model in eval mode. Items are tokenized together and batched by token count; the output keeps the
    input order."""

    def __init__(self, model: Any, head: Head, device: str = "cpu") -> None:
        self.model = model.eval()
        self.head = head
        self.device = device

    def score(self, items: Sequence[JudgerInput], batch_size: int = 32) -> list[float]:
        import torch

        order: list[int] = []
        logits = []
        with torch.inference_mode():
            for chunk, batch in self.batches(items, batch_size):
                order += chunk
                logits.append(self.head.logits(self.model, batch).float())
            if not logits:
                return []
            probs = torch.empty(len(items))
            probs[torch.tensor(order)] = torch.sigmoid(torch.cat(logits)).cpu()  # one device sync, at the end
        return probs.tolist()

    def batches(self, items: Sequence[JudgerInput], batch_size: int) -> Iterator[tuple[list[int], dict[str, Any]]]:
        """(item indices, model inputs on the device) per batch: up to `batch_size` items in order of token count, a
        new batch starting where an item is longer than PAD_SLACK times the batch's first (padding costs attention
        time quadratically)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        columns = self.head.tokenize(items)
        lengths = [len(ids) for ids in columns["input_ids"]]
        chunk: list[int] = []
        for i in sorted(range(len(items)), key=lengths.__getitem__):
            if chunk and (len(chunk) == batch_size or lengths[i] > PAD_SLACK * lengths[chunk[0]]):
                yield chunk, self._inputs(columns, chunk)
                chunk = []
            chunk.append(i)
        if chunk:
            yield chunk, self._inputs(columns, chunk)

    def _inputs(self, columns: Columns, chunk: list[int]) -> dict[str, Any]:
        batch = self.head.collate({key: [rows[i] for i in chunk] for key, rows in columns.items()})
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}


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
