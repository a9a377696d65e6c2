#!/usr/bin/env python3
"""Regenerates tests/fixtures/group_block_sailsg.json: sail-sg's PipeOffload building block
(`GroupBuildingBlockScheduler` of group_interleaved_1f1b.py, Wan et al., "PipeOffload", ICML
2025) on the sizes tests/group_block_sailsg.rs holds `vpp(..., order=block)` to.

Their scheduler is run from its own source, not from a copy: pass the file, e.g. from a checkout
of github.com/sail-sg/zero-bubble-pipeline-parallelism

    git show HEAD:megatron/core/pipeline_parallel/zerobubble/scheduler/group_interleaved_1f1b.py \
        > /tmp/group_interleaved_1f1b.py
    python3 tools/group_block_sailsg.py /tmp/group_interleaved_1f1b.py \
        > tests/fixtures/group_block_sailsg.json

For each size (P ranks, M microbatches, C chunks, group g, their runtime's minimum group
`(P + 1) // 2`, no recomputation) the fixture holds every rank's order in action notation
(`{stage}F{mb}`, `{stage}B{mb}` with stage `chunk * P + rank`; their W, which the block puts right
after its B, is left out), their schedule's length in slots (`slots`: each of F, B, W one slot,
so at F = I = W = 1 per rank share it lasts `slots / C`) and their peak (`peak_chunks`:
activations of a chunk held from F until W, their `calculate_peak_memory`). Sizes where their
generator asserts are recorded as `"exists": false`. Standard library only.
"""

import contextlib
import io
import json
import sys

SIZES = [
    (p, m, c, g)
    for p in (2, 4, 8)
    for m in (p, 2 * p, 4 * p, 2 * p + 1)
    for c in (2, 3, 4)
    for g in range(1, p + 1)
]


def load(path):
    scope = {"__name__": "group_interleaved_1f1b"}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), scope)
    return scope["GroupBuildingBlockScheduler"]


def main(path):
    scheduler = load(path)
    out = []
    for p, m, c, g in SIZES:
        entry = {"ranks": p, "microbatches": m, "chunks": c, "group": g, "minimum_group": (p + 1) // 2}
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                schedule = scheduler(p, m, chunk_num=c, min_group_size=(p + 1) // 2, group_size=g).get_schedule()
        except AssertionError:
            out.append({**entry, "exists": False})
            continue
        orders = [
            [f"{n.chunk * p + rank}{n.type.value}{n.micro}" for n in row if not n.is_nan() and n.type.value != "W"]
            for rank, row in enumerate(schedule)
        ]
        out.append({
            **entry,
            "exists": True,
            "slots": len(schedule[0]),
            "peak_chunks": scheduler.calculate_peak_memory(schedule),
            "orders": orders,
        })
    json.dump(out, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
