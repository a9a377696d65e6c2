#!/usr/bin/env python3
"""Regenerates tests/fixtures/pipeoffload_sailsg.json: sail-sg's PipeOffload schedules (Wan et al.,
"PipeOffload: Improving Scalability of Pipeline Parallelism with Memory Optimization", ICML 2025)
over the paper's grid, each replayed by an independent simulator that models the host link.

sail-sg's generator is run from its own source, not from a copy: pass the folder holding their
scheduler package, e.g. from a checkout of github.com/sail-sg/zero-bubble-pipeline-parallelism (the
fixture was made at main = 39f2c186, "Amend offload schedule error message (#69)"):

    mkdir -p /tmp/po && git -C zero-bubble-pipeline-parallelism archive HEAD \
        megatron/core/pipeline_parallel/zerobubble/scheduler | tar -x -C /tmp/po
    python3 tools/pipeoffload_sailsg.py /tmp/po/megatron/core/pipeline_parallel/zerobubble/scheduler 2 \
        > tests/fixtures/pipeoffload_sailsg.json

(the last argument: worker processes; the output does not depend on it; about 20 minutes of CPU).
Their graph.py, group_interleaved_1f1b.py, offloading.py, communication.py, passes.py and
basic1f1b.py are imported as their package `megatron.core.pipeline_parallel.zerobubble.scheduler`
(its __init__ is not run). Stubbed: the one import from outside it, `megatron.training.get_args`
(communication.py imports it and no pass run here calls it), and `passes.viz_node`, which only
builds the text of communication.py's assertion messages (eagerly, at every step: most of that
pass's time). Standard library only.

What is run is what their runtime runs (zerobubble/runtime.py, the "Interleaved pipeline" branch:
--num-layers-per-virtual-pipeline-stage with --interleave-group-size and --cpu-offload):

    config = GraphConfig.basic_config(f=1.0, b=1.0, w=1.0, n_stages=P, n_micro=M, max_chunks=C)
    order = group_interleaved_1f1b.create_schedule(config, cpu_offload=K > 0,
                recompute_granularity=None, ..., interleave_group_size=G, offload_chunk_num=K)
    order = passes.run_schedule_passes(config, order, offload_time=T/3 if K > 0 else None)

f, b, w are the times of one chunk's ops. Their --offload-time is one chunk's one-way transfer over
its F + B + W (add_offload: parallel_offload_time = max(f+b+w) * offload_time), so a transfer of
T/C forwards of a rank's whole share (this fixture's units) is offload_time = T/3; with f = 1 their
`round(.., 2)` of the transfer time is exact for every T here. run_schedule_passes is run pass by
pass: pre_validate, add_send_recv_peer_stage, add_time, add_offload for every point; its
communication passes (add_communication_nodes_without_sorting, validate_communication, which insert
and check the p2p nodes and move nothing else; quadratic, seconds to minutes a point) only for the
points on a frontier: one they reject is moved to `errors` and the frontier taken again.

Grid: P in {4, 8}; M in {2P, 4P}; T in {0.25, 0.5, 1, 2.24}; chunks C = 2..8 (their virtual
pipeline size; their example script has 3: 3P-2 layers padded, one layer per virtual stage; more
chunks keep lowering both figures, so the frontier depends on this cap); group G = 1..P
(--interleave-group-size; their README recommends ceil(P/2)..P, flagged `readme_group_range`;
larger values are reset to P by their code, 0 divides by zero); offloaded chunks K = 0..C
(--offload-chunk-num, chunk k < K offloaded; K = 0 is --cpu-offload off, where T plays no part:
t null, such a point counts for every t). Not swept: --recompute-granularity full (the generator's
other memory setting, exclusive with offload, adds R ops), --offload-overlap-sr (runtime only: two
streams for D2H and H2D; no pass reads it), cost_comm (0 in basic_config). Their code refuses a
point by an assertion (recorded in `errors`).

Ops, per rank in their issue order: F<mb>.<chunk>, B<mb>.<chunk> (their B: the input gradient,
pipeweave's I), W<mb>.<chunk>; O at their OFFLOAD_SEND_START (the D2H is enqueued), E at
OFFLOAD_SEND_END (offload_release: the compute stream waits for that D2H, then the device copy is
freed), L at OFFLOAD_RECV_PREP (prepare_resume allocates the device buffer on the compute stream and
records the event the H2D waits for; their RECV_START, the H2D's enqueue, comes later with no
transfer between them, so the link's order is kept). Chunk c of rank r is stage c*P + r.

The simulator (replay) runs each rank's order as early as possible, F = I = W = 1 for a rank's whole
share (each chunk's op 1/C), comm 0, each transfer T/C, one link per rank running the O and L ops
one at a time in order (their runtime puts D2H and H2D on one stream without --offload-overlap-sr):
- rules "runtime" (their runtime; `makespan`, `peak_units`): F, B, W one at a time in order after
  their dependencies (F after F of the previous stage, B after B of the next stage or its own F on
  the last stage, W after its B), a reloaded B after its L's end; an O once its F ended (the D2H
  waits for the F's save event) and the link is free; an E makes the compute stream wait for its
  O's end; an L once its O ended, the compute issued before it ended, and the link is free.
  Memory (units of one microbatch's activations of a rank's whole share, a chunk's 1/C): held from
  the F's start to the W's end; an offloaded chunk leaves at its E and is back at its L's
  allocation (the end of the compute issued before the L); at equal times frees go first. This is
  their own count (offloading.get_peak_memory: F +1, SEND_END -1, RECV_PREP +1, W -1).
- rules "pipeweave" (`pw_makespan`, `pw_peak_units`): pipeweave_core's replay and peak on the order
  without E: O and L issued after the compute before them, a forward after every O before it,
  memory counted along the order.
Their own figures: `their_makespan` (last compute end of their timeline: one slot per chunk op for
G = 1, their add_time's as-early-as-possible times otherwise; their offload pass never moves a
compute) and `their_peak` (max of get_peak_memory over ranks, over C). Not modelled: their pairing
of ranks 2i, 2i+1 (planned together; a paired barrier makes the two ranks' transfers take turns)
and their 0.7 x T for a warm-up transfer with no peer transfer: every transfer takes T/C here.

Orders are kept for the (makespan, peak_units) Pareto frontier of each (p, m, t) (of equal pairs
the first in grid order) and for `checks` (the issue's figures: 3 chunks, all offloaded, G = P,
M = 4P); other points keep their figures only. `summary`: per (p, m, t) the least peak reached.
"""

