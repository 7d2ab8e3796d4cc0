"""The shopping rules: which options a user accepts, the gold choice, and the rule-based user's feedback.

A user accepts an option when every feature value is one they like most or like second (conjunctive); a disliked or
unknown value rules it out. Among acceptable options the gold is the one with the most like-most values, ties going
to the earliest label; with none acceptable the gold is "D" (buy nothing). This reproduces the released `gt` on
every row of the four phases (phases 1-2 under the original tables, 3-4 under the updated ones).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from memrl.envs.pahf.formats import PahfDataError, PersonaTable, ShoppingScenario

Choice = Literal["A", "B", "C", "D"]
OPTIONS: tuple[Choice, ...] = ("A", "B", "C", "D")  # D = buy nothing
Status = Literal["like_most", "like_second", "dislike", "unknown"]
Style = Literal["minimal", "detailed"]


@dataclass(frozen=True)
class Feedback:
    correct: bool
    message: str
    kind: str  # right | drift | buy_nothing_but_fit | disliked | acceptable_not_preferred

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _check_product(table: PersonaTable, product: str) -> None:
    if product not in table.products:
        raise PahfDataError(f"user {table.name!r} has no preferences for product {product!r}")


def feature_of(table: PersonaTable, product: str, value: str) -> str | None:
    """The feature (e.g. `door configuration`) whose values include `value`; None when no feature lists it."""
    for feature, pref in table.products.get(product, {}).items():
        if value == pref.like_most or value in pref.like_second or value in pref.dislike:
            return feature
    return None


def feature_status(table: PersonaTable, product: str, value: str) -> Status:
    """How the user rates one feature value of a product."""
    _check_product(table, product)
    feature = feature_of(table, product, value)
    if feature is None:
        return "unknown"
    pref = table.products[product][feature]
    if value == pref.like_most:
        return "like_most"
    return "like_second" if value in pref.like_second else "dislike"


def _option(scenario: ShoppingScenario, option: str) -> list[str]:
    if option not in scenario.options:
        have = ", ".join([*scenario.options, "D"])
        raise PahfDataError(f"choice {option!r} is not an option of this {scenario.product} scenario ({have})")
    return scenario.options[option]


def acceptable(table: PersonaTable, scenario: ShoppingScenario, option: str) -> bool:
    """Every feature value of the option is liked most or second (no disliked or unknown value)."""
    return all(
        feature_status(table, scenario.product, v) in ("like_most", "like_second") for v in _option(scenario, option)
    )


def _like_most_count(table: PersonaTable, scenario: ShoppingScenario, option: str) -> int:
    return sum(feature_status(table, scenario.product, v) == "like_most" for v in _option(scenario, option))


def gold(table: PersonaTable, scenario: ShoppingScenario) -> Choice:
    """The acceptable option with the most like-most values (earliest label on a tie); "D" when none fits."""
    fits = [label for label in scenario.options if acceptable(table, scenario, label)]
    if not fits:
        return "D"
    return max(fits, key=lambda label: (_like_most_count(table, scenario, label), -ord(label)))


# --- the rule-based user's feedback ---------------------------------------------------------------------------------


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _disliked(table: PersonaTable, scenario: ShoppingScenario, choice: str) -> list[str]:
    values = _option(scenario, choice)
    return [v for v in values if feature_status(table, scenario.product, v) in ("dislike", "unknown")]


def _rather(table: PersonaTable, product: str, value: str) -> str:
    feature = feature_of(table, product, value)
    if feature is None:
        return f"I'm not sure what {value} is"
    return f"for the {feature} I'd rather have {table.products[product][feature].like_most}"


def _why_wrong(table: PersonaTable, scenario: ShoppingScenario, choice: Choice, target: Choice, style: Style) -> str:
    """Why `choice` is not what the user wanted (`target` is the gold under `table`), in the user's words."""
    product = scenario.product
    if choice == "D":
        if style == "minimal":
            return f"one of the options would have suited me, so I'd rather you had bought a {product}."
        return f"option {target} ({_join(scenario.options[target])}) would have suited me fine."  # type: ignore[index]
    bad = _disliked(table, scenario, choice)
    if bad:
        if style == "minimal":
            return f"I don't like the {_join(bad)}."
        return f"I don't like the {_join(bad)}: " + "; ".join(_rather(table, product, v) for v in bad) + "."
    if style == "minimal":
        return "that one is acceptable, but another option would have suited me better."
    if target == "D":  # unreachable for an acceptable choice; kept for safety
        return "I'd rather you hadn't bought anything."
    gains = [
        v
        for v in scenario.options[target]
        if feature_status(table, product, v) == "like_most" and v not in scenario.options[choice]
    ]
    why = f": it has the {_join(gains)} I like most" if gains else ""
    return f"that one is acceptable, but I'd have preferred option {target}{why}."


def changed_values(original: PersonaTable, table: PersonaTable, scenario: ShoppingScenario, choice: str) -> list[str]:
    """The values of `choice` that drifted from liked to disliked, when the drift is what makes the choice wrong.

    The released harness's rule: the option was acceptable under the `original` table, and some of its values were
    liked most or second there but are disliked, for the same feature, under the current `table`. Buying nothing
    ("D") has no values, so it never counts. The list is empty when the rule does not apply.
    """
    if choice == "D" or not acceptable(original, scenario, choice):
        return []
    product = scenario.product
    out = []
    for value in _option(scenario, choice):
        feature = feature_of(table, product, value)
        if feature is None or value not in table.products[product][feature].dislike:
            continue
        before = original.products[product].get(feature)
        if before is not None and (value == before.like_most or value in before.like_second):
            out.append(value)
    return out


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def rule_feedback(
    table: PersonaTable,
    scenario: ShoppingScenario,
    choice: str,
    style: Style = "minimal",
    drifted: bool = False,
    original: PersonaTable | None = None,
) -> Feedback:
    """The deterministic user's reaction to `choice` (A/B/C, or D to buy nothing) under `table`.

    `original`, the user's table before the drift, enables the drift case, as in the released harness: a product
    choice (not D) that was acceptable under `original` and has a value the user liked there but dislikes now gets
    "my preferences have changed" naming that value (see `changed_values`). `drifted=True` without `original` is an
    error, because the rule needs the old table to tell what changed.
    """
    if drifted and original is None:
        raise ValueError("rule_feedback(drifted=True) needs original=<the table before the drift>")
    if choice not in OPTIONS:
        raise PahfDataError(f"choice {choice!r} is not one of {', '.join(OPTIONS)}")
    if choice != "D":
        _option(scenario, choice)
    picked: Choice = choice
    target = gold(table, scenario)
    if picked == target:
        if picked == "D":
            return Feedback(True, "Good call not buying anything: none of these suit me.", "right")
        return Feedback(True, "That's the one I wanted, thanks.", "right")
    reason = _why_wrong(table, scenario, picked, target, style)
    changed = changed_values(original, table, scenario, picked) if original is not None else []
    if changed:
        it = "it" if len(changed) == 1 else "them"
        message = f"My preferences have changed: I used to like the {_join(changed)}, but I don't want {it} any more."
        if style == "detailed":
            message += " " + " ".join(_capital(_rather(table, scenario.product, v)) + "." for v in changed)
        return Feedback(False, message, "drift")
    if picked == "D":
        return Feedback(False, _capital(f"you bought nothing, but {reason}"), "buy_nothing_but_fit")
    if _disliked(table, scenario, picked):
        return Feedback(False, _capital(reason), "disliked")
    return Feedback(False, _capital(reason), "acceptable_not_preferred")
