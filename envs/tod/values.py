"""When two slot values are the same value: the one comparison of MS-TOD memory, labels, facts and metrics.

The release's gold values and what users say differ in wording only: "two" / "2", "one room" / "1", "the Drums" /
"Drums", "Cher's" / "Cher", "March 3rd" / "march 3rd.", "7:00 pm" / "7 pm". `normalise_value` maps all of these
to one form; values that differ stay apart ("12" / "2", "March 3rd" / "March 4th", "6 pm" / "6").
`mentions` asks whether a text states a value, word for word after the same normalisation.
"""

from __future__ import annotations

import re

NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        (
            *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"),
            *("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"),
            "twenty",
        )
    )
}
"""Number word -> its digits: the extractor stores counts as digits, users and gold write either."""

_ARTICLES = ("the", "a", "an")
_CLOCK = {"am", "pm"}  # "6 pm" is a time, not a count of six units
_ORDINAL = re.compile(r"^(\d+)(?:st|nd|rd|th)$")  # "3rd" -> "3": gold writes "March 3rd", users also "March 3"
_NON_WORD = re.compile(r"[^\w\s]")  # punctuation goes; letters and digits of any script stay


def _tokens(text: str) -> list[tuple[str, str]]:
    """(normalised word, word as written) pairs of `text`."""
    text = text.replace("\u2019", "'")
    text = re.sub(r"\b([aApP])\.?[mM]\.", r"\1m", text)  # "6 p.m." -> "6 pm"
    text = re.sub(r"(\d)([aApP][mM])\b", r"\1 \2", text)  # "6pm" -> "6 pm"
    text = re.sub(r"(\d):00\b", r"\1", text)  # "7:00 pm" -> "7 pm"
    text = re.sub(r"'s\b", "", text)  # a possessive names the same thing: "Cher's" -> "Cher"
    out = []
    for said in _NON_WORD.sub(" ", text.replace("'", "")).split():
        word = said.casefold()
        word = NUMBER_WORDS.get(word, word)
        if m := _ORDINAL.match(word):
            word = m[1]
        out.append((word, said))
    return out


def normalise_words(text: str) -> str:
    """Every word of `text` normalised (case, punctuation, number words, ordinals), single spaces; nothing dropped."""
    return " ".join(word for word, _ in _tokens(text))


def normalise_value(value: str) -> str:
    """`normalise_words`, then a leading article dropped and a count's unit noun dropped ("2 rooms" -> "2"; the
    unit must be written in lower case, so "Five Guys" stays a name)."""
    tokens = _tokens(value)
    if len(tokens) > 1 and tokens[0][0] in _ARTICLES:
        tokens = tokens[1:]
    if len(tokens) == 2 and tokens[0][0].isdigit():
        unit, said = tokens[1]
        if unit.isalpha() and said.islower() and unit not in _CLOCK:
            tokens = tokens[:1]
    return " ".join(word for word, _ in tokens)


def same_value(a: str, b: str) -> bool:
    """Whether `a` and `b` state the same value (`normalise_value` of both agrees)."""
    return normalise_value(a) == normalise_value(b)


def mentions(text: str, value: str) -> bool:
    """Whether `text` states `value` as whole words ("2" is not found in "12"; "two rooms" states "2 rooms")."""
    needle = normalise_value(value)
    if not needle:
        return False
    return f" {needle} " in f" {normalise_words(text)} "
