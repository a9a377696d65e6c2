#!/usr/bin/env python3
"""The `lazy_w` pass of examples/custom_pass.rs, written in Python and composed with the built-ins.

`lazy_w(schedule, memory=N)` splits every full backward into its input-gradient half (I), which
stays where the backward was, and its weight-gradient half (W), which it delays: a W waits in a
queue until the rank's held activations would otherwise exceed N before the next forward, or until
the rank's order ends. Its contract: one-forward-one-backward pacing with whole backwards in, and
only the orders and the backwards changed. The driver verifies what it returns and would blame it
by name (`pipeweave.PassBug`) if it broke a plan; `zero_bubble(lazy_w(f1b(gpipe)))` is refused
(backwards already split), as the built-ins refuse each other out of order.

Run: `pip install ./python && python examples/lazy_w.py` (prints the same table as
`cargo run --release --example custom_pass`).
"""

from collections import deque
import math
import os
import sys

import pipeweave


class LazyWeights:
    name = "lazy_w"
    requires = {"pacing": ["1f1b"], "whole_backwards": True}
    changes = ("backwards",)

    def __init__(self, memory=None):
        if memory is not None and not memory > 0:
            raise ValueError(f"memory = {memory} must be > 0")
        self.memory = memory

    def rewrite(self, plan):
        # The argument, else the plan's declared limit, else unbounded.
        bound = self.memory or plan.memory_limit or math.inf
        return [self.lazy_order(plan, rank, bound) for rank in range(plan.ranks)]

    @staticmethod
    def lazy_order(plan, rank, bound):
        held, queued, out = 0.0, deque(), []
        for text in plan.order[rank]:
            if text.startswith("("):
                raise ValueError("the plan overlaps forwards with backwards (a dual plan)")
            stage, kind, mb = pipeweave.parse_action(text)
            memory = plan.memory[stage]
            if kind == "F":
                while held + memory["total"] > bound + 1e-9 and queued:
                    s, m = queued.popleft()
                    held -= plan.memory[s]["weight_grad"]
                    out.append(f"{s}W{m}")
                held += memory["total"]
                out.append(text)
            elif kind == "B":
                held -= memory["total"] - memory["weight_grad"]
                queued.append((stage, mb))
                out.append(f"{stage}I{mb}")
            else:
                out.append(text)
        out.extend(f"{s}W{m}" for s, m in queued)
        return out


# The schedules compared, one a line (examples/custom_pass.rs compares the same).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "lazy_w_expressions.txt")) as f:
    EXPRESSIONS = f.read().splitlines()


def main():
    # Costs of the Zero Bubble paper's 1.5B model and activations of which a third is held until W.
    options = dict(
        ranks=4,
        microbatches=12,
        costs={"F": 18, "I": 18, "W": 9},
        activation_memory={"total": 1, "weight_grad": 0.34},
        passes=[LazyWeights],
    )
    print("4 ranks, 12 microbatches, F=18 I=18 W=9, a third of the activations held until W\n")
    print(f"{'expression':<44} {'makespan':>9} {'bubble':>8} {'peak memory':>12}")
    failed = False
    for expression in EXPRESSIONS:
        try:
            plan = pipeweave.plan(expression, **options)
        except pipeweave.Error as e:
            if expression.startswith("zero_bubble(lazy_w"):
                print(f"{expression:<44} refused: {e}")
                continue
            print(f"error: {expression}: {e}", file=sys.stderr)
            failed = True
            continue
        peak = max(plan.peak_activations_per_rank)
        print(f"{expression:<44} {plan.makespan:>9.1f} {plan.bubble_rate:>8.4f} {peak:>12.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
