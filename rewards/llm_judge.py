"""LLM coverage judge: the paper's 0-3 rubric (coverage, actionability, no hallucination, clarity), our wording.

Requests go out all at once through backends with native async I/O, whose own bound (the model block's
`max_concurrency`) is the one limit on requests in flight, or in batches of `backend.batch_size` through backends
that batch natively (local transformers, vLLM). A reply that
is not a JSON verdict is asked again up to `retries` times (at a non-zero temperature, since a greedy re-ask
repeats itself); HTTP-level retries stay in the backend's client. An item still malformed after that, or whose
request failed, gets None: the caller counts it and never trains on a made-up score. Successful verdicts are
cached on disk by (judge model, prompt hash).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from memrl.core.asyncs import in_own_thread
from memrl.core.errors import BackendError
from memrl.rewards.judge_cache import JudgeCache, prompt_key
from memrl.rewards.types import GroundTruth, JudgeItem, JudgeVerdict
from memrl.rollout.base import ChatBackend, Message, SamplingParams
from memrl.rollout.json_output import JSONParseFailure, parse_json_object

log = logging.getLogger(__name__)

RETRY_TEMPERATURE = 0.7

_SYSTEM = (
    "You grade the notes an AI assistant wrote about a user when a session ended. The notes exist to make the "
    "assistant's later sessions with this user go better. You answer with one JSON object and nothing else."
)

_USER = """While working with the assistant, the user objected whenever a reply did not suit them. Those \
objections are the evidence: good notes turn each of them into a lasting, usable preference.

# The user's objections, one per line
{enforcements}
{gold}
# Notes to grade
{notes}

# How to grade
Weigh four things:
- Coverage: is every preference behind the objections written down?
- Actionability: does each note say concretely what to do in future replies, and when it applies?
- Grounding: does every note rest on something the user actually said? An invented or distorted preference is a \
serious error.
- Clarity: are the notes organised, with each preference stated once, without repetition or filler?

Scale:
0 = most preferences are missing, or several are invented
1 = some preferences are recorded, with little concrete guidance; one may be invented
2 = most preferences are recorded with concrete guidance; at most a minor invention
3 = every preference is recorded, concrete and actionable, and nothing is invented

Answer with exactly this JSON object:
{{"reasoning": "two or three sentences", "score": 0, 1, 2 or 3}}"""

_GOLD = """
# Reference notes for the same session (a good answer; other wordings are fine)
{gold}
"""


# One worked example shown before the real item: small judges copy its JSON shape instead of echoing the prompt,
# and a middling score with a named flaw anchors the scale without pulling verdicts to either end.
_EXAMPLE = JudgeItem(
    "- Number every step of a solution.\n- Always state a confidence level (e.g. 80%) with the final answer.\n"
    "- Use a formal tone.",
    GroundTruth(("Number the steps, please.", "Tell me how confident you are in that answer.")),
)
_EXAMPLE_VERDICT = (
    '{"reasoning": "Both preferences are recorded as concrete rules, but a formal tone was never asked for.", '
    '"score": 2}'
)


def _user_message(item: JudgeItem) -> Message:
    enforcements = "\n".join(f"- {u}" for u in item.truth.enforcements) or "(none)"
    gold = _GOLD.format(gold=item.truth.gold_notes.strip()) if item.truth.gold_notes.strip() else ""
    return {"role": "user", "content": _USER.format(enforcements=enforcements, gold=gold, notes=item.notes.strip())}


def judge_messages(item: JudgeItem, few_shot: bool = True) -> list[Message]:
    """The judge's prompt for one item (after one worked example unless `few_shot` is off)."""
    example: list[Message] = (
        [_user_message(_EXAMPLE), {"role": "assistant", "content": _EXAMPLE_VERDICT}] if few_shot else []
    )
    return [{"role": "system", "content": _SYSTEM}, *example, _user_message(item)]


def parse_verdict(text: str) -> JudgeVerdict | str:
    """The verdict in a judge reply, or why there is none."""
    parsed = parse_json_object(text, required=("score",))
    if isinstance(parsed, JSONParseFailure):
        return parsed.reason
    raw = parsed.data["score"]
    try:
        score = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        return f"score {raw!r} is not a number"
    if not 0.0 <= score <= 3.0:  # also rejects nan
        return f"score {raw!r} is outside 0-3"
    reasoning = parsed.data.get("reasoning")
    return JudgeVerdict(score, reasoning if isinstance(reasoning, str) else "")


