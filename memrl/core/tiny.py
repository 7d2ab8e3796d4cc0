"""Tiny random causal LMs with a tokenizer trained offline, for fast tests and CPU smoke runs.

It imports torch and transformers at its top, so nothing in memrl.core imports it there: `models.pull` imports it
inside the tiny models' builder, and importing memrl.core (`memrl --help`, the recipe schema) never loads torch.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, the format of Qwen2 and SmolLM2: every turn is <|im_start|>role\ncontent<|im_end|>\n.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_VOCABULARY = (
    "the user prefers short answers with bullet points and numbered steps a summary at the end agent "
    "assistant reflection note memory preference session problem answer draft solution math logic "
    "question option correct wrong because therefore first second third finally example analogy "
    "confidence score reasoning coverage format json slot value intent hotel restaurant flight date time "
    "city price cheap expensive book reserve confirm missing recall earlier please thanks sorry direct "
    "polite blunt proactive suggest outline headings takeaway"
)


def training_corpus(lines: int = 3000, seed: int = 0) -> list[str]:
    """Deterministic text covering words, digits, punctuation and the JSON the agents emit."""
    rng = random.Random(seed)
    vocabulary = _VOCABULARY.split()
    corpus = []
    for i in range(lines):
        words = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(4, 16)))
        corpus.append(f"{words.capitalize()}. {rng.randint(0, 9999)} + {rng.randint(0, 99)} = ?")
        if i % 5 == 0:
            corpus.append(f'{{"score": {rng.randint(0, 3)}, "reasoning": "{words}", "notes": ["{words}"]}}')
    return corpus


def train_tokenizer(vocab_size: int = 1024, seed: int = 0) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(training_corpus(seed=seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        padding_side="left",
        chat_template=CHATML_TEMPLATE,
    )


def _config(arch: str, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    shared = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.3,  # wide enough that greedy output depends on the prompt
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    configs: dict[str, type[PretrainedConfig]] = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    return configs[arch](**shared)


def build_tiny_model(arch: str, out_dir: Path, seed: int = 0) -> Path:
    """Write a randomly initialised `arch` ('qwen2' or 'llama') model and its tokenizer to `out_dir`."""
    tokenizer = train_tokenizer(seed=seed)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(arch, tokenizer))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
