#!/usr/bin/env python3
"""Exact optima of plain-layout pipeline schedules by a MILP solved with HiGHS (highspy).

An oracle for `zero_bubble(policy=optimal)` independent of pipeweave's code: one stage per rank,
each (stage, microbatch) pair's F, I and W with their dependencies (F down the ranks, I back up,
I after its own F, W after its own I), a latency `comm` on every hop between ranks, each rank
running one op at a time (a binary per pair of its ops), and activations held from F to W under a
per-rank cap K (after each F, the forwards begun minus the weight gradients done is at most K).
The makespan is minimised to optimality.

    tools/milp_optimum.py --ranks 4 --microbatches 8 --memory 3 [--costs 1,1,1,0.1]
    tools/milp_optimum.py --fixture tests/fixtures/milp_optima.json   # writes the golden cases

Needs `pip install highspy`.
"""
import argparse
import itertools
import json
import sys
import time

import highspy


def optimum(ranks, microbatches, f, i, w, comm, memory, time_limit=600.0):
    """The least makespan, or None when HiGHS does not prove it within the time limit."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 1e-6)
    dur = {"F": f, "I": i, "W": w}
    horizon = (f + i + w) * ranks * microbatches + 2 * ranks * comm + 1.0
    inf = highspy.kHighsInf
    start = {}
    for r in range(ranks):
        for m in range(microbatches):
            for k in "FIW":
                start[(k, r, m)] = h.addVariable(lb=0.0, ub=horizon)
    makespan = h.addVariable(lb=0.0, ub=horizon)
    h.changeColCost(makespan.index, 1.0)

    def after(later, earlier, gap):
        # later >= earlier + gap
        h.addRow(gap, inf, 2, [later.index, earlier.index], [1.0, -1.0])

    for r in range(ranks):
        for m in range(microbatches):
            F, I, W = (start[(k, r, m)] for k in "FIW")
            if r > 0:
                after(F, start[("F", r - 1, m)], f + comm)
            after(I, F, f)
            if r + 1 < ranks:
                after(I, start[("I", r + 1, m)], i + comm)
            after(W, I, i)
            after(makespan, W, w)
            after(makespan, I, i)
    for r in range(ranks):
        ops = [(k, r, m) for m in range(microbatches) for k in "FIW"]
        before = {}
        for a, b in itertools.combinations(ops, 2):
            y = h.addVariable(lb=0.0, ub=1.0)
            h.changeColIntegrality(y.index, highspy.HighsVarType.kInteger)
            before[(a, b)] = (y, 1.0)  # y = 1: a before b
            sa, sb = start[a], start[b]
            # sb >= sa + p_a - H (1 - y)  ->  sb - sa - H y >= p_a - H
            h.addRow(dur[a[0]] - horizon, inf, 3, [sb.index, sa.index, y.index], [1.0, -1.0, -horizon])
            # sa >= sb + p_b - H y  ->  sa - sb + H y >= p_b
            h.addRow(dur[b[0]], inf, 3, [sa.index, sb.index, y.index], [1.0, -1.0, horizon])

        def precedes(a, b):
            """(index, coefficient, constant): the 0/1 expression 'a runs before b'."""
            if (a, b) in before:
                return before[(a, b)][0].index, 1.0, 0.0
            return before[(b, a)][0].index, -1.0, 1.0

        if memory is not None:
            for m in range(microbatches):
                fm = ("F", r, m)
                idx, val, const = [], [], 1.0
                for other in range(microbatches):
                    if other == m:
                        continue
                    for kind, sign in (("F", 1.0), ("W", -1.0)):
                        j, c, k0 = precedes((kind, r, other), fm)
                        idx.append(j)
                        val.append(sign * c)
                        const += sign * k0
                h.addRow(-inf, memory - const + 1e-9, len(idx), idx, val)
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        return None
    return round(h.getInfo().objective_function_value, 4)


def fixture_cases():
    """The golden set: P 2-4, M P..2P (P 4: M 4), three cost sets, caps from 1 to unbounded
    (the disjunctive MILP proves these within a minute; P 4, M 8 takes HiGHS far longer)."""
    costs = [(1.0, 1.0, 1.0, 0.0), (1.0, 1.0, 1.0, 0.1), (1.0, 1.5, 0.5, 0.0)]
    for ranks in (2, 3, 4):
        sizes = {ranks, ranks + 2, 2 * ranks} if ranks < 4 else {ranks}
        for microbatches in sorted(sizes):
            for f, i, w, comm in costs:
                for memory in sorted({max(1, ranks // 2), ranks - 1, ranks, None} - {0}, key=lambda x: (x is None, x)):
                    yield ranks, microbatches, f, i, w, comm, memory


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int)
    parser.add_argument("--microbatches", type=int)
    parser.add_argument("--memory", type=float)
    parser.add_argument("--costs", default="1,1,1,0", help="F,I,W,comm")
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--fixture", help="write the golden cases to this JSON file")
    args = parser.parse_args()
    if args.fixture:
        cases = []
        for ranks, m, f, i, w, comm, memory in fixture_cases():
            t = time.time()
            best = optimum(ranks, m, f, i, w, comm, memory, args.time_limit)
            print(f"P={ranks} M={m} costs={f},{i},{w},{comm} K={memory}: {best} ({time.time() - t:.1f} s)", file=sys.stderr)
            if best is not None:
                cases.append({"ranks": ranks, "microbatches": m, "costs": [f, i, w, comm], "memory": memory, "optimum": best})
        with open(args.fixture, "w") as out:
            json.dump({"source": "tools/milp_optimum.py (HiGHS MILP, proven optimal)", "cases": cases}, out, indent=1)
            out.write("\n")
        return
    f, i, w, comm = (float(x) for x in args.costs.split(","))
    print(optimum(args.ranks, args.microbatches, f, i, w, comm, args.memory, args.time_limit))


if __name__ == "__main__":
    main()
