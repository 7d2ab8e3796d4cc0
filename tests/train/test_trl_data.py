"""The TRL data loaders measure prompts in tokens the way the trainer will."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from memrl.train.trl.common import prompt_tokens
from memrl.train.trl.grpo import load_rl_split


def _write_rl(data_dir: Path, prompts: list[str]) -> None:
    (data_dir / "rl").mkdir(parents=True)
    rows = [{"prompt": [{"role": "user", "content": p}], "ground_truth": {"id": i}} for i, p in enumerate(prompts)]
    (data_dir / "rl" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_grpo_split_drops_only_prompts_over_the_budget(tiny_qwen2: str, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    short, long = "Note the user's style.", "Summarise the whole session again. " * 40
    _write_rl(tmp_path, [short, long, short])
    short_len = prompt_tokens(tokenizer, [{"role": "user", "content": short}])
    long_len = prompt_tokens(tokenizer, [{"role": "user", "content": long}])
    assert short_len < long_len

    kept, dropped = load_rl_split(tmp_path, "train", tokenizer, max_prompt_length=(short_len + long_len) // 2)
    assert dropped == 1
    assert [row["ground_truth"]["id"] for row in kept] == [0, 2]

    kept, dropped = load_rl_split(tmp_path, "train", tokenizer, max_prompt_length=long_len)
    assert (len(kept), dropped) == (3, 0)
