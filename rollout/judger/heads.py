"""The judger's model heads: each turns a batch of JudgerInputs into one relevance logit per item.

- `cross_encoder`: an encoder (e.g. MiniLM) reading the (dialogue, note) pair, with a 1-logit classifier on top.
- `seq_cls`: a causal LM with a 1-logit sequence-classification head read at the last token.
- `yes_no`: a causal LM unchanged; the logit is log P("Yes") - log P("No") for the next token.

Scoring tokenizes every item in one tokenizer call (`tokenize`), then pads each batch (`collate`). Causal heads pad
on the left and pass explicit position ids, so a padded item scores like the same item alone. Most of a causal
prompt is the same text every time (the instruction, the question, the chat template): a `Splicer` tokenizes it
once and only the dialogue and the details per item, where probes show that this gives the whole prompt's ids.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import Any, ClassVar

from memrl.core.errors import ConfigError
from memrl.rollout.judger.inputs import (
    Counter,
    JudgerInput,
    all_turns,
    causal_prompts,
    causal_turns,
    cross_encoder_pairs,
    prompt_frame,
    prompt_parts,
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
        columns = self._whole_columns(items)
        long = [i for i, ids in enumerate(columns["input_ids"]) if len(ids) > self.max_length]
        if long:
            cut = self._cut_columns([items[i] for i in long])
            for key, rows in columns.items():
                for i, row in zip(long, cut[key], strict=True):
                    rows[i] = row
        return columns

    def _whole_columns(self, items: Sequence[JudgerInput]) -> Columns:
        """Each item's ids with every turn; a row over `max_length` marks an item to cut."""
        # One token over the limit is enough to tell an overflow, and a long dialogue is not tokenized in full.
        whole = [self._whole(item) for item in items]
        return tokenize_texts(self.tokenizer, whole, self.max_length + 1, "longest_first", self.special_tokens)

    def _cut_columns(self, items: Sequence[JudgerInput]) -> Columns:
        """Each item's ids with the newest turns that fit in `max_length`."""
        return tokenize_texts(self.tokenizer, self._fitted(items), self.max_length, "only_first", self.special_tokens)

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

    @cached_property
    def splicer(self) -> Splicer | None:
        """The tokenizer's `Splicer`, built on first use; None where splicing would change the ids."""
        return Splicer.build(self.tokenizer, self.special_tokens)

    def _whole_columns(self, items: Sequence[JudgerInput]) -> Columns:
        if self.splicer is None:
            return super()._whole_columns(items)
        return self._spliced(self.splicer, items, [all_turns(item) for item in items], super()._whole_columns, None)

    def _cut_columns(self, items: Sequence[JudgerInput]) -> Columns:
        """As the base class cuts them, with the spliced prompts' token counts: a long dialogue's turns are
        counted once for all the items that share it, and the rest of each prompt is not tokenized again."""
        splicer = self.splicer
        if splicer is None:
            return super()._cut_columns(items)
        bare = splicer.ids([prompt_parts(item, []) for item in items])  # every prompt without its dialogue
        count = bare_counter(self.tokenizer, [turn for item in items for turn in all_turns(item)])
        turns = [
            None if row is None else causal_turns(item, len(row) - splicer.special, self.max_length, count)
            for item, row in zip(items, bare, strict=True)
        ]
        # Over max_length only where the newest turn alone is too long: the tokenizer then cuts its start.
        return self._spliced(splicer, items, turns, super()._cut_columns, self.max_length)

    @staticmethod
    def _spliced(
        splicer: Splicer,
        items: Sequence[JudgerInput],
        turns: Sequence[list[str] | None],
        fallback: Callable[[Sequence[JudgerInput]], Columns],
        limit: int | None,
    ) -> Columns:
        """Ids of the items' prompts with these turns, spliced; `fallback`'s for the items with no turns given,
        those the splicer refuses, and those over `limit` tokens."""
        kept = [i for i, t in enumerate(turns) if t is not None]
        rows: list[list[int] | None] = [None] * len(items)
        for i, row in zip(kept, splicer.ids([prompt_parts(items[i], turns[i] or []) for i in kept]), strict=True):
            fits = row is not None and (limit is None or len(row) <= limit)
            rows[i] = row if fits else None
        rest = [i for i, row in enumerate(rows) if row is None]
        plain = dict(zip(rest, fallback([items[i] for i in rest])["input_ids"] if rest else [], strict=True))
        return {"input_ids": [plain[i] if row is None else row for i, row in enumerate(rows)]}

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


