"""Hostile inputs: the files and folders a careless or hostile user hands the CLI, made on demand under a folder.

`make(kind, where)` returns a path of that kind. Input files: missing, empty, binary, Latin-1, truncated JSON, JSON
of the wrong shape, one 50 MB line, a folder where a file belongs. Input folders: missing, a file where a folder
belongs, empty, and folders whose expected files (every name a command looks for) are binary, truncated or of the
wrong shape. Output locations: an existing file, a path below a regular file (fails even for root), a read-only
folder (`READONLY_BLOCKS` says whether chmod blocks writes here: not for root).

Round two (`FILE_KINDS_2`, `DIR_KINDS_2`, `YAML_KINDS`): JSON and YAML nested 100,000 and 5,000 deep, a zero-filled
file (1 MB, and a sparse 1 GB one), a FIFO, a link to a character device (/dev/null: harmless if a reader does open
it), a broken link, and recipes that are a YAML alias bomb, a self-referencing alias, or a python tag.

Broken model folders (`MODEL_KINDS`, `broken_model`): a working model's folder copied, then one thing broken in it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

FILE_KINDS = ("missing", "empty", "binary", "latin1", "truncated", "wrong_shape", "huge_line", "folder")
TEXT_KINDS = ("missing", "binary", "latin1", "folder")  # a plain-text input: empty or any UTF-8 is valid
DIR_KINDS = ("missing", "file", "empty_dir", "binary_dir", "truncated_dir", "wrong_dir")
OUT_KINDS = ("existing_file", "below_file", "readonly")
PORT_KINDS = ("70000", "-1", "0", "http")
# Input files that exhaust the stack, memory or patience, and paths of the wrong kind.
FILE_KINDS_2 = ("deep_json", "deep_yaml", "zeros_sparse", "zeros", "fifo", "chardev", "broken_link")
DIR_KINDS_2 = ("fifo", "chardev", "broken_link")
YAML_KINDS = ("yaml_bomb", "yaml_self", "yaml_tag", "deep_yaml")  # recipes: valid YAML syntax, hostile content
DEEP = 100_000  # levels of nesting: far past Python's recursion limit
SPARSE = 2**30  # a zero-filled file of 1 GB that takes no disk (truncate), over the 512 MB read limit

# A model folder with one thing wrong (`broken_model`): what a download cut short, a hand-edited config or a copied
# half of a checkpoint leaves.
MODEL_KINDS = (
    "truncated_weights",  # the safetensors file cut short mid-tensor
    "text_weights",  # a text file under the weights' name (a Git LFS pointer, say)
    "header_only",  # the 8-byte length of a header that is not there
    "unknown_architecture",  # config.json names a model type transformers has never heard of
    "no_model_type",  # config.json without a model type
    "no_chat_template",  # a base model's tokenizer: nothing to render a conversation with
    "vocab_mismatch",  # config.json's vocab_size and the embedding's rows disagree
    "no_tokenizer",  # the weights without their tokenizer files
)

HUGE = 50 * 2**20
BINARY = bytes(range(256)) * 8  # NUL first, then bytes no UTF-8 text holds
LATIN1 = "préférences: café, thé\n".encode("latin-1")
TRUNCATED = b'{"name": "x", "stages": {"a": [1, 2'
WRONG_SHAPE = b"[1, 2, 3]\n"
EXISTING = b"already here: must survive a failed command\n"

# Every name a command reads inside the folders it takes: SGD and MS-TOD folders, run folders (collab, PAHF, TOD,
# judger data, a saved recipe), reflection data, checkpoints. A hostile folder fills each with the same bad bytes.
DIR_NAMES = (
    "schema.json",
    "dialogues_001.json",
    "train/schema.json",
    "train/dialogues_001.json",
    "persona_1.json",
    "memory/persona_1.json",
    "stats.json",
    "metrics.json",
    "tasks.jsonl",
    "sessions.jsonl",
    "config.json",
    "recipe.resolved.yaml",
    "pairs.jsonl",
    "eval/pairs.jsonl",
    "rl/eval.jsonl",
    "memrl_checkpoint.json",
    "adapter_config.json",
    "shopping/persona_info.json",
    "shopping/phase1.json",
)


def _readonly_blocks() -> bool:
    """Whether a folder without write permission refuses a new file here (not for root, nor on some mounts)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ro"
        folder.mkdir()
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            (folder / "probe").write_text("x")
        except PermissionError:
            return True
        finally:
            folder.chmod(stat.S_IRWXU)
        return False


READONLY_BLOCKS = _readonly_blocks()


