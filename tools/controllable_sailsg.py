#!/usr/bin/env python3
"""Regenerates tests/fixtures/controllable_sailsg.json: sail-sg's V-Half and V-Min orders (their
"Pipeline Parallelism with Controllable Memory" generator), for tests/controllable_sailsg.rs,
which holds `zero_bubble(..., policy=v_half)` / `policy=v_min` to them op for op.

sail-sg's generator is run from its own source, not from a copy: pass the file holding its
`PipelineGraph` with `create_schedule` (its `zbv_greedy.py`), e.g. from a checkout of
github.com/sail-sg/zero-bubble-pipeline-parallelism:

    git show HEAD:megatron/core/pipeline_parallel/zerobubble/scheduler/zbv_greedy.py > /tmp/g.py
    python3 tools/controllable_sailsg.py /tmp/g.py > tests/fixtures/controllable_sailsg.json

For each schedule ('half', 'min') and size (P, M) the script runs `schedule_from_pattern` on the
schedule's stable pattern as `create_schedule` does, and records each rank's order of
(type, microbatch) in sail-sg's numbering (0 F chunk 0, 1 F chunk 1, 2 B chunk 1, 3 B chunk 0,
4 W chunk 1, 5 W chunk 0; chunk 0 = stage r, chunk 1 = stage 2P-1-r; their B is our I): in full
for the sizes of FULL, as a 64-bit FNV-1a digest of the text "t:mb t:mb ...|t:mb ..." (ranks
separated by '|') for the others, with sail-sg's own figures: its peak (`mem_of_stage`, chunk
activations held from F to W) and its longest per-rank span at unit costs. A size where their
generator raises is recorded with the error. Standard library only.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sailsg import load  # noqa: E402

FULL = [(2, 4), (3, 6), (4, 8), (4, 12), (5, 10), (8, 32)]
SWEEP = [(p, m) for p in (2, 3, 4, 5, 6, 7, 8, 16) for m in range(p, 8 * p + 1)]


def fnv1a(text):
    h = 0xCBF29CE484222325
    for byte in text.encode():
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def generate(graph_class, kind, p, m):
    graph = graph_class(p, m, kind, 1, 1, 1, 0)
    pattern = {"half": graph.stable_pattern_v_half, "min": graph.stable_pattern_v_min}[kind](p)
    span, starts, order = graph.schedule_from_pattern(pattern, m, [1] * 6, do_reorder=True)
    # Their own memory count, on the final slots (W lists per chunk merged into one).
    peak = 0
    for rank in range(p):
        slots = [list(t) for t in starts[rank][:4]]
        slots.append(sorted(starts[rank][4] + starts[rank][5]))
        peak = max(peak, graph.mem_of_stage([[int(x) for x in t] for t in slots]))
    text = "|".join(" ".join(f"{t}:{mb}" for t, mb in rank) for rank in order)
    return {"peak_chunks": peak, "span": span, "digest": fnv1a(text), "order": order}


def main(path):
    graph_class = load(path)
    out = {"source": "sail-sg zbv_greedy.py schedule_from_pattern (tools/controllable_sailsg.py)",
           "cases": []}
    for kind in ("half", "min"):
        for p, m in SWEEP:
            case = {"kind": kind, "ranks": p, "microbatches": m}
            try:
                result = generate(graph_class, kind, p, m)
            except Exception as error:  # their generator fails at this size
                case["error"] = f"{type(error).__name__}: {error}"
            else:
                case.update(peak_chunks=result["peak_chunks"], span=result["span"],
                            digest=result["digest"])
                if (p, m) in FULL:
                    case["order"] = [[[t, mb] for t, mb in rank] for rank in result["order"]]
            out["cases"].append(case)
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
