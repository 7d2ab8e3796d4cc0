"""Hostile input: model folders that are broken in one way each (tests/support/hostile.py `MODEL_KINDS`). Every
command that loads a local model says so in one `memrl: error:` line naming the folder, exit 2, before any model
loads: no traceback from transformers or safetensors, and no server child process started only to crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import memrl_in_process
from support.hostile import MODEL_KINDS, broken_model
from test_hostile_inputs import assert_one_line

WHY = {
    "truncated_weights": "not a whole safetensors file (its tensors end past the end of the file: truncated)",
    "text_weights": "not a whole safetensors file",
    "header_only": "not a whole safetensors file (its header is cut short or is no header)",
    "unknown_architecture": "config.json names model type 'hostile-net', which this transformers does not know",
    "no_model_type": "config.json names no model type",
    "no_chat_template": "its tokenizer has no chat template",
    "vocab_mismatch": "config.json says vocab_size 2048, but the weights' model.embed_tokens.weight has 1024 rows",
    "no_tokenizer": "no tokenizer",
}
COMMANDS = {
    "chat": ["chat", "--model", "{model}", "--max-tokens", "4", "hi"],
    "serve": ["serve", "--model", "{model}", "--port", "{port}", "--engine", "transformers"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_a_broken_model_folder_is_one_line(kind: str, command: str, tiny_qwen2: str, tmp_path: Path) -> None:
    from memrl.rollout.serve import free_port

    folder = broken_model(kind, Path(tiny_qwen2), tmp_path)
    names = {"model": str(folder), "port": str(free_port())}
    code, stderr = memrl_in_process([part.format(**names) for part in COMMANDS[command]])
    assert_one_line(code, stderr, str(folder), WHY[kind])
