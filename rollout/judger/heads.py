"""The judger's model heads: each turns a batch of JudgerInputs into one relevance logit per item.

- `cross_encoder`: an encoder (e.g. MiniLM) reading the (dialogue, note) pair, with a 1-logit classifier on top.
- `seq_cls`: a causal LM with a 1-logit sequence-classification head read at the last token.
- `yes_no`: a causal LM unchanged; the logit is log P("Yes") - log P("No") for the next token.

Scoring tokenizes every item in one tokenizer call (`tokenize`), then pads each batch (`collate`). Causal heads pad
on the left and pass explicit position ids, so a padded item scores like the same item alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from typing import Any, ClassVar

from memrl.core.errors import ConfigError
from memrl.rollout.judger.inputs import (
    JudgerInput,
    causal_prompts,
    cross_encoder_pairs,
    uses_chat_template,
    whole_pair,
    whole_prompt,
)

Columns = dict[str, list[list[int]]]  # a tokenizer's unpadded output: per key, one row of ids per item


class Head(ABC):
    name: ClassVar[str]
    peft_task: ClassVar[str]  # PEFT task type: decides which modules PEFT keeps trainable beside the adapters
    modules_to_save: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.special_tokens = True  # whether the tokenizer adds its special tokens (BOS, CLS, SEP)

    @abstractmethod
    def load_model(self, path: str, dtype: Any = None) -> Any:
        """The HF model with this head (a fresh head where the checkpoint has none)."""

    def tokenize(self, items: Sequence[JudgerInput]) -> Columns:
        """Each item's ids, unpadded: every turn where the whole input fits in `max_length`, else the newest turns
        that fit. Token counts are taken only for the items that overflow, all in one call."""
        # One token over the limit is enough to tell an overflow, and a long dialogue is not tokenized in full.
        whole = [self._whole(item) for item in items]
        columns = tokenize_texts(self.tokenizer, whole, self.max_length + 1, "longest_first", self.special_tokens)
        long = [i for i, ids in enumerate(columns["input_ids"]) if len(ids) > self.max_length]
        if long:
            fitted = self._fitted([items[i] for i in long])
            cut = tokenize_texts(self.tokenizer, fitted, self.max_length, "only_first", self.special_tokens)
            for key, rows in columns.items():
                for i, row in zip(long, cut[key], strict=True):
                    rows[i] = row
        return columns

    def encode(self, items: Sequence[JudgerInput]) -> dict[str, Any]:
        """Model inputs (tensors) for a batch."""
        return self.collate(self.tokenize(items))

    @abstractmethod
    def collate(self, columns: Columns) -> dict[str, Any]:
        """A padded batch of tensors from `tokenize`'s rows."""

    @abstractmethod
    def _whole(self, item: JudgerInput) -> Any:
        """The tokenizer's input for the item with every turn."""

    @abstractmethod
    def _fitted(self, items: Sequence[JudgerInput]) -> list[Any]:
        """The tokenizer's inputs with the newest turns that fit."""

    @abstractmethod
    def logits(self, model: Any, batch: dict[str, Any]) -> Any:
        """(batch,) relevance logits."""


class CrossEncoderHead(Head):
    name = "cross_encoder"
    peft_task = "SEQ_CLS"
    modules_to_save = ("classifier",)

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        super().__init__(tokenizer, max_length)
        tokenizer.truncation_side = "left"  # a safety net only: inputs are already cut to fit, oldest turns first

    def load_model(self, path: str, dtype: Any = None) -> Any:
        from transformers import AutoModelForSequenceClassification

        kwargs = {"dtype": dtype} if dtype is not None else {}
        return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)

    def _whole(self, item: JudgerInput) -> tuple[str, str]:
        return whole_pair(item)

    def _fitted(self, items: Sequence[JudgerInput]) -> list[tuple[str, str]]:
        return cross_encoder_pairs(items, self.tokenizer, self.max_length)

    def collate(self, columns: Columns) -> dict[str, Any]:
        ids, mask = pad(columns["input_ids"], self.tokenizer.pad_token_id, left=False)
        batch = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in columns:
            batch["token_type_ids"] = pad(columns["token_type_ids"], 0, left=False)[0]
        return batch

    def logits(self, model: Any, batch: dict[str, Any]) -> Any:
        return model(**batch).logits[:, 0]


