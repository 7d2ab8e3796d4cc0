"""The next-session outcome reward: notes in the user's next session against the same session without them.

The scripted reader (memrl.envs.collab.scripted_reader) meets exactly the preferences its notes state,
so the reward measures the notes alone: faithful notes must beat empty and wrong ones.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
from support import ReflectionRows

from memrl.core.preferences import TAXONOMY, get_preference
from memrl.data_gen.gold import compose_notes
from memrl.envs.collab.checkers import TurnContext, Verdict, check
from memrl.envs.collab.next_session import NextSessionRow, load_rows
from memrl.envs.collab.problems import Problem
from memrl.envs.collab.profiles import UserProfile, sample_profiles
from memrl.envs.collab.scripted_reader import ScriptedReader, compose_reply, read_habits
from memrl.envs.collab.user_sim import RuleUserSimulator, UserSession
from memrl.rewards.config import NextSessionRewardConfig, RewardConfig
from memrl.rewards.parts import RewardPart
from memrl.rollout.base import Message
from memrl.train.report import write_report
from memrl.train.rewards.next_session import FAILED_METRIC, NextSessionScorer, OutcomeScorer
from memrl.train.rewards.next_session_eval import outcome_report, spearman
from memrl.train.trl.rewards import grpo_rewards, reflection_funcs

PROFILES = sample_profiles(16, seed=7)
ROWS = [NextSessionRow(f"{p.id}/s0", p.id, p.preferences, "arith", "none", 0) for p in PROFILES]


def wrong(prefs: Sequence[str]) -> list[str]:
    """Preferences the user does not hold: each one's opposite, else another of its category."""
    out = []
    for pid in prefs:
        pref = get_preference(pid)
        others = [q for q, p in TAXONOMY.items() if p.category == pref.category and q != pid]
        out.append(pref.opposite or others[0])
    return out


def reflection(notes: str) -> str:
    return json.dumps({"user_preferences_reasoning": "what the user asked for", "agent_notes": notes})


def scorer(**kwargs: Any) -> NextSessionScorer:
    return NextSessionScorer(ScriptedReader(), max_turns=2, **kwargs)


def test_the_scripted_agent_meets_what_its_notes_state() -> None:
    for profile in sample_profiles(60, seed=3):
        notes = compose_notes(profile.preferences)
        assert set(profile.preferences) <= read_habits(notes) | {"narrative", "intuitive"}
        reply = compose_reply(read_habits(notes))
        verdicts = [check(pid, reply, TurnContext(winding_down=True)).verdict for pid in profile.preferences]
        assert Verdict.VIOLATED not in verdicts, (profile.preferences, reply)
    assert read_habits("") == frozenset()


def test_a_sessions_share_is_graded_per_preference() -> None:
    """A reply that breaks one of three preferences scores 2/3, not 0: a reader that meets one preference more than
    before is seen (as the collab `preference` part grades it)."""
    from memrl.envs.collab.next_session import session_share

    user = UserProfile("u", "a nurse", ("bullets", "polite", "analytic"))
    turns = [
        {"role": "user", "content": "What is 3 + 4?"},
        {"role": "assistant", "content": "- 3 + 4 = 7, because four more than three is seven."},  # not polite
        {"role": "user", "content": "Be nicer."},
        {"role": "assistant", "content": "Thank you for asking! It is 7."},  # no list, no reasoning
    ]
    assert asyncio.run(session_share(turns, user, None)) == pytest.approx((2 / 3 + 1 / 3) / 2)


def test_faithful_notes_beat_empty_and_wrong_notes() -> None:
    s = scorer()
    faithful = asyncio.run(s.ascore([(compose_notes(r.preferences), r) for r in ROWS]))
    empty = asyncio.run(s.ascore([("", r) for r in ROWS]))
    wrong_notes = asyncio.run(s.ascore([(compose_notes(wrong(r.preferences)), r) for r in ROWS]))
    means = {name: fmean(p.score for p in parts if p.score is not None) for name, parts in
             (("faithful", faithful), ("empty", empty), ("wrong", wrong_notes))}  # fmt: skip
    print(f"outcome reward, scripted note-following agent, {len(ROWS)} users: {means}")
    assert means["empty"] == 0.0  # the counterfactual of no notes is the baseline itself
    assert means["faithful"] > means["empty"] and means["faithful"] > means["wrong"]
    for f, w in zip(faithful, wrong_notes, strict=True):  # per user too, never worse than wrong notes
        assert f.score is not None and w.score is not None and f.score >= w.score
        assert f.with_notes is not None and f.without_notes is not None
        assert f.score == pytest.approx(f.with_notes - f.without_notes)