import contextlib
import importlib
import io
import json
import os
import sys
import types
from fractions import Fraction

PACKAGE = "megatron.core.pipeline_parallel.zerobubble.scheduler"
T_VALUES = ("0.25", "0.5", "1", "2.24")


def load(folder):
    """sail-sg's scheduler modules, imported from `folder` as their own package."""
    parts = PACKAGE.split(".")
    for k in range(1, len(parts)):
        name = ".".join(parts[:k])
        sys.modules.setdefault(name, types.ModuleType(name))
    package = types.ModuleType(PACKAGE)
    package.__path__ = [os.path.abspath(folder)]
    sys.modules[PACKAGE] = package
    training = types.ModuleType("megatron.training")

    def get_args():
        raise RuntimeError("get_args is stubbed: their scheduler should not need the runtime's args")

    training.get_args = get_args
    sys.modules["megatron.training"] = training
    names = ("graph", "group_interleaved_1f1b", "offloading", "communication", "passes", "basic1f1b")
    return types.SimpleNamespace(**{n: importlib.import_module(f"{PACKAGE}.{n}") for n in names})


def their_schedule(mods, p, m, chunks, group, offload_chunks, t, communication=False):
    """Their per-rank node lists, as the runtime's interleaved branch makes them: create_schedule,
    then run_schedule_passes' passes in its order (pre_validate, add_send_recv_peer_stage,
    add_time, add_offload; with `communication`, add_communication_nodes_without_sorting and
    validate_communication too, which insert and check the p2p nodes and move nothing else)."""
    passes = mods.passes
    config = mods.graph.GraphConfig.basic_config(f=1.0, b=1.0, w=1.0, n_stages=p, n_micro=m,
                                                 max_chunks=chunks)
    with contextlib.redirect_stdout(io.StringIO()):
        order = mods.group_interleaved_1f1b.create_schedule(
            config, cpu_offload=offload_chunks > 0, recompute_granularity=None,
            recompute_method=None, recompute_num_layers=None, interleave_group_size=group,
            offload_chunk_num=offload_chunks)
        passes.pre_validate(order)
        order = passes.add_send_recv_peer_stage(config, order)
        order = passes.add_time(config, order)
        if offload_chunks > 0:
            order = mods.offloading.add_offload(config, order, float(Fraction(t) / 3))
        if communication:
            lowered = mods.communication.add_communication_nodes_without_sorting(
                config, order, False)
            mods.communication.validate_communication(lowered)
    return order