def _native_async(backend: ChatBackend) -> bool:
    return type(backend).achat is not ChatBackend.achat


@dataclass
class JudgeStats:
    requests: int = 0  # judge prompts sent (re-asks included), cache hits excluded
    cache_hits: int = 0
    malformed: int = 0  # replies that held no valid verdict
    failed: int = 0  # items that got None


class LLMJudge:
    """Grades notes with any ChatBackend; `name` (the judge model) is part of the cache key."""

    reports_ids = False

    def __init__(
        self,
        backend: ChatBackend,
        name: str,
        sampling: SamplingParams | None = None,
        retries: int = 2,
        cache: JudgeCache | None = None,
        few_shot: bool = True,
    ) -> None:
        self.backend = backend
        self.name = name
        self.sampling = sampling or SamplingParams(temperature=0.0, max_tokens=256)
        self.retries = retries
        self.cache = cache
        self.few_shot = few_shot
        self.stats = JudgeStats()

    def _params(self, attempt: int) -> SamplingParams:
        if attempt == 0:
            return self.sampling
        seed = None if self.sampling.seed is None else self.sampling.seed + attempt
        return replace(self.sampling, temperature=max(self.sampling.temperature, RETRY_TEMPERATURE), seed=seed)

    async def _ask(self, prompts: list[list[Message]], params: SamplingParams) -> list[str | None]:
        """One reply per prompt; None where the request itself failed (after the backend's own retries)."""
        self.stats.requests += len(prompts)
        if _native_async(self.backend):
            # No bound here: the backend's own (per event loop, shared by every batch on it) is the only one, so
            # the recipe's `max_concurrency` is what reaches the server.

            async def one(messages: list[Message]) -> str | None:
                try:
                    return (await self.backend.achat(messages, params)).text
                except BackendError as exc:
                    log.warning("judge request failed: %s", exc)
                    return None

            return list(await asyncio.gather(*(one(m) for m in prompts)))
        out: list[str | None] = []
        size = max(1, self.backend.batch_size)
        for start in range(0, len(prompts), size):
            chunk = prompts[start : start + size]
            try:
                completions = await in_own_thread(self.backend.generate, chunk, params)
                out.extend(c.text for c in completions)
            except BackendError as exc:
                log.warning("judge batch failed: %s", exc)
                out.extend([None] * len(chunk))
        return out

    async def score_many(self, items: Sequence[JudgeItem]) -> list[JudgeVerdict | None]:
        verdicts: list[JudgeVerdict | None] = [None] * len(items)
        prompts = [judge_messages(item, self.few_shot) for item in items]
        keys = [prompt_key(p) for p in prompts]
        pending: list[int] = []
        why = ""
        for i, item in enumerate(items):
            if not item.notes.strip():  # nothing to grade: no request, and the rubric's floor
                verdicts[i] = JudgeVerdict(0.0, "the notes are empty")
            elif self.cache is not None and (hit := self.cache.get(self.name, keys[i])) is not None:
                self.stats.cache_hits += 1
                verdicts[i] = hit
            else:
                pending.append(i)
        for attempt in range(self.retries + 1):
            if not pending:
                break
            replies = await self._ask([prompts[i] for i in pending], self._params(attempt))
            retry: list[int] = []
            for i, reply in zip(pending, replies, strict=True):
                if reply is None:
                    continue  # a transport failure already had its retries in the client
                verdict = parse_verdict(reply)
                if isinstance(verdict, str):
                    self.stats.malformed += 1
                    retry.append(i)
                    why = verdict
                    continue
                verdicts[i] = verdict
                if self.cache is not None:
                    self.cache.put(self.name, keys[i], verdict)
            pending = retry
        failed = sum(v is None for v in verdicts)
        self.stats.failed += failed
        if failed:
            log.warning(
                "judge %s gave no verdict for %d of %d items (last malformed reply: %s)",
                self.name,
                failed,
                len(items),
                why or "none",
            )
        return verdicts
