"""Math domain: procedural arithmetic and two-step word problems over five difficulty levels.

Levels (calibrated for a ~1M-parameter character-level policy, DESIGN §12; warm greedy accuracy):
  1 near   a±b, 10<=a<=99, 1<=b<=9           10% of the mix, 0.27 warm (off by a few units)
  2 add    a+b, two 2-digit numbers           the learnable middle band, 0.60 warm (always-right groups)
  3 sub    a-b, two 2-digit numbers, a>=b     the learnable middle band, 0.54 warm
  4 hard   3-digit + 3-digit, or 2-digit x 1  ~0.01: always-wrong groups
  5 word   two-step word problem, worked in two lines, then a required "Answer: N" line: ~0.01

Levels 1-4 are answered bare ("57+8=" -> "65"); level 5 must end with the line "Answer: N",
which is also why its completions are ~25 characters long: a careless completion-length limit
truncates exactly these. Splits are assigned by a hash of the normalised prompt (15% dev, 15%
test, 70% train), so they are disjoint by construction; dev/test draw fixed quotas per level.
"""

from __future__ import annotations

import random
import re
from functools import cache

from evotrainer.trainer.domains.base import Task, split_of

LEVEL_WEIGHTS = {1: 0.10, 2: 0.40, 3: 0.25, 4: 0.10, 5: 0.15}
EVAL_SIZE = 2000  # dev and test each: large enough to see effects of a few points (DESIGN §7)
_POOL_SEED = 1234  # the candidate pools of the large levels are fixed, whatever the run seed

_NAMES = ["Tom", "Ana", "Sam", "Lea", "Max", "Ivy", "Ben", "Zoe", "Raj", "Kim"]
_OBJECTS = ["apples", "coins", "books", "cards", "shells", "pens", "stamps", "eggs"]
_WORD_TEMPLATES = [  # short on purpose: prompt length is most of the compute of a char-level policy
    ("{n} has {a} {o}, buys {b}, gives away {c}. How many now?", "+-"),
    ("{n} had {a} {o}, lost {b}, found {c}. How many now?", "-+"),
    ("A box has {a} {o}. {n} adds {b}, takes {c}. How many left?", "+-"),
    ("{n} has {a} {o}, gets {b}, then {c} more. How many now?", "++"),
]
_ANSWER_LINE = re.compile(r"Answer:\s*(-?\d+)\s*$")
_BARE = re.compile(r"\s*(-?\d+)\s*")



def _arith(level: int, a: int, op: str, b: int) -> Task:
    prompt = f"{a}{op}{b}="
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return Task(id=f"L{level}:{prompt}", prompt=prompt, answer=str(value), difficulty=level, fmt="bare",
                target=str(value))


def _word(template: str, ops: str, name: str, obj: str, a: int, b: int, c: int) -> Task:
    prompt = template.format(n=name, o=obj, a=a, b=b, c=c) + "\n"
    mid = a + b if ops[0] == "+" else a - b
    ans = mid + c if ops[1] == "+" else mid - c
    target = f"{a}{ops[0]}{b}={mid}\n{mid}{ops[1]}{c}={ans}\nAnswer: {ans}"
    return Task(id=f"L5:{prompt.strip()}", prompt=prompt, answer=str(ans), difficulty=5, fmt="tagged",
                target=target)


@cache
def _level_pool(level: int) -> tuple[Task, ...]:
    """Every task of a small level, or a fixed large sample of a big one."""
    if level == 1:
        return tuple(_arith(1, a, op, b) for a in range(10, 100) for b in range(1, 10) for op in "+-")
    if level == 2:
        return tuple(_arith(2, a, "+", b) for a in range(10, 100) for b in range(10, 100))
    if level == 3:
        return tuple(_arith(3, a, "-", b) for a in range(10, 100) for b in range(10, a + 1))
    rng = random.Random(_POOL_SEED + level)
    seen: dict[str, Task] = {}
    while len(seen) < 24_000:
        if level == 4:
            if rng.random() < 0.6:
                t = _arith(4, rng.randint(100, 999), "+", rng.randint(100, 999))
            else:
                t = _arith(4, rng.randint(10, 99), "*", rng.randint(2, 9))
        else:
            template, ops = rng.choice(_WORD_TEMPLATES)
            a, b, c = rng.randint(12, 60), rng.randint(2, 30), rng.randint(1, 9)
            if ops[0] == "-":
                b = rng.randint(2, a - 2)
            t = _word(template, ops, rng.choice(_NAMES), rng.choice(_OBJECTS), a, b, c)
        seen.setdefault(t.prompt, t)
    return tuple(seen.values())


@cache
def _split_pool(level: int, split: str) -> tuple[Task, ...]:
    return tuple(t for t in _level_pool(level) if split_of(t.prompt) == split)


class MathDomain:
    name = "math"
    max_new_tokens = 40  # the longest worked answer is ~28 characters

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        """dev/test: the fixed evaluation set (first n of it); train: n tasks sampled with `seed`."""
        if split in ("dev", "test"):
            out: list[Task] = []
            for level, w in LEVEL_WEIGHTS.items():
                pool = list(_split_pool(level, split))
                random.Random(f"{split}-{level}").shuffle(pool)
                quota = round(EVAL_SIZE * w)
                if len(pool) < quota:
                    raise RuntimeError(f"math level {level} has only {len(pool)} {split} tasks, needs {quota}")
                out.extend(pool[:quota])
            random.Random(f"{split}-order").shuffle(out)
            return out[:n] if n else out
        if split != "train":
            raise ValueError(f"unknown split {split!r}: expected one of train, dev, test")
        rng = random.Random(seed)
        levels, weights = list(LEVEL_WEIGHTS), list(LEVEL_WEIGHTS.values())
        pools = {lvl: _split_pool(lvl, "train") for lvl in levels}
        # one draw after the other, so the first n tasks of a seed do not depend on n
        return [rng.choice(pools[rng.choices(levels, weights)[0]]) for _ in range(n or 10_000)]

    def parse(self, completion: str, fmt: str) -> str | None:
        if fmt == "tagged":
            m = _ANSWER_LINE.search(completion)
        else:
            m = _BARE.fullmatch(completion)
        return str(int(m.group(1))) if m else None

    def score(self, completion: str, answer: str, fmt: str) -> bool:
        return self.parse(completion, fmt) == answer