def to_ops(mods, nodes):
    """Per rank ops "F3.1" etc. in their issue order (microbatch 3, chunk 1): F, B, W; O at their
    OFFLOAD_SEND_START, E at OFFLOAD_SEND_END, L at OFFLOAD_RECV_PREP (their RECV_START, the
    H2D's enqueue, comes later with no transfer between; OFFLOAD_RECV_END and OFFLOAD_BARRIER
    are dropped)."""
    ft = mods.graph.FuncType
    letter = {ft.F: "F", ft.B: "B", ft.W: "W", ft.OFFLOAD_SEND_START: "O",
              ft.OFFLOAD_SEND_END: "E", ft.OFFLOAD_RECV_PREP: "L"}
    out = []
    for rank in nodes:
        ops, prep = [], None
        for n in rank:
            if n.type == ft.OFFLOAD_RECV_PREP:
                prep = (n.microbatch, n.chunk)
            elif n.type in (ft.OFFLOAD_SEND_START, ft.OFFLOAD_RECV_START) and prep is not None:
                # the link order is the order of SEND_START and RECV_START
                assert n.type == ft.OFFLOAD_RECV_START and prep == (n.microbatch, n.chunk), \
                    "a transfer between a reload's RECV_PREP and its RECV_START"
                prep = None
            if n.type in letter:
                ops.append(f"{letter[n.type]}{n.microbatch}.{n.chunk}")
        out.append(ops)
    return out


def their_figures(mods, nodes, chunks):
    """Their own makespan (last compute end of their timeline) and peak (get_peak_memory), in
    this fixture's units."""
    ft = mods.graph.FuncType
    end = max(n.completion_time for rank in nodes for n in rank if n.type in (ft.F, ft.B, ft.W))
    peak = max(mods.offloading.get_peak_memory(nodes))
    return end / chunks, peak / chunks


