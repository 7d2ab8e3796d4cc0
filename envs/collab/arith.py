"""The shipped offline task 'arith': word problems with exact whole-number answers, generated from a seed.

No data file and no network: each template draws its numbers from a seeded RNG so a (n, seed) pair always gives the
same problems, and solutions are short worked steps ending in "The answer is N."
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from memrl.envs.collab.problems import AnswerKind, Problem, normalize_text, problem_id

Worked = tuple[str, list[str], int]  # question, solution steps, answer
Template = Callable[[random.Random], Worked]

NAMES = (
    "Maya", "Omar", "Lena", "Kofi", "Priya", "Diego", "Hana", "Tom", "Aisha", "Ivan",
    "Mei", "Lucas", "Zara", "Noah", "Sofia", "Ravi", "Elena", "Sam", "Yuki", "Ben",
)  # fmt: skip
GOODS = (
    ("notebook", "notebooks"), ("pen", "pens"), ("apple", "apples"), ("sandwich", "sandwiches"),
    ("ticket", "tickets"), ("candle", "candles"), ("mug", "mugs"), ("plant", "plants"),
)  # fmt: skip


def _two_names(rng: random.Random) -> tuple[str, str]:
    a, b = rng.sample(NAMES, 2)
    return a, b


def shopping_total(rng: random.Random) -> Worked:
    name = rng.choice(NAMES)
    (_, g1), (_, g2) = rng.sample(GOODS, 2)
    n1, p1, n2, p2 = rng.randint(2, 9), rng.randint(2, 15), rng.randint(2, 9), rng.randint(2, 15)
    total = n1 * p1 + n2 * p2
    q = f"{name} buys {n1} {g1} at ${p1} each and {n2} {g2} at ${p2} each. How many dollars does {name} spend?"
    return q, [f"{n1} × {p1} = {n1 * p1} and {n2} × {p2} = {n2 * p2}.", f"{n1 * p1} + {n2 * p2} = {total}."], total


def change(rng: random.Random) -> Worked:
    name = rng.choice(NAMES)
    _, goods = rng.choice(GOODS)
    n, price = rng.randint(2, 8), rng.randint(3, 12)
    cost = n * price
    bill = next(b for b in (20, 50, 100) if b > cost)
    q = f"{name} buys {n} {goods} at ${price} each and pays with a ${bill} bill. How many dollars of change come back?"
    return q, [f"The {goods} cost {n} × {price} = {cost} dollars.", f"{bill} - {cost} = {bill - cost}."], bill - cost


def two_leg_trip(rng: random.Random) -> Worked:
    v1, t1, v2, t2 = rng.randint(3, 12) * 10, rng.randint(1, 5), rng.randint(3, 12) * 10, rng.randint(1, 5)
    d = v1 * t1 + v2 * t2
    q = (
        f"A bus drives at {v1} km per hour for {t1} hours, then at {v2} km per hour for {t2} hours. "
        "How many kilometres does it travel in total?"
    )
    return q, [f"{v1} × {t1} = {v1 * t1} km and {v2} × {t2} = {v2 * t2} km.", f"{v1 * t1} + {v2 * t2} = {d}."], d


def joint_work(rng: random.Random) -> Worked:
    a, b, hours = rng.randint(3, 20), rng.randint(3, 20), rng.randint(2, 12)
    jobs = (a + b) * hours
    q = (
        f"One machine packs {a} boxes per hour and a second packs {b} boxes per hour. Working together, "
        f"how many hours do they need to pack {jobs} boxes?"
    )
    return q, [f"Together they pack {a} + {b} = {a + b} boxes per hour.", f"{jobs} ÷ {a + b} = {hours}."], hours


def age_sum(rng: random.Random) -> Worked:
    older, younger = _two_names(rng)
    y, d = rng.randint(4, 40), rng.randint(1, 15)
    s = 2 * y + d
    q = f"{older} is {d} years older than {younger}, and their ages add up to {s}. How old is {older}?"
    steps = [f"Twice {younger}'s age is {s} - {d} = {s - d}, so {younger} is {y}.", f"{older} is {y} + {d} = {y + d}."]
    return q, steps, y + d


def age_future(rng: random.Random) -> Worked:
    parent, child = _two_names(rng)
    c, m, k = rng.randint(2, 12), rng.randint(2, 5), rng.randint(2, 15)
    total = c * m + c + 2 * k
    q = f"{parent} is {m} times as old as {child}, who is {c}. What will their ages add up to in {k} years?"
    steps = [f"{parent} is {m} × {c} = {m * c} now.", f"In {k} years: ({m * c} + {k}) + ({c} + {k}) = {total}."]
    return q, steps, total


def discount(rng: random.Random) -> Worked:
    _, goods = rng.choice(GOODS)
    price, pct = rng.randint(2, 20) * 20, rng.randint(1, 10) * 5  # a multiple of 20 times a multiple of 5: exact
    off = price * pct // 100
    q = f"A set of {goods} costs ${price} and is on sale for {pct}% off. What is the sale price in dollars?"
    return q, [f"{pct}% of {price} is {off}.", f"{price} - {off} = {price - off}."], price - off


def percent_of(rng: random.Random) -> Worked:
    n, pct = rng.randint(2, 30) * 20, rng.randint(1, 19) * 5
    k = n * pct // 100
    q = f"Of the {n} students in a school, {pct}% walk to school. How many students walk to school?"
    return q, [f"{pct}% of {n} is {n} × {pct} ÷ 100 = {k}."], k


def handshakes(rng: random.Random) -> Worked:
    n = rng.randint(4, 40)
    h = n * (n - 1) // 2
    q = f"At a meeting of {n} people, everyone shakes hands with everyone else exactly once. How many handshakes?"
    return q, [f"Each pair shakes once: {n} × {n - 1} ÷ 2 = {h}."], h


def multiples(rng: random.Random) -> Worked:
    a, b = rng.sample([2, 3, 4, 5, 6, 7, 9, 10, 11], 2)
    n = rng.randint(30, 300)
    lcm = a * b // math.gcd(a, b)
    count = n // a + n // b - n // lcm
    q = f"How many whole numbers from 1 to {n} are divisible by {a} or by {b} (or both)?"
    steps = [f"Multiples of {a}: {n // a}; of {b}: {n // b}; of both (of {lcm}): {n // lcm}.",
             f"{n // a} + {n // b} - {n // lcm} = {count}."]  # fmt: skip
    return q, steps, count


def heads_and_legs(rng: random.Random) -> Worked:
    cows, hens = rng.randint(1, 30), rng.randint(1, 30)
    heads, legs = cows + hens, 4 * cows + 2 * hens
    q = f"A farm has only hens and cows: {heads} heads and {legs} legs in all. How many cows are there?"
    steps = [f"All hens would give {2 * heads} legs.", f"Each cow adds 2: ({legs} - {2 * heads}) ÷ 2 = {cows}."]
    return q, steps, cows


def range_sum(rng: random.Random) -> Worked:
    a = rng.randint(1, 50)
    b = a + rng.randint(4, 60)
    s = (a + b) * (b - a + 1) // 2
    q = f"What is the sum of all the whole numbers from {a} to {b}, inclusive?"
    return q, [f"There are {b - a + 1} numbers averaging ({a} + {b}) ÷ 2.", f"({a} + {b}) × {b - a + 1} ÷ 2 = {s}."], s


def officers(rng: random.Random) -> Worked:
    n = rng.randint(4, 25)
    q = f"A club of {n} members picks a president and a different treasurer. In how many ways can it do this?"
    return q, [f"{n} choices for president, then {n - 1} for treasurer: {n} × {n - 1} = {n * (n - 1)}."], n * (n - 1)


def leftovers(rng: random.Random) -> Worked:
    k = rng.randint(3, 12)
    n = k * rng.randint(3, 20) + rng.randint(1, k - 1)
    q = f"{n} students are split into as many full teams of {k} as possible. How many students are left over?"
    return q, [f"{n} = {k} × {n // k} + {n % k}."], n % k


def savings_weeks(rng: random.Random) -> Worked:
    name = rng.choice(NAMES)
    per_week, goal = rng.randint(5, 40), rng.randint(60, 600)
    weeks = -(-goal // per_week)
    q = f"{name} saves ${per_week} every week. After how many weeks will {name} first have at least ${goal}?"
    steps = [f"{goal} ÷ {per_week} is about {goal / per_week:.2f}, so round up.", f"{weeks} × {per_week} ≥ {goal}."]
    return q, steps, weeks


TEMPLATES: tuple[Template, ...] = (
    shopping_total, change, two_leg_trip, joint_work, age_sum, age_future, discount, percent_of,
    handshakes, multiples, heads_and_legs, range_sum, officers, leftovers, savings_weeks,
)  # fmt: skip


def generate_arith(n: int, seed: int) -> list[Problem]:
    """`n` distinct problems from a seeded mix of templates; a larger `n` extends a smaller one's list."""
    rng = random.Random(seed)
    problems: list[Problem] = []
    seen: set[str] = set()
    for _ in range(50 * n + 100):  # bounded: repeats are rare, but the loop must end
        if len(problems) == n:
            break
        question, steps, answer = rng.choice(TEMPLATES)(rng)
        if normalize_text(question) in seen:
            continue
        seen.add(normalize_text(question))
        solution = " ".join([*steps, f"The answer is {answer}."])
        pid = problem_id("arith", question)
        problems.append(Problem(pid, "arith", question, str(answer), AnswerKind.MATH, solution=solution))
    if len(problems) < n:
        raise ValueError(f"could only generate {len(problems)} distinct arith problems, not {n}")
    return problems
