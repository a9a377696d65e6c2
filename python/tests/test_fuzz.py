"""The API under random arguments: every call returns a plan or raises `pipeweave.Error` (or
`PassBug` for a pass that misbehaves); nothing else, and never a crash of the interpreter.
10,000 calls by default (PIPEWEAVE_FUZZ_CALLS), seeded, so a failure reproduces."""

import math
import os
import random

import pipeweave

CALLS = int(os.environ.get("PIPEWEAVE_FUZZ_CALLS", "10000"))

BASES = ["gpipe", "f1b(gpipe)", "vpp(f1b(gpipe), chunks=2)", "vpp(gpipe, chunks=3)",
         "vpp(f1b(gpipe), chunks=2, layout=v)", "dual(f1b(gpipe))", "vpp(f1b(gpipe), chunks=3, group=2)"]
WRAPS = ["zero_bubble({}, policy=h1)", "zero_bubble({})", "zero_bubble({}, policy=auto, memory={n})",
         "recompute({}, memory={n})", "offload({}, memory={n})", "dual({})", "f1b({})", "vpp({}, chunks={n})",
         "zero_bubble({}, policy=v_half)", "zero_bubble({}, policy=v_min)", "fuzzy({}, k={n})"]
NUMBERS = [0, 1, 2, 3, -1, 0.5, 1e300, float("nan"), float("inf"), 2**40, 7]
JUNK = ["", "(", ")", ",", "=", "f1b(", "gpipe)", "chunks=", "1e999", "é", "\x00", " ", "policy=", "~"]


class Fuzzy:
    """A Python pass that does one of several things, some of them wrong."""
    name = "fuzzy"
    changes = ("backwards", "pacing")

    def __init__(self, k=0):
        self.k = int(k) if isinstance(k, (int, float)) and math.isfinite(k) else 0

    def rewrite(self, plan):
        choice = self.k % 5
        if choice == 0:
            return plan.order
        if choice == 1:
            return list(reversed(plan.order))
        if choice == 2:
            return [order[::-1] for order in plan.order]
        if choice == 3:
            raise ZeroDivisionError("on purpose")
        return [[1, 2, None]]


def expression(rng):
    text = rng.choice(BASES)
    for _ in range(rng.randrange(3)):
        text = rng.choice(WRAPS).replace("{n}", repr(rng.choice(NUMBERS))).format(text)
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        at = rng.randrange(len(text) + 1)
        if rng.random() < 0.5:
            text = text[:at] + rng.choice(JUNK) + text[at:]
        else:
            text = text[:at] + text[at + rng.randrange(1, 4):]
    return text


def value(rng):
    return rng.choice(NUMBERS + ["4", None, True, [], {}, "2GiB", "lots", -0.0])


def kwargs(rng):
    out = {}
    if rng.random() < 0.3:
        keys = ["F", "I", "W", "B", "FB", "R", "offload", "comm", "X", 3]
        out["costs"] = {rng.choice(keys): value(rng) for _ in range(rng.randrange(4))}
    if rng.random() < 0.2:
        out["activation_memory"] = {rng.choice(["total", "weight_grad", "y"]): value(rng)
                                    for _ in range(rng.randrange(3))}
    if rng.random() < 0.2:
        out["memory_limit"] = value(rng)
    if rng.random() < 0.05:
        out["layers_per_stage"] = rng.choice([[1, 2], "x", [-1], None])
    if rng.random() < 0.05:
        out["recv"] = rng.choice(["early", "just-in-time", "late", 3])
    if rng.random() < 0.3:
        out["passes"] = [Fuzzy]
    return out


def sane(rng):
    """Arguments a user would give (a plan or a refused size or memory limit)."""
    text = rng.choice(BASES)
    if rng.random() < 0.6:
        text = rng.choice(WRAPS[:-1]).replace("{n}", str(rng.choice([1, 2, 3, 4, 6]))).format(text)
    args = {}
    if rng.random() < 0.3:
        args["costs"] = {"F": rng.choice([1, 2]), "I": 1, "W": rng.choice([0.5, 1]),
                         "comm": rng.choice([0, 0.1])}
    return rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 2, 4, 7, 8, 16]), text, args


def test_random_calls_raise_only_pipeweave_errors():
    rng = random.Random(20261203)
    outcomes = {"plan": 0, "error": 0, "bug": 0}
    for i in range(CALLS):
        if rng.random() < 0.4:
            ranks, microbatches, expr, args = sane(rng)
        else:
            ranks = rng.choice([1, 2, 3, 4, 4, 5, 8, 0, -2, 2.0, "3", None, 10**12])
            microbatches = rng.choice([1, 2, 4, 7, 8, 9, 16, 0, -1, 3.5, None, 10**12])
            expr = expression(rng) if rng.random() < 0.97 else rng.choice([None, 3, b"f1b(gpipe)", ["gpipe"]])
            args = kwargs(rng)
        try:
            if i % 500 == 499:
                pipeweave.tune(ranks=ranks, microbatches=microbatches, top=rng.choice([1, 3, 0]),
                               **{k: v for k, v in args.items() if k in ("costs", "memory_limit")})
            elif i % 250 == 3:
                pipeweave.check(rng.choice(["/nonexistent.csv", __file__, os.devnull, 3]))
            else:
                plan = pipeweave.plan(expr, ranks, microbatches, **args)
                assert math.isfinite(plan.makespan)
            outcomes["plan"] += 1
        except pipeweave.PassBug:
            outcomes["bug"] += 1
        except pipeweave.Error:
            outcomes["error"] += 1
        except BaseException as e:  # anything else is a defect: say which call
            raise AssertionError(f"call {i}: plan({expr!r}, {ranks!r}, {microbatches!r}, "
                                 f"**{args!r}) raised {type(e).__name__}: {e}") from e
    assert sum(outcomes.values()) == CALLS
    assert outcomes["plan"] > CALLS // 20, outcomes
    assert outcomes["error"] > CALLS // 20, outcomes
    print(outcomes)