def test_sessions_are_cached_by_notes_and_row() -> None:
    s = scorer()
    items = [(compose_notes(r.preferences), r) for r in ROWS[:4]]
    first = asyncio.run(s.ascore(items))
    assert s.stats() == {"sessions": 8, "cache_hits": 0, "failures": 0}  # with notes and without, per row
    again = asyncio.run(s.ascore([(f"  {n}\n", r) for n, r in items]))  # surrounding blanks: the same notes
    assert again == first
    assert s.stats()["sessions"] == 8 and s.stats()["cache_hits"] == 8
    asyncio.run(s.ascore([("- Be blunt.", r) for r in ROWS[:4]]))  # new notes: only their sessions are played
    assert s.stats()["sessions"] == 12
    repeated = asyncio.run(scorer(cache_size=0).ascore(items))
    assert repeated == first  # deterministic: a fresh scorer plays the same sessions


class _BrokenUser(RuleUserSimulator):
    """A rule user whose sessions fail for one user id (as an LLM user's endpoint would)."""

    def start(self, profile: UserProfile, problem: Problem, max_turns: int) -> UserSession:
        session = super().start(profile, problem, max_turns)
        if profile.id == ROWS[0].user_id:

            async def reply(turns: Sequence[Message]) -> Any:
                raise ConnectionError("user endpoint down")

            session.reply = reply  # type: ignore[method-assign]
        return session


def test_a_failed_session_gives_none_never_zero_and_is_not_cached() -> None:
    s = scorer()
    s.simulator = _BrokenUser(s.grader)
    parts = asyncio.run(s.ascore([(compose_notes(r.preferences), r) for r in ROWS[:3]]))
    assert parts[0].score is None and parts[0].failed and "user endpoint down" in parts[0].error
    assert all(p.score is not None for p in parts[1:])
    assert s.stats()["failures"] == 1
    s.simulator = RuleUserSimulator(s.grader)  # the endpoint is back: the failed sessions are played again
    assert asyncio.run(s.ascore([(compose_notes(ROWS[0].preferences), ROWS[0])]))[0].score is not None


class _FailingAgent(ScriptedReader):
    async def replies(self, requests: Sequence[tuple[str, list[Message]]]) -> list[str]:
        raise TimeoutError("agent model timed out")


def test_a_failed_agent_gives_none() -> None:
    parts = asyncio.run(NextSessionScorer(_FailingAgent()).ascore([("- Be blunt.", ROWS[0])]))
    assert parts[0].score is None and "timed out" in parts[0].error


def test_trl_adapter_is_async_and_gives_one_value_per_completion() -> None:
    rows = {r.key: r for r in ROWS[:3]}
    (func,) = reflection_funcs([RewardPart("outcome", 1.0, OutcomeScorer(scorer(), rows))])
    assert inspect.iscoroutinefunction(func) and func.__name__ == "outcome"
    keys = [r.key for r in ROWS[:3] for _ in range(2)]
    completions = [
        [{"role": "assistant", "content": reflection(compose_notes(rows[k].preferences) if i % 2 else "")}]
        for i, k in enumerate(keys)
    ]
    logged: dict[str, float] = {}
    values = asyncio.run(func(prompts=[""] * 6, completions=completions, key=keys, log_metric=logged.__setitem__))
    assert len(values) == 6 and values[0::2] == [0.0, 0.0, 0.0]  # empty notes: exactly the baseline
    assert all(v is not None and v > 0 for v in values[1::2])
    assert logged == {FAILED_METRIC: 0.0}
    plain = asyncio.run(func(prompts=[""], completions=["not a reflection"], key=keys[:1]))
    assert plain == [0.0]  # no JSON contract: the agent would store no notes


