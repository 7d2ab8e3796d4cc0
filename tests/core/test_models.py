from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
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


@pytest.fixture
def toy_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A registered model named "toy" in a cache of this test's own, whose preparation takes a moment and is counted
    (the shared cache's models stay untouched: other test workers read them)."""
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    prepared: list[Path] = []

    def prepare(folder: Path) -> None:
        prepared.append(folder)
        time.sleep(0.3)
        folder.mkdir(parents=True)
        (folder / "weights.bin").write_bytes(b"toy")

    model = models.EmbeddedModel("toy", "chat", "a toy", prepare, revision=2)
    monkeypatch.setitem(models._BY_ALIAS, "toy", model)
    return prepared


def test_a_folder_prepared_by_an_older_revision_is_prepared_again(toy_model: list[Path]) -> None:
    folder = models.pull("toy")
    marker = folder / "memrl-model.json"
    assert models.pull("toy") == folder and len(toy_model) == 1
    marker.write_text('{"name": "toy"}')  # written before revisions existed: revision 1
    assert not models.is_ready(models._BY_ALIAS["toy"])
    assert models.pull("toy") == folder and len(toy_model) == 2
    assert json.loads(marker.read_text())["revision"] == 2
    assert models.REGISTRY["smollm2-135m-instruct"].revision == 2  # its conversion changed: revision 1 caches redo it


def test_pulls_at_once_prepare_a_model_once(toy_model: list[Path]) -> None:
    """Two pulls into one cache (two runs, two test workers) at the same time: one prepares, the other waits for it
    and gets the same folder, never one renamed away from under it."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        folders = list(pool.map(lambda _: models.pull("toy"), range(2)))
    assert folders[0] == folders[1]
    assert len(toy_model) == 1
    assert (folders[0] / "weights.bin").read_bytes() == b"toy"


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