def _fill(folder: Path, data: bytes) -> Path:
    for name in DIR_NAMES:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return folder


def make(kind: str, where: Path) -> Path:
    """A fresh path of `kind` under `where` (which exists)."""
    path = where / f"hostile-{kind}"
    match kind:
        case "missing":
            return path
        case "empty":
            path.write_bytes(b"")
        case "binary":
            path.write_bytes(BINARY)
        case "latin1":
            path.write_bytes(LATIN1)
        case "truncated":
            path.write_bytes(TRUNCATED)
        case "wrong_shape":
            path.write_bytes(WRONG_SHAPE)
        case "huge_line":
            with path.open("wb") as f:
                f.write(b'{"a": "')
                f.write(b"x" * HUGE)
        case "folder" | "empty_dir":
            path.mkdir()
        case "file" | "existing_file":
            path.write_bytes(EXISTING)
        case "binary_dir":
            return _fill(_mkdir(path), BINARY)
        case "truncated_dir":
            return _fill(_mkdir(path), TRUNCATED)
        case "wrong_dir":
            return _fill(_mkdir(path), WRONG_SHAPE)
        case "below_file":
            (where / "a-file").write_bytes(EXISTING)
            return where / "a-file" / "out"
        case "deep_json":
            path.write_text("[" * DEEP + "]" * DEEP)
        case "deep_yaml":  # flow mappings: a few KB, thousands deep
            path.write_text("name: " + "{k: " * 5000 + "1" + "}" * 5000 + "\n")
        case "zeros":
            path.write_bytes(bytes(2**20))
        case "zeros_sparse":
            with path.open("wb") as f:
                f.truncate(SPARSE)
        case "fifo":
            os.mkfifo(path)
        case "chardev":  # a link to one: its target is what a reader meets (mknod needs root)
            path.symlink_to("/dev/null")
        case "broken_link":
            path.symlink_to(where / "nowhere")
        case "yaml_bomb":  # "billion laughs": 9 levels of 9 aliases each, a billion strings expanded
            lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
            lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
            path.write_text("\n".join(["name: bomb", *lines, "stages: {}"]) + "\n")
        case "yaml_self":
            path.write_text("name: &x [*x]\nstages: {}\n")
        case "yaml_tag":
            path.write_text("name: !!python/object/apply:os.system [echo hostile]\nstages: {}\n")
        case "readonly":
            path.mkdir()
            (path / "kept.txt").write_bytes(EXISTING)
            path.chmod(stat.S_IRUSR | stat.S_IXUSR)
            return path / "out"
        case _:
            raise ValueError(f"unknown hostile kind {kind!r}")
    return path


def broken_model(kind: str, model: Path, where: Path) -> Path:
    """A copy of the model folder `model` under `where`, broken as MODEL_KINDS says."""
    import json
    import shutil

    folder = where / f"model-{kind}"
    shutil.copytree(model, folder)
    weights, config = folder / "model.safetensors", folder / "config.json"
    settings = json.loads(config.read_text())
    match kind:
        case "truncated_weights":
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        case "text_weights":
            weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 12\n")
        case "header_only":
            weights.write_bytes((4096).to_bytes(8, "little"))
        case "unknown_architecture":
            config.write_text(json.dumps(settings | {"model_type": "hostile-net", "architectures": ["HostileNet"]}))
        case "no_model_type":
            config.write_text(json.dumps({k: v for k, v in settings.items() if k != "model_type"}))
        case "no_chat_template":
            for template in folder.glob("chat_template.*"):
                template.unlink()
            tokenizer = folder / "tokenizer_config.json"
            tokenizer.write_text(json.dumps({k: v for k, v in json.loads(tokenizer.read_text()).items()
                                             if k != "chat_template"}))  # fmt: skip
        case "vocab_mismatch":
            config.write_text(json.dumps(settings | {"vocab_size": settings["vocab_size"] * 2}))
        case "no_tokenizer":
            for name in (
                "tokenizer.json",
                "tokenizer_config.json",
                "vocab.json",
                "merges.txt",
                "special_tokens_map.json",
            ):
                (folder / name).unlink(missing_ok=True)
        case _:
            raise ValueError(f"unknown broken model {kind!r}")
    return folder


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` and its bytes, to show that a failed command lost nothing already written."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and path.stat().st_size < HUGE:
                out[str(path.relative_to(root))] = path.read_bytes()
    return out


def restore_permissions(root: Path) -> None:
    """Make read-only folders writable again so pytest can remove them."""
    for dirpath, dirs, _ in os.walk(root):
        for d in dirs:
            (Path(dirpath) / d).chmod(stat.S_IRWXU)
