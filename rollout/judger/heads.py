"""The judger's model heads: each turns a batch of JudgerInputs into one relevance logit per item.

- `cross_encoder`: an encoder (e.g. MiniLM) reading the (dialogue, note) pair, with a 1-logit classifier on top.
- `seq_cls`: a causal LM with a 1-logit sequence-classification head read at the last token.
- `yes_no`: a causal LM unchanged; the logit is log P("Yes") - log P("No") for the next token.

Causal heads pad on the left and pass explicit position ids, so a padded item scores like the same item alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from memrl.core.errors import ConfigError
from memrl.rollout.judger.inputs import JudgerInput, causal_prompt, cross_encoder_pair, uses_chat_template


class Head(ABC):
    name: ClassVar[str]
    peft_task: ClassVar[str]  # PEFT task type: decides which modules PEFT keeps trainable beside the adapters
    modules_to_save: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    @abstractmethod
    def load_model(self, path: str, dtype: Any = None) -> Any:
        """The HF model with this head (a fresh head where the checkpoint has none)."""

    @abstractmethod
    def encode(self, items: Sequence[JudgerInput]) -> dict[str, Any]:
        """Model inputs (tensors) for a batch."""

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

    def encode(self, items: Sequence[JudgerInput]) -> dict[str, Any]:
        pairs = [cross_encoder_pair(item, self.tokenizer, self.max_length) for item in items]
        return dict(
            self.tokenizer(
                [a for a, _ in pairs],
                [b for _, b in pairs],
                truncation="only_first",
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            )
        )

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

    def encode(self, items: Sequence[JudgerInput]) -> dict[str, Any]:
        prompts = [causal_prompt(item, self.tokenizer, self.max_length) for item in items]
        enc = self.tokenizer(
            prompts,
            add_special_tokens=not uses_chat_template(self.tokenizer),  # the template writes its own BOS
            truncation=True,
            max_length=self.max_length,
            padding=True,
            return_tensors="pt",
        )
        mask = enc["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": positions}


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


HEADS: dict[str, type[Head]] = {h.name: h for h in (CrossEncoderHead, SeqClsHead, YesNoHead)}


def build_head(name: str, tokenizer: Any, max_length: int) -> Head:
    if name not in HEADS:
        raise ConfigError(f"unknown judger head {name!r}; expected one of {', '.join(HEADS)}")
    return HEADS[name](tokenizer, max_length)