def replay(p, chunks, orders, t, rules="runtime", trace=None):
    """As-early-as-possible replay of per-rank orders; returns (makespan, peak_units, per-rank
    peaks) as Fractions. Op kinds F, B, W, O, E, L and X (a fused B+W, for 1F1B).

    rules="runtime" (sail-sg's runtime): O starts once its F ended and the link is free; E makes
    the compute stream wait for its O's end and frees the chunk's activations then; L allocates at
    the compute stream's point (after the compute issued before it) and its transfer starts then,
    after its O, once the link is free; a B waits for its L's end. Memory over time.
    rules="pipeweave" (pipeweave_core::analysis::replay and peak, on the order without E): O and L
    are issued when the compute before them in the order has ended and start once the link is
    free; a forward waits for every O earlier in the order to have ended; a B waits for its L's
    end. Memory counted along the order: O frees at its place, L allocates at its place."""
    c = Fraction(1, chunks)
    link = Fraction(t) * c if t is not None else None
    cost = {"F": c, "B": c, "W": c, "X": 2 * c}
    n_stages = p * chunks
    parsed = []
    for r, order in enumerate(orders):
        ops = []
        for op in order:
            if rules == "pipeweave" and op[0] == "E":
                continue
            mb, chunk = op[1:].split(".")
            ops.append((op[0], int(mb), int(chunk) * p + r))
        parsed.append(ops)
    reloaded = {(r, mb, s) for r, ops in enumerate(parsed) for k, mb, s in ops if k == "L"}
    done = {}  # (kind, stage, mb) -> end
    pos = [0] * p
    compute_free = [Fraction(0)] * p
    link_free = [Fraction(0)] * p
    fence = [Fraction(0)] * p  # pipeweave: the latest end of the offloads issued so far
    events = [[] for _ in range(p)]  # (time, delta in chunk units)
    order_peak = [0] * p
    held = [0] * p
    remaining = sum(len(o) for o in parsed)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(parsed[r]):
                kind, mb, s = parsed[r][pos[r]]
                if kind in "FBWX":
                    deps = []
                    if kind == "F" and s > 0:
                        deps.append(("F", s - 1, mb))
                    if kind in "BX":
                        deps.append(("F", s, mb))
                        if s < n_stages - 1:
                            deps.append(("B", s + 1, mb))
                        if (r, mb, s) in reloaded:
                            deps.append(("L", s, mb))
                    if kind == "W":
                        deps.append(("B", s, mb))
                    if any(d not in done for d in deps):
                        break
                    start = max([compute_free[r]] + [done[d] for d in deps])
                    if kind == "F" and rules == "pipeweave":
                        start = max(start, fence[r])
                    end = start + cost[kind]
                    compute_free[r] = end
                    if kind == "X":
                        done[("B", s, mb)] = end
                    done[(kind, s, mb)] = end
                    if kind == "F":
                        events[r].append((start, 1))
                        held[r] += 1
                    if kind in "WX":
                        events[r].append((end, -1))
                        held[r] -= 1
                elif kind == "E":
                    start = end = max(compute_free[r], done[("O", s, mb)])
                    compute_free[r] = end
                    events[r].append((end, -1))
                else:
                    dep = ("F", s, mb) if kind == "O" else ("O", s, mb)
                    if dep not in done:
                        break
                    start = max(link_free[r], done[dep])
                    if kind == "L" or rules == "pipeweave":
                        start = max(start, compute_free[r])
                    end = start + link
                    link_free[r] = end
                    done[(kind, s, mb)] = end
                    if kind == "L":
                        events[r].append((compute_free[r] if rules == "runtime" else start, 1))
                        held[r] += 1
                    else:
                        fence[r] = max(fence[r], end)
                        held[r] -= 1
                        if rules == "pipeweave":
                            events[r].append((end, -1))
                order_peak[r] = max(order_peak[r], held[r])
                if trace is not None:
                    trace.append((r, start, end, parsed[r][pos[r]]))
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [parsed[r][pos[r]] for r in range(p) if pos[r] < len(parsed[r])]
            raise RuntimeError(f"orders deadlock at {stuck}")
    peaks = []
    for r, ev in enumerate(events):
        level = peak = 0
        for _, delta in sorted(ev):  # at equal times -1 sorts before +1
            level += delta
            peak = max(peak, level)
        peaks.append(Fraction(order_peak[r] if rules == "pipeweave" else peak, chunks))
    makespan = max(max(compute_free), max(link_free))
    return makespan, max(peaks), peaks


def baseline_1f1b(mods, p, m):
    """Their basic1f1b (the runtime's non-interleaved branch) replayed: fused B+W ops."""
    config = mods.graph.GraphConfig.basic_config(f=1.0, b=1.0, w=1.0, n_stages=p, n_micro=m,
                                                 max_chunks=1)
    with contextlib.redirect_stdout(io.StringIO()):
        nodes = mods.basic1f1b.create_schedule(config)
    orders = [[("F" if n.type == mods.graph.F else "X") + f"{n.microbatch}.0" for n in rank]
              for rank in nodes]
    makespan, peak, _ = replay(p, 1, orders, None)
    return {"p": p, "m": m, "schedule": "basic1f1b", "makespan": float(makespan),
            "peak_units": float(peak)}


def pareto(points):
    """The non-dominated points by (makespan, peak_units); of equal pairs the first."""
    keep, seen = [], set()
    for a in points:
        key = (a["makespan"], a["peak_units"])
        if key in seen:
            continue
        if not any(b["makespan"] <= key[0] and b["peak_units"] <= key[1]
                   and (b["makespan"], b["peak_units"]) != key for b in points):
            keep.append(a)
            seen.add(key)
    return sorted(keep, key=lambda x: (x["makespan"], x["peak_units"]))


def grid():
    for p in (4, 8):
        for m in (2 * p, 4 * p):
            for chunks in range(2, 9):
                for group in range(1, p + 1):
                    for k in range(0, chunks + 1):
                        for t in (T_VALUES if k > 0 else (None,)):
                            yield p, m, chunks, group, k, t


MODS = None


