"""User simulators: the rule user on hand-written agent replies, and the LLM user's contract with a real model."""

from __future__ import annotations

import asyncio

import pytest

from memrl.core.preferences import TAXONOMY, as_prompt_text
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.problems import AnswerKind, Problem, load_problems
from memrl.envs.collab.profiles import UserProfile
from memrl.envs.collab.user_sim import (
    INITIAL_DRAFT,
    REQUESTS,
    LLMUserSimulator,
    RuleUserSimulator,
    UserTurn,
    extract_answer,
)
from memrl.rollout.base import ChatBackend, Message, SamplingParams

PROBLEM = Problem("arith-x", "arith", "A pen costs $3. How much do 4 pens cost?", "12", AnswerKind.MATH)
# three-sentences and bullets are checkable; no-suggestions too.
USER = UserProfile("u1", "A baker", ("blunt", "no-suggestions", "three-sentences"))


def _reply(text: str) -> list[Message]:
    return [{"role": "user", "content": "help"}, {"role": "assistant", "content": text}]


def _session(seed: int = 0, patience: int = 3):  # type: ignore[no-untyped-def]
    return RuleUserSimulator(Grader(), seed=seed, patience=patience).start(USER, PROBLEM, max_turns=10)


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("So the total is \\boxed{12}.", AnswerKind.MATH, "$12$"),
        ("The answer is 12.", AnswerKind.MATH, "12"),
        ("First 3 + 3 = 6, then 6 + 6 = 12", AnswerKind.MATH, "12"),
        ("What do you mean by pens?", AnswerKind.MATH, None),
        ("I think the answer is (C).", AnswerKind.CHOICE, "(C)"),
        ("Let me think about the options.", AnswerKind.CHOICE, None),
    ],
)
def test_extract_answer(text: str, kind: AnswerKind, expected: str | None) -> None:
    assert extract_answer(text, kind) == expected


def test_rule_user_opens_with_the_problem_and_an_empty_draft() -> None:
    turn = asyncio.run(_session().open())
    assert PROBLEM.question in turn.response
    assert turn.draft_answer == INITIAL_DRAFT
    assert not turn.enforce


def test_rule_user_enforces_violated_preferences_without_progress() -> None:
    session = _session()
    asyncio.run(session.open())
    long_reply = "Sorry for the wait! Each pen is $3. Four pens is 4 times 3. That makes 12. Hope this helps. Thanks!"
    turn = asyncio.run(session.reply(_reply(long_reply)))
    assert turn.enforce
    assert set(turn.violated) == {"blunt", "three-sentences"}
    for pid in turn.violated:
        assert REQUESTS[pid] in turn.response  # the utterance names what was violated
    assert turn.draft_answer == INITIAL_DRAFT  # a correct answer in a violating reply does not count
    assert not turn.terminate


def test_rule_user_updates_draft_and_ends_on_a_compliant_correct_answer() -> None:
    session = _session()
    asyncio.run(session.open())
    wrong = asyncio.run(session.reply(_reply("Four pens cost 4 x 3 = 15.")))
    assert (wrong.enforce, wrong.terminate, wrong.draft_answer) == (False, False, "15")
    right = asyncio.run(session.reply(_reply("Four pens cost 4 x 3 = 12.")))
    assert (right.enforce, right.terminate, right.draft_answer) == (False, True, "12")


def test_rule_user_answers_clarifying_questions_and_gives_up_when_stuck() -> None:
    session = _session(patience=2)
    asyncio.run(session.open())
    clarify = asyncio.run(session.reply(_reply("How many pens do you need?")))
    assert not clarify.enforce
    assert PROBLEM.question in clarify.response
    first = asyncio.run(session.reply(_reply("Let us look at the price of one pen.")))
    assert not first.terminate
    second = asyncio.run(session.reply(_reply("Prices matter here.")))
    assert second.terminate  # two compliant replies without a new answer: the agent cannot help further


def test_rule_user_is_deterministic_per_seed() -> None:
    def run(seed: int) -> list[UserTurn]:
        session = _session(seed)
        return [asyncio.run(session.open()), asyncio.run(session.reply(_reply("Sorry! " * 5)))]

    assert run(3) == run(3)
    assert any(run(s) != run(3) for s in range(4, 12))


@pytest.mark.slow
def test_llm_user_keeps_the_contract_with_a_real_model(smollm2: str) -> None:
    from memrl.rollout.hf_local import HFBackend

    backend = HFBackend(smollm2)
    simulator = LLMUserSimulator(backend, SamplingParams(temperature=0.0, max_tokens=96))
    problem = load_problems("arith", limit=1, seed=0)[0]
    session = simulator.start(USER, problem, max_turns=10)

    async def play() -> list[UserTurn]:
        first = await session.open()
        turns: list[Message] = [{"role": "user", "content": first.response}]
        turns.append({"role": "assistant", "content": "Sorry!! I'd be delighted to help. " * 6})
        return [first, await session.reply(turns)]

    opened, reacted = asyncio.run(play())
    assert opened.response
    assert not opened.enforce
    assert not opened.terminate
    if reacted.enforce:  # whatever the model says, enforcing freezes the draft and blocks the ending
        assert reacted.draft_answer == opened.draft_answer
        assert not reacted.terminate
    assert backend.usage.requests == 2


class _Recording(ChatBackend):
    """A real backend that also keeps the conversations it was sent."""

    name = "recording"

    def __init__(self, inner: ChatBackend) -> None:
        super().__init__()
        self.inner, self.sent = inner, []  # type: ignore[var-annotated]

    def generate(self, conversations, params=None):  # type: ignore[no-untyped-def]
        self.sent.extend(conversations)
        return self.inner.generate(conversations, params)


def test_llm_user_hears_the_original_wording_and_counts_cut_replies(tiny_qwen2: str) -> None:
    from memrl.rollout.hf_local import HFBackend

    original = ("Answers must open with a one-line summary, e.g. 'TL;DR: 12'.", "Be blunt.", "Never suggest extras.")
    user = UserProfile("u2", "A baker", ("blunt", "no-suggestions", "tldr"), original)
    backend = _Recording(HFBackend(tiny_qwen2))
    # A random tiny model never closes its JSON within 8 tokens: the reply is cut and counted.
    session = LLMUserSimulator(backend, SamplingParams(temperature=0.0, max_tokens=8, seed=0)).start(user, PROBLEM, 4)
    opened = asyncio.run(session.open())
    prompt = "\n".join(m["content"] for m in backend.sent[0])
    assert all(sentence in prompt for sentence in original)
    assert as_prompt_text(TAXONOMY["tldr"]) not in prompt
    assert opened.truncated and opened.parse_failed


@pytest.mark.parametrize("original", [False, True])
def test_the_original_rules_take_the_draft_while_enforcing_and_stop_only_on_the_token(
    tiny_qwen2: str, original: bool
) -> None:
    from memrl.rollout.hf_local import HFBackend

    session = LLMUserSimulator(HFBackend(tiny_qwen2), SamplingParams(max_tokens=8), original).start(USER, PROBLEM, 4)
    enforcing = '{"response": "Be blunt.", "enforce_preferences": true, "draft_answer": "12"}'
    said = session._parse(enforcing)  # type: ignore[attr-defined]
    assert said.enforce and said.draft_answer == ("12" if original else INITIAL_DRAFT)
    ending = '{"response": "Thanks!", "enforce_preferences": false, "should_terminate": true}'
    assert session._parse(ending).terminate is not original  # type: ignore[attr-defined]
