#!/usr/bin/env python3
"""Writes tests/fixtures/seq1f1b_sailsg.json: sail-sg's Seq1F1B order (Sun et al., "Seq1F1B:
Efficient Sequence-Level Pipeline Parallelism for Large Language Model Training", NAACL 2025),
the fixtures issue 30's `seq_split` pass is held to.

Their scheduler is run from its own source, not from a copy: pass the file, e.g. from a checkout
of github.com/sail-sg/zero-bubble-pipeline-parallelism

    git show HEAD:megatron/core/pipeline_parallel/zerobubble/scheduler/seq1f1b.py > /tmp/seq1f1b.py
    python3 tools/seq1f1b_sailsg.py /tmp/seq1f1b.py > tests/fixtures/seq1f1b_sailsg.json

Their `create_schedule` reads the split count from Megatron's arguments (`num_seq_splits`) and
builds, per stage, a 1F1B order over (microbatch, split) units: a warm-up of
min(P - stage - 2 + k, M k) forwards, then one forward and one fused backward (their `BW`: input
and weight gradient together) at a time, each microbatch's splits backwarded last split first.
Megatron and their graph module are stubbed (the function reads nothing else). Each order is in
the notation `F{mb}.{split}` / `B{mb}.{split}`, one list per stage (one stage per rank).
Standard library only.
"""

import contextlib
import io
import json
import sys
import types

SIZES = [(p, m, k) for p in (2, 4, 8) for m in (p, 2 * p) for k in (2, 4)] + [
    # The general rule: odd sizes, fewer microbatches than ranks, 3 and 8 splits.
    (3, 5, 3), (4, 3, 2), (5, 7, 8), (8, 4, 3), (2, 1, 4), (6, 9, 2), (7, 14, 5),
]


class _Node:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class _Kind:
    """Their function kinds (an enum with a `value`)."""

    def __init__(self, value):
        self.value = value


def load(path, splits_box):
    """Their `create_schedule` from `path`, reading the split count from `splits_box[0]`."""
    graph = types.ModuleType("graph")
    graph.F, graph.BW = _Kind("F"), _Kind("B")
    graph.GraphConfig = object
    graph.ScheduledNode = _Node
    training = types.ModuleType("training")
    training.get_args = lambda: types.SimpleNamespace(num_seq_splits=splits_box[0])
    names = "megatron.core.pipeline_parallel.zerobubble.scheduler.graph".split(".")
    for k in range(1, len(names)):
        sys.modules.setdefault(".".join(names[:k]), types.ModuleType(names[k - 1]))
    sys.modules[".".join(names)] = graph
    sys.modules["megatron.training"] = training
    scope = {"__name__": "seq1f1b"}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), scope)
    return scope["create_schedule"]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    splits_box = [1]
    create_schedule = load(sys.argv[1], splits_box)
    cases = []
    for p, m, k in SIZES:
        splits_box[0] = k
        with contextlib.redirect_stdout(io.StringIO()):
            orders = create_schedule(types.SimpleNamespace(n_stages=p, n_micro=m))
        cases.append({
            "ranks": p,
            "microbatches": m,
            "splits": k,
            "orders": [[f"{n.type.value}{n.microbatch}.{n.seq_split_idx}" for n in stage] for stage in orders],
        })
    json.dump({"source": "sail-sg zero-bubble-pipeline-parallelism scheduler/seq1f1b.py", "cases": cases},
              sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