class CausalHead(Head):
    """What the two causal-LM heads share: a pad token, left padding, prompts, position ids."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        super().__init__(tokenizer, max_length)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token  # Llama 3 has none; padding is masked out anyway
        tokenizer.padding_side = "left"
        tokenizer.truncation_side = "left"
        self.special_tokens = not uses_chat_template(tokenizer)  # the template writes its own BOS

    def _whole(self, item: JudgerInput) -> str:
        return whole_prompt(item, self.tokenizer)

    def _fitted(self, items: Sequence[JudgerInput]) -> list[str]:
        return causal_prompts(items, self.tokenizer, self.max_length)

    def collate(self, columns: Columns) -> dict[str, Any]:
        ids, mask = pad(columns["input_ids"], self.tokenizer.pad_token_id, left=True)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


class SeqClsHead(CausalHead):
    name = "seq_cls"
    peft_task = "SEQ_CLS"
    modules_to_save = ("score",)  # the new head must train under LoRA, and be saved with the adapter

    def load_model(self, path: str, dtype: Any = None) -> Any:
        from transformers import AutoModelForSequenceClassification

        kwargs = {"dtype": dtype} if dtype is not None else {}
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, pad_token_id=self.tokenizer.pad_token_id, **kwargs
        )
        model.config.pad_token_id = self.tokenizer.pad_token_id  # the head reads the last non-pad token
        return model

    def logits(self, model: Any, batch: dict[str, Any]) -> Any:
        return model(**batch).logits[:, 0]


class YesNoHead(CausalHead):
    name = "yes_no"
    peft_task = "CAUSAL_LM"

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        super().__init__(tokenizer, max_length)
        # After a chat template's assistant header the answer starts a line; after "Answer:" it follows a space.
        space = "" if uses_chat_template(tokenizer) else " "
        self.yes_id = self._first_token(space + "Yes")
        self.no_id = self._first_token(space + "No")
        if self.yes_id == self.no_id:
            raise ConfigError(f"yes_no head: the tokenizer starts 'Yes' and 'No' with the same token {self.yes_id}")

    def _first_token(self, word: str) -> int:
        return int(self.tokenizer(word, add_special_tokens=False)["input_ids"][0])

    def load_model(self, path: str, dtype: Any = None) -> Any:
        from transformers import AutoModelForCausalLM

        kwargs = {"dtype": dtype} if dtype is not None else {}
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)

    def logits(self, model: Any, batch: dict[str, Any]) -> Any:
        # The softmax normaliser cancels in log P(yes) - log P(no): the raw logit difference is the log-odds.
        last = model(**batch, logits_to_keep=1).logits[:, -1, :].float()
        return last[:, self.yes_id] - last[:, self.no_id]


def tokenize_texts(tokenizer: Any, texts: list[Any], max_length: int, cut: str, special_tokens: bool) -> Columns:
    """`texts` (strings or pairs) tokenized unpadded, truncated on the tokenizer's side.

    A fast tokenizer's Rust backend is called directly: `encode_batch_fast` skips the character offsets that the
    transformers wrapper always computes (a third of the tokenization time, and nothing the judger reads), and it
    releases the GIL, so a long list is split over as many threads as torch may use: rayon's own pool is off
    where TOKENIZERS_PARALLELISM=false (set wherever processes fork), and the tokenizer's time counts against
    small models.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        enc = tokenizer(
            texts, add_special_tokens=special_tokens, truncation=cut, max_length=max_length, return_attention_mask=False
        )
        return {key: list(rows) for key, rows in enc.items()}
    # What the wrapper itself does before every call: the backend keeps one truncation and padding setting.
    backend.no_padding()
    backend.enable_truncation(max_length, strategy=cut, direction=tokenizer.truncation_side)
    encodings = _in_threads(lambda part: backend.encode_batch_fast(part, add_special_tokens=special_tokens), texts)
    columns = {"input_ids": [e.ids for e in encodings]}
    if texts and isinstance(texts[0], tuple) and "token_type_ids" in tokenizer.model_input_names:
        columns["token_type_ids"] = [e.type_ids for e in encodings]
    return columns


def _in_threads(encode: Callable[[list[Any]], list[Any]], texts: list[Any], least: int = 8) -> list[Any]:
    """`encode(texts)`, in slices of at least `least` texts over up to torch's thread count of threads."""
    import torch

    threads = min(torch.get_num_threads(), len(texts) // least)
    if threads < 2:
        return encode(texts)
    size = -(-len(texts) // threads)
    with ThreadPoolExecutor(threads) as pool:
        parts = pool.map(encode, [texts[start : start + size] for start in range(0, len(texts), size)])
        return [encoding for part in parts for encoding in part]


def pad(rows: Sequence[Sequence[int]], value: int, left: bool) -> tuple[Any, Any]:
    """(ids, attention mask) tensors: the rows padded with `value` to the longest, on the left or the right."""
    import numpy as np
    import torch

    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max())
    columns = np.arange(width)
    mask = columns >= (width - lengths)[:, None] if left else columns < lengths[:, None]
    ids = np.full((len(rows), width), value, dtype=np.int64)
    ids[mask] = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))  # row-major
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


HEADS: dict[str, type[Head]] = {h.name: h for h in (CrossEncoderHead, SeqClsHead, YesNoHead)}


def build_head(name: str, tokenizer: Any, max_length: int) -> Head:
    if name not in HEADS:
        raise ConfigError(f"unknown judger head {name!r}; expected one of {', '.join(HEADS)}")
    return HEADS[name](tokenizer, max_length)
