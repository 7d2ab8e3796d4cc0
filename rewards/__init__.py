"""The reflection reward: judge coverage (offline MiniLM judge or an LLM judge) + format, with trainer adapters.

Import-light: the judges load their models when first built, not on import.
"""

from memrl.rewards.bce import auto_pos_weight, judger_bce
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
    "auto_pos_weight",
    "build_judge",
    "extract_notes",
    "format_reward",
    "judger_bce",
]
