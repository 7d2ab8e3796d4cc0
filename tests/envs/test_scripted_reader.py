"""The scripted note reader: the next-session agent of CPU runs. It follows notes by rules of its own, so it must pass
the calibration (oracle notes beat empty ones, wrong ones do not) and share nothing with the coverage judge."""

from __future__ import annotations

import ast
import asyncio
import inspect
import subprocess
import sys
from statistics import fmean

import pytest

import memrl.envs.collab.scripted_reader as reader
from memrl.core.preferences import TAXONOMY
from memrl.envs.collab.agents import oracle_notes
from memrl.envs.collab.checkers import TurnContext, Verdict, check
from memrl.envs.collab.next_session import NextSessionRow, wrong_preferences
from memrl.envs.collab.profiles import sample_profiles
from memrl.envs.collab.scripted_reader import ScriptedReader, compose_reply, read_habits
from memrl.train.rewards.next_session import NextSessionScorer

USERS = sample_profiles(120, seed=17)


def _share(notes: str, preferences: tuple[str, ...]) -> float:
    """The share of the user's preferences the reader's reply does not violate (as the next session grades it)."""
    reply = compose_reply(read_habits(notes))
    verdicts = [check(pid, reply, TurnContext(winding_down=True)).verdict for pid in preferences]
    return fmean(v is not Verdict.VIOLATED for v in verdicts)


def test_oracle_notes_beat_empty_notes_and_wrong_notes_do_not() -> None:
    shares = {
        "oracle": [_share(oracle_notes(u.preferences), u.preferences) for u in USERS],
        "empty": [_share("", u.preferences) for u in USERS],
        "wrong": [_share(oracle_notes(wrong_preferences(u.id, u.preferences)), u.preferences) for u in USERS],
    }
    means = {kind: fmean(values) for kind, values in shares.items()}
    print(f"scripted reader, {len(USERS)} users: {means}")
    assert means["oracle"] > 0.95 and means["empty"] < 0.7 and means["wrong"] < means["empty"]
    assert all(o >= e for o, e in zip(shares["oracle"], shares["empty"], strict=True))


def test_the_calibration_passes_with_it_in_the_outcome_scorer() -> None:
    rows = [NextSessionRow(f"{u.id}/s0", u.id, u.preferences, "arith", "none", 0) for u in USERS[:24]]
    scorer = NextSessionScorer(ScriptedReader(), max_turns=1)
    parts = {
        kind: asyncio.run(scorer.ascore([(notes(r), r) for r in rows]))
        for kind, notes in {
            "oracle": lambda r: oracle_notes(r.preferences),
            "wrong": lambda r: oracle_notes(wrong_preferences(r.user_id, r.preferences)),
        }.items()
    }
    oracle = [p.score for p in parts["oracle"]]  # with the notes minus the same session without them
    wrong = [p.score for p in parts["wrong"]]
    assert None not in oracle and None not in wrong
    assert fmean(oracle) > 0.3 and min(oracle) >= 0 and fmean(wrong) < 0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("notes", "habits"),
    [
        ("- Use bullet points in every reply.", {"bullets"}),
        ("The user prefers blunt answers: no pleasantries or apologies.", {"blunt"}),
        ("Never use bullet points.", set()),  # a prohibition is not a request
        ("Do not suggest next steps; answer only what was asked.", {"no-suggestions"}),
        ("The user dislikes long replies with warm-up.", set()),
        ("Keep replies to at most 3 sentences and end with a one-line TL;DR.", {"three-sentences", "tldr"}),
        (
            "- Start with an outline.\n- Give an example or analogy.\n- Say how confident you are.",
            {"outline-first", "examples", "confidence"},
        ),
        ("Be polite. Be blunt.", {"polite"}),  # two of one pair: the first named wins
        ("", set()),
    ],
)
def test_it_reads_notes_in_many_wordings(notes: str, habits: set[str]) -> None:
    assert read_habits(notes) == habits


def test_every_preference_is_read_from_its_oracle_wording() -> None:
    for pid in TAXONOMY:
        assert pid in read_habits(oracle_notes((pid,))), pid


def test_it_shares_nothing_with_the_coverage_judge() -> None:
    """No import of memrl.rewards (the judge, its taxonomy matcher, cue lists and thresholds), directly or through
    another module, and no name of the judge's in its source."""
    tree = ast.parse(inspect.getsource(reader))
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.startswith(("memrl.rewards", "memrl.core.preferences"))], imported
    probe = (
        "import sys, memrl.envs.collab.scripted_reader\n"
        "print(sorted(m for m in sys.modules if m.startswith(('memrl.rewards', 'memrl.rollout.embedding'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded
    source = inspect.getsource(reader)
    for judge_name in ("cue_hits", "PreferenceMatcher", "NOTE_ANCHORS", "MatchParams", "REQUESTS", "OfflineJudge"):
        assert judge_name not in source