def test_grpo_rewards_mix_the_outcome_in_with_its_weight(tmp_path: Path, reflection_rows: ReflectionRows) -> None:
    data = reflection_rows(ROWS[:2])
    plain_funcs, plain_weights = grpo_rewards(RewardConfig(), data)
    assert [f.__name__ for f in plain_funcs] == ["coverage", "format"] and plain_weights == [1.0, 1.0]
    cfg = RewardConfig(outcome=NextSessionRewardConfig(weight=0.5, agent={"backend": "hf", "model": "tiny-qwen2"}))
    funcs, weights = grpo_rewards(cfg, data)
    assert [f.__name__ for f in funcs] == ["coverage", "format", "outcome"] and weights == [1.0, 1.0, 0.5]
    assert set(load_rows(data)) == {r.key for r in ROWS[:2]}


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman([1, 1, 2, 2], [1, 2, 3, 4]) == pytest.approx(0.8944, abs=1e-4)  # ties share their rank
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_agreement_with_the_judge_goes_into_the_report(tmp_path: Path, reflection_rows: ReflectionRows) -> None:
    rows = ROWS[:6]
    data = reflection_rows(rows)
    eval_dir = tmp_path / "eval"
    # Coverage as a judge would grade: faithful notes 1, half of them 0.5, none 0.
    kinds = [("faithful", 1.0), ("half", 0.5), ("empty", 0.0)]
    for label in ("base", "grpo"):
        (eval_dir / label).mkdir(parents=True)
        lines = []
        for i, row in enumerate(rows):
            kind, coverage = kinds[(i + (label == "grpo")) % 3]
            prefs = {"faithful": row.preferences, "half": row.preferences[:1], "empty": ()}[kind]
            lines.append({"key": row.key, "completion": reflection(compose_notes(prefs)), "coverage": coverage})
        (eval_dir / label / "scores.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    outcome = outcome_report(NextSessionRewardConfig(), data, eval_dir, ["base", "grpo"], scorer=scorer())
    agreement = outcome["outcome_agreement"]
    print(f"agreement with the coverage judge (scripted agent): {agreement}")
    assert agreement["n"] == 12 and outcome["failures"] == 0
    assert agreement["spearman_outcome_vs_coverage"] > 0.5
    assert len((eval_dir / "base" / "outcome_scores.jsonl").read_text().splitlines()) == 6
    report = json.loads(write_report(tmp_path, {"base": {"score": 1.0}}, None, {}, outcome).read_text())
    assert report["outcome"]["outcome_agreement"] == agreement


def test_verl_adapter_returns_score_and_parts(tmp_path: Path, reflection_rows: ReflectionRows, tiny_qwen2: str) -> None:
    from memrl.train.verl.rewards import compute_score, compute_score_async

    data = reflection_rows(ROWS[:2])
    outcome = NextSessionRewardConfig(
        weight=0.5, agent={"backend": "hf", "model": tiny_qwen2}, sampling={"max_tokens": 8}, data=str(data)
    )
    kwargs = {"reward_config": RewardConfig(outcome=outcome).model_dump_json()}
    truth = {"enforcements": ["Hold on. Be blunt."], "gold_notes": "", "expected": []}
    solution = reflection(compose_notes(ROWS[0].preferences))
    out = compute_score("memrl/collab_reflection", solution, truth, {"key": ROWS[0].key}, **kwargs)
    assert {"score", "coverage", "format", "outcome", "outcome_with_notes", "outcome_without_notes"} <= set(out)
    assert isinstance(out["score"], float) and not math.isnan(out["score"]) and out["outcome_failed"] == 0.0
    assert out["score"] == pytest.approx(out["coverage"] + out["format"] + 0.5 * out["outcome"])

    async def both() -> list[dict[str, float | None]]:  # concurrent calls: one batch of sessions
        calls = [compute_score_async("d", solution, truth, {"key": r.key}, **kwargs) for r in ROWS[:2]]
        return list(await asyncio.gather(*calls))

    assert [type(o["score"]) for o in asyncio.run(both())] == [float, float]


def test_a_verl_stage_scores_with_the_outcome_reward_its_overrides_name(
    tmp_path: Path, reflection_rows: ReflectionRows, tiny_qwen2: str
) -> None:
    """verl's own config, composed from the stage's overrides, names the outcome adapter; the reward kwargs it holds
    (API keys left out, the stage's data folder filled in) score a verl row, keys back from the job's environment."""
    from memrl.train.config import GRPOStage
    from memrl.train.verl.command import secret_env
    from memrl.train.verl.overrides import grpo_overrides
    from memrl.train.verl.validate import PPO_CONFIG, compose, validate_overrides

    data = reflection_rows(ROWS[:2])
    agent = {"backend": "openai", "model": "m", "endpoint": "http://127.0.0.1:9/v1", "api_key": "sk-outcome-secret"}
    outcome = NextSessionRewardConfig(weight=0.5, agent=agent, sampling={"max_tokens": 8})
    stage = GRPOStage(kind="grpo", trainer="verl", model="policy", data="data", reward=RewardConfig(outcome=outcome))
    overrides = grpo_overrides(stage, model_path="m", data_dir=data, out_dir=tmp_path / "o", experiment="x")
    assert "sk-outcome-secret" not in " ".join(overrides)
    assert secret_env(stage) == {"MEMRL_OUTCOME_AGENT_API_KEY": "sk-outcome-secret"}
    validate_overrides(PPO_CONFIG, overrides)  # verl's own config accepts them
    cfg = compose(PPO_CONFIG, overrides)
    function = cfg.reward.custom_reward_function
    assert function.path == "pkg://memrl.train.verl.rewards" and function.name == "compute_score_async"
    kwargs = dict(function.reward_kwargs)
    assert kwargs["outcome"]["data"] == str(data) and kwargs["outcome"]["agent"]["api_key"] is None

    # What verl calls, on a verl row of the reflection data; the agent swapped for a local tiny model.
    from memrl.train.verl.rewards import compute_score, reward_config

    kwargs["outcome"] = dict(kwargs["outcome"]) | {"agent": {"backend": "hf", "model": tiny_qwen2}}
    assert reward_config(kwargs).outcome is not None
    truth = {"enforcements": ["Hold on. Be blunt."], "gold_notes": "", "expected": []}
    notes = reflection(compose_notes(ROWS[0].preferences))
    out = compute_score("memrl/collab_reflection", notes, truth, {"key": ROWS[0].key}, **kwargs)  # verl_rl_rows' key
    assert out["outcome_failed"] == 0.0
    assert out["score"] == pytest.approx(out["coverage"] + out["format"] + 0.5 * out["outcome"])
