#!/usr/bin/env python3
"""Regenerates tests/fixtures/zbv_sailsg.json: sail-sg's ZB-V figures on the configurations that
tests/zbv_quality.rs holds our ZB-V to.

sail-sg's scheduler is run from its own source, not from a copy: pass the file(s) holding its
`PipelineGraph.try_v_schedule`, e.g. from a checkout of github.com/sail-sg/zero-bubble-pipeline-
parallelism

    git show arxiv:megatron/core/pipeline_parallel/v_schedule.py > /tmp/v_arxiv.py
    git show main:megatron/core/pipeline_parallel/zerobubble/scheduler/zbv.py > /tmp/v_main.py
    python3 tools/zbv_sailsg.py arxiv=/tmp/v_arxiv.py main=/tmp/v_main.py \
        > tests/fixtures/zbv_sailsg.json

(`arxiv` is the version behind the paper's ZB-V table, `efficiency.arxiv_bubble_rates`; `main` the
one their runtime uses, equal to release v0.1.0.) For each configuration the script runs the
search their runtime runs (`try_v_schedule` for the four fill_b x fill_f settings, each retried
with its bubbles as the approved ones; the least bubble wins) and replays the resulting orders in
an independent as-early-as-possible simulator with the cost model of ../shared/reference/README.md
(costs of a rank's whole share, each of the two chunks costing half; `comm` a latency on every
edge between two ranks). Standard library only.

Figures per version: `makespan` (the last op's end), `max_span` (longest first-start-to-last-end
of a rank, the paper's bubble is measured on it), `bubble_rate` ((max_span - busy) / max_span),
`peak` (the largest per-rank count of activations held from F until W, in units of a rank's whole
share, i.e. (stage, microbatch) pairs / 2: pipeweave's default memory model) and `peak_own_model`
(the same under the model sail-sg's scheduler was run with: I frees all but the weight-gradient
part `w_fraction`). sail-sg's memory limit is their default, 2P chunk activations = P shares.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sailsg import load  # noqa: E402
from collections import deque

# The paper's memory model for the 6.2B row (h=4096, a=32, s=1024): M_B = 34h + 5as, M_W = 32h.
H, A, S = 4096, 32, 1024
MEM_F = 34 * H + 5 * A * S
MEM_W = 32 * H


# The arXiv paper's ZB-V rows (efficiency.arxiv_bubble_rates): p, m, and per-chunk T_F, T_B
# (input gradient), T_W, T_comm in microseconds.
ARXIV_ROWS = (
    (16, 48, 14407, 14380, 9676, 1610),
    (16, 64, 14412, 14393, 9688, 1621),
    (16, 128, 14316, 14306, 9639, 1619),
    (24, 72, 6763, 6969, 5251, 755),
    (24, 96, 6783, 6984, 5259, 758),
    (24, 192, 6785, 6990, 5260, 770),
    (32, 96, 9458, 9748, 7288, 879),
    (32, 128, 9469, 9744, 7306, 892),
    (32, 256, 9447, 9644, 7193, 887),
)


def their_orders(graph_class, p, m, chunk_costs, comm):
    """The winning per-rank orders [(cat, chunk, mb)] of sail-sg's search (cat 0 F, 1 B, 2 W;
    chunk 0 = stage r, 1 = stage 2P-1-r: their backwards number chunks the other way round)."""
    f, b, w = chunk_costs
    graph = graph_class(p, m, f, b, w, comm, MEM_F, -(MEM_F - MEM_W), -MEM_W)
    best = None
    for fill_b in (True, False):
        for fill_f in (True, False):
            schedule, _, bubble = graph.try_v_schedule(fill_f=fill_f, fill_b=fill_b)
            if best is None or bubble < best[1]:
                best = (schedule, bubble)
    return [[(cat, chunk if cat == 0 else 1 - chunk, mb) for cat, chunk, mb in order]
            for order in best[0]]


def stage_of(p, rank, chunk):
    return rank if chunk == 0 else 2 * p - 1 - rank


def replay(p, m, orders, chunk_costs, comm):
    """As-early-as-possible times of every rank's order; returns per rank (busy, start, end)."""
    done = {}  # (cat, stage, mb) -> end time
    position = [0] * p
    clock = [0.0] * p
    first = [None] * p
    busy = [0.0] * p
    total = sum(len(o) for o in orders)
    finished = 0
    while finished < total:
        progressed = False
        for r in range(p):
            while position[r] < len(orders[r]):
                cat, chunk, mb = orders[r][position[r]]
                stage = stage_of(p, r, chunk)
                deps = []
                if cat == 0 and stage > 0:
                    deps.append((0, stage - 1, mb))
                if cat == 1:
                    deps.append((0, stage, mb))
                    if stage < 2 * p - 1:
                        deps.append((1, stage + 1, mb))
                if cat == 2:
                    deps.append((1, stage, mb))
                ready = clock[r]
                blocked = False
                for d in deps:
                    if d not in done:
                        blocked = True
                        break
                    other = d[1] if d[1] < p else 2 * p - 1 - d[1]
                    ready = max(ready, done[d] + (comm if other != r else 0.0))
                if blocked:
                    break
                end = ready + chunk_costs[cat]
                done[(cat, stage, mb)] = end
                if first[r] is None:
                    first[r] = ready
                clock[r] = end
                busy[r] += chunk_costs[cat]
                position[r] += 1
                finished += 1
                progressed = True
        if not progressed:
            raise RuntimeError("sail-sg's orders deadlock")
    return [(busy[r], first[r], clock[r]) for r in range(p)]