# Prompts whose splices must give the whole text's ids before a tokenizer is spliced: no dialogue, digits, unicode,
# line breaks and trailing spaces inside turns, no intent or slot.
PROBES = (
    JudgerInput([], [], "Which city?", "Oakland"),
    JudgerInput(
        [
            {"speaker": "user", "utterance": "Book La Piazza for 4, 7:30 pm."},
            {"speaker": "assistant", "utterance": "Sure!"},
        ],
        ["date", "time"],
        "What date is the reservation for?",
        "March 3rd",
        "reserve a table",
        "date",
    ),
    JudgerInput(
        [
            {"speaker": "user", "utterance": "Café für 2 — 東京で 🍣?\nline two  "},
            {"speaker": "assistant", "utterance": "12"},
        ],
        ["party_size"],
        "¿Cuántos?",
        '"8" (eight).',
        "",
        "party_size",
    ),
)


@dataclass(frozen=True, eq=False)
class Splicer:
    """A causal prompt's ids put together from pieces: the fixed text of every prompt (the instruction, the
    question, the chat template, the special tokens) tokenized once, and per item only its variable parts (dialogue,
    missing slots, note), each distinct text once (a TOD query's candidates share one dialogue and missing slots).

    Each piece boundary sits in a run of line breaks next to the fixed text, where byte-level BPE pre-tokenizers
    split. Where the run is cut differs: Qwen2's and Llama 3's split keeps a run whole (`\\s*[\\r\\n]+`), GPT-2's
    splits its last break off before a word, so the next piece starts with 0 or 1 of the run's breaks. `build` keeps
    the first of the two whose splices give the whole prompt's ids on every probe, and none if neither does.
    """

    tokenizer: Any
    frame: tuple[str, ...]  # prompt_frame: the fixed texts, one more than the variable parts
    cuts: tuple[int, ...]  # per fixed text, where the piece before it ends and the one after it starts
    start: list[int]  # ids of the fixed text before the first piece, special tokens included
    end: list[int]  # ids of the fixed text after the last piece, special tokens included
    special: int  # how many special tokens the tokenizer adds (in start and end)

    @classmethod
    def build(cls, tokenizer: Any, special_tokens: bool) -> Splicer | None:
        frame = prompt_frame(tokenizer)
        specials = _special_tokens(tokenizer) if special_tokens else ([], [])
        if frame is None or specials is None or not _framed_by_line_breaks(frame):
            return None
        for shift in (0, 1):
            # The first text and the line breaks between parts end at their end; the last ends at its line breaks.
            cuts = (*(len(text) - shift for text in frame[:-1]), len(frame[-1]) - len(frame[-1].lstrip("\n")) - shift)
            start, end = _bare_ids(tokenizer, [frame[0][: cuts[0]], frame[-1][cuts[-1] :]])
            splicer = cls(tokenizer, frame, cuts, specials[0] + start, end + specials[1], sum(map(len, specials)))
            if splicer.agrees(PROBES, special_tokens):
                return splicer
        return None

    def pieces(self, parts: Sequence[str]) -> list[str] | None:
        """The texts to tokenize: each part with the line breaks around it; None where a part starts or ends with
        white space, which a pre-tokenizer might join to the line breaks across a boundary."""
        if any(not part or part[0].isspace() or part[-1].isspace() for part in parts):
            return None
        frame, cuts = self.frame, self.cuts
        return [frame[k][cuts[k] :] + part + frame[k + 1][: cuts[k + 1]] for k, part in enumerate(parts)]

    def ids(self, parts: Sequence[Sequence[str]]) -> list[list[int] | None]:
        """Each prompt's ids from its `prompt_parts`, as its whole text gives them; None where not spliced."""
        pieces = [self.pieces(item) for item in parts]
        unique = list(dict.fromkeys(text for texts in pieces if texts for text in texts))
        known = dict(zip(unique, _bare_ids(self.tokenizer, unique), strict=True))
        return [
            list(chain(self.start, *map(known.__getitem__, texts), self.end)) if texts else None for texts in pieces
        ]

    def agrees(self, items: Sequence[JudgerInput], special_tokens: bool) -> bool:
        """Whether the splices of these items give their whole prompts' ids, and the frame their whole text."""
        parts = [prompt_parts(item, all_turns(item)) for item in items]
        texts = [whole_prompt(item, self.tokenizer) for item in items]
        if ["".join(chain.from_iterable(zip(self.frame, (*part, ""), strict=True))) for part in parts] != texts:
            return False
        whole = tokenize_texts(self.tokenizer, texts, None, "longest_first", special_tokens)["input_ids"]
        return self.ids(parts) == whole


