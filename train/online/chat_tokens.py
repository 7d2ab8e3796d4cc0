"""A conversation as one token sequence, turn by turn, in the policy's own chat template.

The policy's replies stay exactly the tokens it sampled (never decoded and re-encoded); only the environment's turns
are rendered by the template. `TurnTokens.of(tokenizer)` learns from two rendered dummy conversations how the
template closes an assistant turn, then gives the tokens of a user turn as the template would write them after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.core.errors import ConfigError
from memrl.rollout.base import Message

_OPEN: list[Message] = [{"role": "user", "content": "x"}]


def chat_ids(tokenizer: Any, messages: Sequence[Message], *, generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
    )
    return list(ids["input_ids"] if not isinstance(ids, list) else ids)


def _reply(tokenizer: Any, content: str) -> list[int]:
    """The tokens the template writes for an assistant turn `content`, closing included."""
    header = chat_ids(tokenizer, _OPEN, generation_prompt=True)
    full = chat_ids(tokenizer, [*_OPEN, {"role": "assistant", "content": content}], generation_prompt=False)
    if full[: len(header)] != header:
        raise ConfigError("the policy's chat template renders an assistant turn that does not extend its prompt")
    return full[len(header) :]


_SAID: list[Message] = [*_OPEN, {"role": "assistant", "content": "A"}]
# Contents a splice must reproduce exactly (edges a template may strip or a tokenizer may merge) before it is trusted.
_PROBES = ("Hold on.", " leading space", "trailing space ", "line\nbreak", "12, then 7:30 pm?", "ça va, naïve")
_PROMPT_CACHE = 4096
_MARK = "\u2063"  # invisible separator: splits the rendered user turn into (glue before, content, glue after)


@dataclass(frozen=True)
class TurnTokens:
    """`said`: a short conversation rendered up to its reply's end of turn (what a user turn extends). A user turn
    renders in one template pass, or, where the template allows it (checked on `_PROBES`), as `glue` around the
    tokenized content without rendering at all: most of a rollout's own cost on a fast environment."""

    tokenizer: Any
    end_of_turn: int  # the token the template ends an assistant turn with (<|im_end|>, <|eot_id|>, ...)
    said: tuple[int, ...]
    glue: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # A GRPO group plays one prompt several times: each rendered once (bounded: cleared when full).
    _prompts: dict[tuple[tuple[str, str], ...], tuple[int, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(cls, tokenizer: Any) -> TurnTokens:
        # Two replies that differ only in their content share the template's closing tokens as a common suffix.
        a, b = _reply(tokenizer, "A"), _reply(tokenizer, "B")
        common = 0
        while common < min(len(a), len(b)) and a[-1 - common] == b[-1 - common]:
            common += 1
        if common == 0:
            raise ConfigError("the policy's chat template does not close an assistant turn with a token")
        end = a[-common]
        said = chat_ids(tokenizer, _SAID, generation_prompt=False)
        rendered = cls(tokenizer, end, tuple(said[: len(said) - said[::-1].index(end)]))
        glue = rendered._glue()
        spliced = cls(tokenizer, end, rendered.said, glue)
        if glue is None or any(spliced.user_turn(p) != rendered.user_turn(p) for p in _PROBES):
            return rendered
        return spliced

    def _glue(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The tokens a user turn has before and after its content, if a marker content shows them cleanly."""
        marked = self.user_turn(_MARK)
        mark = self.tokenizer.encode(_MARK, add_special_tokens=False)
        for start in range(len(marked) - len(mark) + 1):
            if marked[start : start + len(mark)] == mark:
                return tuple(marked[:start]), tuple(marked[start + len(mark) :])
        return None

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        """The policy's opening context with the header of its first reply."""
        key = tuple((m["role"], m["content"]) for m in messages)
        if (ids := self._prompts.get(key)) is None:
            if len(self._prompts) >= _PROMPT_CACHE:
                self._prompts.clear()
            ids = self._prompts[key] = tuple(chat_ids(self.tokenizer, messages, generation_prompt=True))
        return list(ids)

    def close_reply(self, generated: Sequence[int]) -> tuple[list[int], list[int]]:
        """(the reply's tokens, up to and including the end of turn; a closing token the policy did not write).

        Whatever a model samples after its end of turn (a next header, under a generation config whose stop token is
        another one) is dropped; a reply cut at the token budget gets the end of turn appended, as the environment's.
        """
        generated = list(generated)
        if self.end_of_turn in generated:
            return generated[: generated.index(self.end_of_turn) + 1], []
        return generated, [self.end_of_turn]

    def user_turn(self, content: str) -> list[int]:
        """The tokens after a closed reply: the template's glue, the user's message and the next reply's header."""
        if self.glue is not None:
            before, after_ = self.glue
            return [*before, *self.tokenizer.encode(content, add_special_tokens=False), *after_]
        after = chat_ids(self.tokenizer, [*_SAID, {"role": "user", "content": content}], generation_prompt=True)
        if tuple(after[: len(self.said)]) != self.said:
            raise ConfigError("the policy's chat template renders a user turn that does not extend the conversation")
        return after[len(self.said) :]

    def text(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))