def point(config, communication=False):
    """One configuration: their schedule, its replays and their figures (or their error)."""
    p, m, chunks, group, k, t = config
    out = {"p": p, "m": m, "t": None if t is None else float(t), "chunks": chunks,
           "group": group, "offload_chunks": k, "_config": config,
           "readme_group_range": (p + 1) // 2 <= group <= p}
    try:
        nodes = their_schedule(MODS, p, m, chunks, group, k, t, communication)
    except Exception as error:  # their generator refuses it
        out["error"] = f"{type(error).__name__}: {error}"[:200]
        return out
    orders = to_ops(MODS, nodes)
    makespan, peak, per_rank = replay(p, chunks, orders, t)
    pw_makespan, pw_peak, _ = replay(p, chunks, orders, t, "pipeweave")
    their_makespan, their_peak = their_figures(MODS, nodes, chunks)
    out.update(makespan=float(makespan), peak_units=float(peak),
               peak_units_per_rank=[float(x) for x in per_rank],
               their_makespan=their_makespan, their_peak=their_peak,
               agree_makespan=abs(float(makespan) - their_makespan) < 1e-9,
               agree_peak=abs(float(peak) - their_peak) < 1e-9,
               pw_makespan=float(pw_makespan), pw_peak_units=float(pw_peak),
               lifetime="runtime", offloads=sum(op[0] == "O" for o in orders for op in o),
               orders=orders)
    return out


def init(folder):
    global MODS
    MODS = load(folder)
    # Their viz_node only builds the text of communication.py's assertion messages, eagerly, on
    # every step (most of that pass's time); the messages lose the nodes' names, nothing else.
    MODS.passes.viz_node = lambda node: f"{node.type.value}{node.microbatch}.{node.chunk}"


def main(folder, workers):
    init(folder)
    configs = list(grid())
    if workers > 1:
        import multiprocessing
        with multiprocessing.Pool(workers, init, (folder,)) as pool:
            results = pool.map(point, configs, chunksize=4)
    else:
        results = [point(c) for c in configs]
    points = [x for x in results if "error" not in x]
    errors = [x for x in results if "error" in x]
    for x in errors:
        print("their generator refuses", x, file=sys.stderr)

    def frontier_of(p, m, t):
        return pareto([x for x in points if x["p"] == p and x["m"] == m
                       and x["t"] in (None, float(t))])

    # The frontier points must also pass their communication pass (as in their runtime); one
    # that does not is marked and left out, and the frontier taken again.
    checked = {}
    frontier = []
    for p in (4, 8):
        for m in (2 * p, 4 * p):
            for t in T_VALUES:
                while True:
                    best = frontier_of(p, m, t)
                    failed = False
                    for x in best:
                        key = x["_config"]
                        if key not in checked:
                            again = point(key, communication=True)
                            checked[key] = again.get("error")  # cut to 200 characters
                            x["communication_pass"] = checked[key] or "ok"
                            print("communication pass", key, x["communication_pass"],
                                  file=sys.stderr)
                        if checked[key]:
                            points.remove(x)
                            x["frontier_excluded"] = True
                            errors.append(x)
                            failed = True
                    if not failed:
                        break
                for x in best:
                    x["keep_orders"] = True
                frontier.append({"p": p, "m": m, "t": float(t), "points": [
                    {k: x[k] for k in ("chunks", "group", "offload_chunks", "t", "makespan",
                                       "peak_units", "their_makespan", "their_peak",
                                       "pw_makespan", "pw_peak_units")} for x in best]})
    # The figures: their example setting (3 chunks, all offloaded, group P) at M = 4P.
    checks = []
    for x in points + errors:
        if x["chunks"] == 3 and x["offload_chunks"] == 3 and x["group"] == x["p"] \
                and x["m"] == 4 * x["p"]:
            x["keep_orders"] = "error" not in x
            checks.append({k: x[k] for k in ("p", "m", "t", "chunks", "group", "offload_chunks",
                                             "makespan", "peak_units", "their_makespan",
                                             "their_peak", "pw_makespan", "pw_peak_units",
                                             "error") if k in x})
    checks.sort(key=lambda x: (x["p"], x["t"]))
    # Per (p, m, t): the least peak reached, and the least peak with no time added to the
    # fastest no-offload schedule of the same chunks and group.
    summary = []
    fastest = {(x["p"], x["m"], x["chunks"], x["group"]): x["makespan"] for x in points
               if x["offload_chunks"] == 0}
    for p in (4, 8):
        for m in (2 * p, 4 * p):
            for t in T_VALUES:
                xs = [x for x in points if (x["p"], x["m"], x["t"]) == (p, m, float(t))]
                free = [x for x in xs if x["group"] > 1 and x["makespan"]
                        <= fastest[(p, m, x["chunks"], x["group"])] + 1e-9]
                row = {"p": p, "m": m, "t": float(t),
                       "least_peak_units": min((x["peak_units"] for x in xs), default=None),
                       "least_peak_units_no_time_added": min(
                           (x["peak_units"] for x in free), default=None),
                       "least_peak_units_3_chunks": min(
                           (x["peak_units"] for x in xs if x["chunks"] == 3), default=None)}
                summary.append(row)
    for x in points:
        if not x.pop("keep_orders", False):
            del x["orders"], x["peak_units_per_rank"]
    for x in errors:
        x.pop("orders", None)
        x.pop("peak_units_per_rank", None)
        x.pop("keep_orders", None)
    for x in points + errors:
        del x["_config"]
    json.dump({
        "name": "pipeoffload_sailsg",
        "source": "sail-sg/zero-bubble-pipeline-parallelism main 39f2c186: "
                  "group_interleaved_1f1b.create_schedule + passes.run_schedule_passes "
                  "(offloading.add_offload), as zerobubble/runtime.py's interleaved branch",
        "generated_by": "tools/pipeoffload_sailsg.py (see its docstring)",
        "units": "durations in forwards of a rank's whole share (F = I = W = 1; each of the C "
                 "chunks' ops 1/C); t: one transfer of a rank's whole share's activations of one "
                 "microbatch one way (a chunk's takes t/C); memory in units of one microbatch's "
                 "activations of a rank's whole share (a chunk's 1/C)",
        "ops": "per rank, in issue order: F<mb>.<chunk> forward, B<mb>.<chunk> input-gradient "
               "backward (sail-sg's B, pipeweave's I), W<mb>.<chunk> weight gradient, "
               "O<mb>.<chunk> offload (their OFFLOAD_SEND_START: the D2H is enqueued), "
               "E<mb>.<chunk> offload end (their OFFLOAD_SEND_END: the compute stream waits for "
               "that D2H and the device copy is freed), L<mb>.<chunk> reload (their "
               "OFFLOAD_RECV_PREP: the device buffer is allocated on the compute stream and the "
               "H2D follows); chunk c of rank r is stage c*P + r. Without the E ops: the order "
               "in pipeweave's terms (OFFLOAD at O, RELOAD at L)",
        "lifetime_models": {
            "runtime": "makespan, peak_units (their runtime's rules): a chunk's activations are "
                       "held from its F's start to its W's end; an offloaded one leaves at its E "
                       "(once its O has ended) and returns at its L's allocation (the end of the "
                       "compute issued before the L, when the H2D may start); frees first at "
                       "equal times. Their get_peak_memory counts the same along their order",
            "pipeweave": "pw_makespan, pw_peak_units: pipeweave's replay and peak rules on the "
                         "order without E (a forward waits for every offload earlier in the "
                         "order; O and L issued after the compute before them; memory counted "
                         "along the order, O freeing and L allocating at their places)"},
        "link_model": "one link per rank, transfers one at a time in list order, each t/C; O after "
                      "its F; L after its O and the compute issued before it; B after its L's "
                      "end; their pairing of ranks and 0.7x solo transfers not modelled",
        "their_settings": {"f": 1.0, "b": 1.0, "w": 1.0, "cost_comm": 0.0,
                           "offload_time": "t/3", "recompute_granularity": None,
                           "offload_overlap_sr": False},
        "swept": {"p": [4, 8], "m": "2p, 4p", "t": [float(t) for t in T_VALUES],
                  "chunks": list(range(2, 9)), "group": "1..p",
                  "offload_chunks": "0..chunks (0: no offload, t null, counts for every t)"},
        "baselines": [baseline_1f1b(MODS, p, m) for p in (4, 8) for m in (2 * p, 4 * p)],
        "checks": checks,
        "summary": summary,
        "frontier": frontier,
        "errors": errors,
        "points": points,
    }, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: pipeoffload_sailsg.py PATH_TO/megatron/core/pipeline_parallel/"
                 "zerobubble/scheduler [WORKERS]")
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 1)