def _framed_by_line_breaks(frame: tuple[str, ...]) -> bool:
    """Whether each boundary between a fixed text and a part is a run of line breaks on the fixed side."""
    inner = all(text and not text.strip("\n") for text in frame[1:-1])
    return len(frame) > 1 and frame[0].endswith("\n") and inner and frame[-1].startswith("\n")


def _special_tokens(tokenizer: Any) -> tuple[list[int], list[int]] | None:
    """(before, after): the ids that the tokenizer adds around a text's own, e.g. ([BOS], []); None if it does not
    just add them around."""
    bare = _bare_ids(tokenizer, ["Yes"])[0]
    full = tokenize_texts(tokenizer, ["Yes"], None, "longest_first", special_tokens=True)["input_ids"][0]
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return full[:i], full[i + len(bare) :]
    return None


def _bare_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return tokenize_texts(tokenizer, texts, None, "longest_first", special_tokens=False)["input_ids"]


def bare_counter(tokenizer: Any, texts: list[str]) -> Counter:
    """`token_counter` of these texts, through the tokenizer's backend: each distinct text tokenized once."""
    unique = list(dict.fromkeys(texts))
    return dict(zip(unique, map(len, _bare_ids(tokenizer, unique)), strict=True)).__getitem__


def tokenize_texts(tokenizer: Any, texts: list[Any], max_length: int | None, cut: str, special_tokens: bool) -> Columns:
    """`texts` (strings or pairs) tokenized unpadded, truncated on the tokenizer's side (`max_length` None: not
    truncated).

    A fast tokenizer's Rust backend is called directly: `encode_batch_fast` skips the character offsets that the
    transformers wrapper always computes (a third of the tokenization time, and nothing the judger reads), and it
    releases the GIL, so a long list is split over as many threads as torch may use: rayon's own pool is off
    where TOKENIZERS_PARALLELISM=false (set wherever processes fork), and the tokenizer's time counts against
    small models.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        truncation = {"truncation": cut, "max_length": max_length} if max_length is not None else {}
        enc = tokenizer(texts, add_special_tokens=special_tokens, return_attention_mask=False, **truncation)
        return {key: list(rows) for key, rows in enc.items()}
    # What the wrapper itself does before every call: the backend keeps one truncation and padding setting.
    backend.no_padding()
    if max_length is None:
        backend.no_truncation()
    else:
        backend.enable_truncation(max_length, strategy=cut, direction=tokenizer.truncation_side)
    encodings = _in_threads(lambda part: backend.encode_batch_fast(part, add_special_tokens=special_tokens), texts)
    columns = {"input_ids": [e.ids for e in encodings]}
    if texts and isinstance(texts[0], tuple) and "token_type_ids" in tokenizer.model_input_names:
        columns["token_type_ids"] = [e.type_ids for e in encodings]
    return columns


def _in_threads(encode: Callable[[list[Any]], list[Any]], texts: list[Any], least: int = 16_000) -> list[Any]:
    """`encode(texts)`, split over up to torch's thread count of threads, each with at least `least` characters:
    starting a thread costs about as much as tokenizing a few thousand characters, more on a busy machine."""
    import torch

    chars = sum(len(text) if isinstance(text, str) else sum(map(len, text)) for text in texts)
    threads = min(torch.get_num_threads(), len(texts), chars // least)
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
