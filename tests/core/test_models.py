from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from memrl.core import models
from memrl.core.errors import ModelNotFoundError
from memrl.core.tiny import build_tiny_model


def test_pull_is_idempotent(tiny_qwen2: str) -> None:
    weights = Path(tiny_qwen2) / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert models.pull("tiny-qwen2") == Path(tiny_qwen2)
    assert weights.stat().st_mtime_ns == before


def test_a_folder_prepared_by_an_older_revision_is_prepared_again(tiny_qwen2: str, tmp_path: Path) -> None:
    marker = Path(tiny_qwen2) / "memrl-model.json"
    kept = marker.read_text()
    smollm2 = models.REGISTRY["smollm2-135m-instruct"]
    try:
        assert models.is_ready(models.REGISTRY["tiny-qwen2"])
        marker.write_text('{"name": "tiny-qwen2"}')  # written before revisions existed: revision 1
        assert models.is_ready(models.REGISTRY["tiny-qwen2"])
        marker.write_text('{"name": "tiny-qwen2", "revision": 0}')
        assert not models.is_ready(models.REGISTRY["tiny-qwen2"])
        assert models.pull("tiny-qwen2") == Path(tiny_qwen2) and models.is_ready(models.REGISTRY["tiny-qwen2"])
    finally:
        marker.write_text(kept)
    assert smollm2.revision == 2  # its conversion changed: caches of revision 1 convert again


def test_cache_dir_follows_env(model_cache: Path) -> None:
    assert models.cache_dir() == model_cache
    assert models.model_dir(models.REGISTRY["tiny-qwen2"]).is_relative_to(model_cache)


def test_resolve_names_paths_and_hub_ids(tiny_qwen2: str, tmp_path: Path) -> None:
    assert models.resolve("tiny-qwen2") == tiny_qwen2
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')  # what a loader needs: a known type, a tokenizer
    (tmp_path / "tokenizer.json").write_text("{}")
    assert models.resolve(str(tmp_path)) == str(tmp_path)
    assert models.resolve("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ModelNotFoundError, match="not an embedded model"):
        models.resolve("no-such-model")
    with pytest.raises(ModelNotFoundError, match="unknown model 'nope'"):
        models.pull("nope")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_models_are_deterministic_and_speak_chatml(arch: str, tmp_path: Path) -> None:
    a, b = build_tiny_model(arch, tmp_path / "a"), build_tiny_model(arch, tmp_path / "b")
    wa = AutoModelForCausalLM.from_pretrained(a).state_dict()
    wb = AutoModelForCausalLM.from_pretrained(b).state_dict()
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    tok = AutoTokenizer.from_pretrained(a)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    ids = tok("the user prefers short answers")["input_ids"]
    assert len(ids) < len("the user prefers short answers") / 2  # real BPE merges, not characters
    assert tok.decode(ids) == "the user prefers short answers"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_embedding_model_gives_meaningful_similarity(model_cache: Path) -> None:
    from sentence_transformers import SentenceTransformer

    path = models.pull("minilm")
    encoder = SentenceTransformer(str(path), device="cpu")
    a, b, c = encoder.encode(
        ["I like short answers.", "Please keep replies brief.", "The hotel is in Paris."], normalize_embeddings=True
    )
    assert float(a @ b) > float(a @ c) + 0.2


def test_smollm2_conversion_keeps_chat_template(smollm2: str) -> None:
    tok = AutoTokenizer.from_pretrained(smollm2)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    # A turn ends with <|im_end|> (the GGUF says <|im_start|>): generation stops there, SFT labels end with it.
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>"
    config = AutoModelForCausalLM.from_pretrained(smollm2).generation_config
    assert config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert (Path(smollm2) / "model.safetensors").exists()
    assert os.path.getsize(Path(smollm2) / "model.safetensors") > 100_000_000