def peaks(orders, w_fraction):
    """Per rank peak held activations (units of a rank's share) with I freeing 1 - w_fraction."""
    out = []
    for order in orders:
        held, peak = 0.0, 0.0
        for cat, _, _ in order:
            held += [1.0, -(1.0 - w_fraction), -w_fraction][cat] / 2.0
            peak = max(peak, held)
        out.append(peak)
    return out


def figures(graph_class, config):
    p, m, comm = config["ranks"], config["microbatches"], config["costs"]["comm"]
    c = config["costs"]
    chunk_costs = (c["F"] / 2.0, c["I"] / 2.0, c["W"] / 2.0)
    try:
        orders = their_orders(graph_class, p, m, chunk_costs, comm)
    except AssertionError:
        return None  # this version cannot schedule the configuration (asserts in its warm-up)
    times = replay(p, m, orders, chunk_costs, comm)
    busy = times[0][0]
    max_span = max(end - start for _, start, end in times)
    return {
        "makespan": max(end for _, _, end in times),
        "max_span": max_span,
        "bubble_rate": (max_span - busy) / max_span,
        "peak": max(peaks(orders, 1.0)),
        "peak_own_model": max(peaks(orders, MEM_W / MEM_F)),
    }


def configs():
    unit = {"F": 1.0, "I": 1.0, "W": 1.0}
    paper6b = {"F": 1.0, "I": 0.9874505066774042, "W": 0.6553251459633581}
    out = [{"name": "unit_p4_m8", "ranks": 4, "microbatches": 8, "costs": dict(unit, comm=0.0)}]
    for m in (8, 10, 12, 16, 24):
        for comm in (0.0, 0.1, 1.0):
            out.append({"name": f"unit_p8_m{m}_comm{comm:g}", "ranks": 8, "microbatches": m,
                        "costs": dict(unit, comm=comm)})
        for comm in (0.0, 0.01936111670357694):
            out.append({"name": f"paper6b_p8_m{m}_comm{comm:.3g}", "ranks": 8,
                        "microbatches": m, "costs": dict(paper6b, comm=comm)})
    # The arXiv paper's ZB-V rows; a rank's share (two chunks) costs twice a chunk.
    for p, n, f, b, w, c in ARXIV_ROWS:
        out.append({"name": f"arxiv_p{p}_m{n}", "ranks": p, "microbatches": n,
                    "costs": {"F": 2.0 * f, "I": 2.0 * b, "W": 2.0 * w, "comm": float(c)}})
    return out


def main(argv):
    versions = [a.split("=", 1) for a in argv[1:]]
    if not versions or any(len(v) != 2 for v in versions):
        sys.exit("usage: zbv_sailsg.py NAME=PATH_TO_SAILSG_V_SCHEDULE.py [NAME=PATH ...]")
    classes = [(name, load(path)) for name, path in versions]
    rows = []
    for config in configs():
        row = dict(config)
        row["sailsg"] = {name: figures(cls, config) for name, cls in classes}
        rows.append(row)
        print(config["name"], {k: v and round(v["makespan"], 6) for k, v in row["sailsg"].items()},
              file=sys.stderr)
    json.dump({
        "name": "zbv_sailsg",
        "source": "sail-sg/zero-bubble-pipeline-parallelism PipelineGraph.try_v_schedule, "
                  "best of fill_b x fill_f as in get_v_schedule/create_schedule; versions: "
                  + ", ".join(name for name, _ in versions),
        "generated_by": "tools/zbv_sailsg.py (see its docstring)",
        "checked_by": "tests/zbv_quality.rs: zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)) at "
                      "its default memory limit has a makespan and a max_span no larger than "
                      "each version's and a peak no larger than min(peak, peak_own_model)",
        "units": "costs of a rank's whole share (each of its two chunks costs half), comm a "
                 "latency per cross-rank edge; peaks in units of a rank's whole share",
        "memory_model_of_their_scheduler": {"M_B": MEM_F, "M_W": MEM_W,
                                            "limit": "2P chunk activations (their default)"},
        "configs": rows,
    }, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv)
