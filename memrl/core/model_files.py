"""What a local model folder must hold before a loader touches it, checked from its small files and the weights'
headers (no weight is read): one line naming the folder and what is wrong, where transformers, safetensors or a
server's child process would raise a traceback, or start and fail minutes later.

`check_model_dir` (every local folder `core.models.resolve` hands on): config.json names a model type transformers
knows; every safetensors file has a whole, well-formed header whose tensors fit in the file; the embedding matrix
has the rows config.json's vocab_size says; a tokenizer is there. `check_chat_template`: a model that is to chat
has a chat template.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from memrl.core.errors import ModelNotFoundError
from memrl.core.files import read_json

MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header
# The files one of which a folder's tokenizer is loaded from (a fast tokenizer, or a slow one's vocabulary).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# Tensor names of the input embedding (one row per vocabulary entry) in the architectures memrl trains.
_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")


def check_model_dir(folder: Path) -> None:
    """Raise ModelNotFoundError naming `folder` unless it holds a model transformers can load (see module doc).
    A PEFT adapter folder (adapter_config.json, no config.json) has only its weights checked."""
    config_file = folder / "config.json"
    if config_file.exists():
        config = read_json(config_file, ModelNotFoundError)
        if not isinstance(config, dict):
            raise ModelNotFoundError(f"{config_file}: not a model config (a JSON object)")
        _known_type(folder, config)
    headers = {path: _header(path) for path in sorted(folder.glob("*.safetensors"))}
    if config_file.exists():
        _vocabulary(folder, config, headers)
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise ModelNotFoundError(f"{folder}: no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...)")


def check_chat_template(folder: Path) -> None:
    """Raise unless the folder's tokenizer has a chat template: a chat model renders every conversation with it."""
    tokenizer_config = folder / "tokenizer_config.json"
    config = read_json(tokenizer_config, ModelNotFoundError) if tokenizer_config.is_file() else {}
    has = isinstance(config, dict) and bool(config.get("chat_template"))
    if not has and not any((folder / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        raise ModelNotFoundError(
            f"{folder}: its tokenizer has no chat template (tokenizer_config.json `chat_template`, or "
            "chat_template.jinja): it is no chat model"
        )


def _known_type(folder: Path, config: dict[str, Any]) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # names only: no model code loads

    kind = config.get("model_type")
    if "auto_map" in config:  # the model brings its own code (trust_remote_code): its type is its own
        return
    if not isinstance(kind, str):
        raise ModelNotFoundError(f"{folder}: config.json names no model type (`model_type`)")
    if kind not in CONFIG_MAPPING_NAMES:
        raise ModelNotFoundError(
            f"{folder}: config.json names model type {kind[:80]!r}, which this transformers does not know"
        )


def _header(path: Path) -> dict[str, Any]:
    """A safetensors file's header (tensor name -> dtype, shape, offsets), checked against the file's size."""
    problem = f"{path}: not a whole safetensors file"
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
            if length is None or length > min(MAX_HEADER, size - 8):
                raise ModelNotFoundError(f"{problem} (its header is cut short or is no header)")
            header = json.loads(f.read(length))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelNotFoundError(f"{problem} ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ModelNotFoundError(f"{problem} (its header is no JSON object)")
    ends = [t.get("data_offsets", [0, 0])[1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    if any(not isinstance(end, int) for end in ends) or max(ends, default=0) > size - 8 - length:
        raise ModelNotFoundError(f"{problem} (its tensors end past the end of the file: truncated)")
    return header


def _vocabulary(folder: Path, config: dict[str, Any], headers: dict[Path, dict[str, Any]]) -> None:
    """The embedding's rows against config.json's vocab_size (its text config's, for a multimodal model)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vocab = text.get("vocab_size") if isinstance(text, dict) else None
    for header in headers.values():
        for name, tensor in header.items():
            shape = tensor.get("shape") if isinstance(tensor, dict) else None
            if name.endswith(_EMBEDDINGS) and isinstance(shape, list) and shape and isinstance(vocab, int):
                if shape[0] != vocab:
                    raise ModelNotFoundError(
                        f"{folder}: config.json says vocab_size {vocab}, but the weights' {name} has {shape[0]} rows"
                    )
                return
