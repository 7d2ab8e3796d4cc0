"""Simulated users for the agent loop: an LLM persona, and deterministic answerers built from the data.

Shopping post-action feedback is P1's rule user (`shopping.rule_feedback`); this module covers clarification
answers (both domains) and LLM post-action corrections (embodied; P1's `embodied_feedback` is the rule one).
The deterministic users let tests and offline runs
work without an LLM playing the user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memrl.envs.pahf import prompts
from memrl.envs.pahf.formats import EmbodiedScenario, PersonaTable, ShoppingScenario
from memrl.rollout.base import ChatBackend, SamplingParams

_WORD = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
# Words in feature names too generic to show which feature a question is about.
_GENERIC = {"type", "primary", "system", "feature", "features", "method", "mode", "style", "technology", "design"}


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 2 and w not in _GENERIC}


@dataclass(frozen=True)
class PersonaLLM:
    """A persona-conditioned LLM playing the user: one- or two-sentence answers and corrections."""

    backend: ChatBackend
    sampling: SamplingParams

    async def answer(self, persona: str, instruction: str, question: str) -> str:
        messages = prompts.persona_answer_messages(persona, instruction, question)
        return (await self.backend.achat(messages, self.sampling)).text.strip()

    async def correct(self, persona: str, instruction: str, done: str, wanted: str) -> str:
        messages = prompts.persona_feedback_messages(persona, instruction, done, wanted)
        return (await self.backend.achat(messages, self.sampling)).text.strip()


def named_features(table: PersonaTable, product: str, question: str) -> list[str]:
    """The features of `product` a question is about: by a word of the feature's name or one of its values."""
    asked = _words(question)
    features = table.products.get(product, {})
    hits = []
    for feature, pref in features.items():
        values = [pref.like_most, *pref.like_second, *pref.dislike]
        if _words(feature) & asked or any(v.lower() in question.lower() for v in values):
            hits.append(feature)
    return hits


def rule_shopping_answer(table: PersonaTable, scenario: ShoppingScenario, question: str) -> str:
    """The answer a truthful user gives from its preference table, about only the features the question names."""
    features = table.products.get(scenario.product, {})
    hits = named_features(table, scenario.product, question)
    if not hits:
        names = ", ".join(features) or "its features"
        return f"Could you ask about one feature? For a {scenario.product} I care about {names}."
    parts = []
    for feature in hits:
        pref = features[feature]
        fine = f"; {', '.join(pref.like_second)} would also be fine" if pref.like_second else ""
        parts.append(f"for the {feature} I like {pref.like_most} most{fine}")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def embodied_wanted(scenario: EmbodiedScenario) -> str:
    """What the user wanted, in words, from the scenario's gold intent."""
    if scenario.is_pickup:
        return f"bring me the {scenario.user_intent_object}"
    return f"put the {scenario.user_intent_object} on the {scenario.user_intent_location}"


def rule_embodied_answer(scenario: EmbodiedScenario) -> str:
    return f"Please {embodied_wanted(scenario)}."
