"""User profiles: seeded sampling, the original benchmark's file format, and disjoint train/eval users."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.core.errors import ConfigError
from memrl.core.preferences import TAXONOMY, get_preference
from memrl.envs.collab.profiles import (
    UserProfile,
    check_disjoint,
    load_profiles,
    profiles_for,
    sample_profiles,
    save_profiles,
    split_profiles,
)


def test_sampling_is_seeded_and_uses_three_distinct_categories() -> None:
    a, b, c = sample_profiles(50, 1), sample_profiles(50, 1), sample_profiles(50, 2)
    assert a == b
    assert a != c
    for profile in a:
        assert len({get_preference(p).category for p in profile.preferences}) == 3
    assert len({p.id for p in a}) == 50
    used = {pid for p in sample_profiles(200, 0) for pid in p.preferences}
    assert used == set(TAXONOMY)  # every preference shows up in a large pool


def test_split_is_disjoint_and_overlap_is_reported() -> None:
    train, eval_ = split_profiles(sample_profiles(40, 3), 10, seed=3)
    assert len(eval_) == 10
    assert len(train) == 30
    assert not {p.id for p in train} & {p.id for p in eval_}
    clone = UserProfile("someone-else", train[0].persona, train[0].preferences)  # same user under a new id
    with pytest.raises(ConfigError, match=r"overlap in 1 user\(s\)"):
        check_disjoint(train, [clone, *eval_])


def test_profile_rejects_unknown_ids_and_repeated_categories() -> None:
    with pytest.raises(ConfigError, match="did you mean 'bullets'"):
        UserProfile("u", "p", ("direct", "polite", "bulets"))
    with pytest.raises(ConfigError, match="distinct categories"):
        UserProfile("u", "p", ("direct", "narrative", "polite"))


def _original_sentence(pid: str) -> str:
    """A sentence in the original benchmark's style: it carries the preference's distinctive phrase."""
    return f"You like it when {TAXONOMY[pid].original_key} happens. Enforce otherwise."


def test_loads_the_original_user_profiles_format(tmp_path: Path) -> None:
    original = [
        {
            "i": 7,
            "persona": "A beekeeper who teaches statistics",
            "preferences": [_original_sentence(p) for p in ("blunt", "holistic", "tldr")],
            "categories": ["politeness", "guidance", "habitual_strategies"],
        }
    ]
    path = tmp_path / "user_profiles.json"
    path.write_text(json.dumps(original))
    [profile] = load_profiles(path)
    sentences = tuple(original[0]["preferences"])
    assert profile == UserProfile(
        "orig-7", "A beekeeper who teaches statistics", ("blunt", "holistic", "tldr"), sentences
    )
    # The original sentences travel with the profile: saved, loaded back, and given to the LLM user.
    save_profiles([profile], tmp_path / "saved.jsonl")
    assert load_profiles(tmp_path / "saved.jsonl") == [profile]


def test_round_trip_and_bad_files(tmp_path: Path) -> None:
    profiles = sample_profiles(3, 0)
    save_profiles(profiles, tmp_path / "users.jsonl")
    assert load_profiles(tmp_path / "users.jsonl") == profiles
    with pytest.raises(ConfigError, match="not found"):
        load_profiles(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_profiles(tmp_path / "bad.json")
    (tmp_path / "bad-pref.json").write_text(json.dumps([{"id": "u", "persona": "p", "preferences": ["x", "y", "z"]}]))
    with pytest.raises(ConfigError, match="user profile 0: unknown preference 'x'") as info:
        load_profiles(tmp_path / "bad-pref.json")
    assert "\n" not in str(info.value)


def test_users_can_be_drawn_from_a_subset_of_preferences(tmp_path: Path) -> None:
    chosen = ["analytic", "polite", "proactive", "examples", "bullets"]
    train = profiles_for(None, "train", users=40, seed=0, preferences=chosen)
    held_out = profiles_for(None, "eval", users=40, seed=0, preferences=chosen)
    assert all(set(u.preferences) <= set(chosen) for u in train + held_out)
    assert not {u.id for u in train} & {u.id for u in held_out}
    assert {p for u in train for p in u.preferences} == set(chosen)
    with pytest.raises(ConfigError, match="span 2 categories"):
        sample_profiles(5, 0, preferences=["polite", "blunt", "analytic"])  # two categories only
    with pytest.raises(ConfigError, match="politee"):
        sample_profiles(5, 0, preferences=["politee", "analytic", "proactive"])
    # Only so many distinct users exist (1 preference triple x 2 personas): the pool stops there, never spins.
    assert len(sample_profiles(50, 0, personas=["a", "b"], preferences=["polite", "analytic", "proactive"])) == 2
    # A profiles file keeps the users holding nothing else.
    users = [
        UserProfile("in-1", "a nurse", ("polite", "analytic", "proactive")),
        UserProfile("out-1", "a pilot", ("blunt", "analytic", "proactive")),
        UserProfile("in-2", "a baker", ("polite", "analytic", "examples")),
        UserProfile("in-3", "a judge", ("bullets", "analytic", "proactive")),
    ]
    save_profiles(users, path := tmp_path / "users.jsonl")
    kept = profiles_for(path, "train", users=1, seed=0, preferences=chosen) + profiles_for(
        path, "eval", users=1, seed=0, preferences=chosen
    )
    assert {u.id for u in kept} <= {"in-1", "in-2", "in-3"} and len(kept) == 2
