"""Pure reward functions (judge coverage, format, length, the collab episode parts) and their registry.

Each trainer's adapter lives in its package (memrl.train.trl.rewards, memrl.train.verl.rewards), the rewards that
play an environment in memrl.train.rewards.

Import-light: the judges load their models when first built, not on import.
"""

from memrl.rewards.config import JudgeConfig, LengthPenaltyConfig, RewardConfig
from memrl.rewards.format import FormatResult, extract_notes, format_reward
from memrl.rewards.judge import Judge, build_judge
from memrl.rewards.reward import RewardScorer
from memrl.rewards.types import GroundTruth, JudgeItem, JudgeVerdict, RewardParts

__all__ = [
    "FormatResult",
    "GroundTruth",
    "Judge",
    "JudgeConfig",
    "JudgeItem",
    "JudgeVerdict",
    "LengthPenaltyConfig",
    "RewardConfig",
    "RewardParts",
    "RewardScorer",
    "build_judge",
    "extract_notes",
    "format_reward",
]
