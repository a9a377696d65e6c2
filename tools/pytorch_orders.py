"""Per-rank compute orders of PyTorch's ScheduleInterleaved1F1B, written as fixtures for
tests/pytorch.rs (so that CI needs no torch).

Usage: python pytorch_orders.py OUTDIR
Needs torch (pip install torch); computes the orders the way the schedule's constructor does
(rounds = max(1, M // P), microbatches_per_round = M // rounds, one `_calculate_single_rank_operations`
per rank), without a process group.
"""
import json, sys
import torch
from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

SIZES = [(4, 6), (4, 10), (3, 5), (5, 12), (8, 12), (8, 20), (2, 3), (4, 8), (4, 16)]
CHUNKS = 2

def orders(p, m, chunks):
    s = object.__new__(ScheduleInterleaved1F1B)
    s.pp_group_size = p
    s.n_local_stages = chunks
    s._n_microbatches = m
    s.number_of_rounds = max(1, m // p)
    s.microbatches_per_round = m // s.number_of_rounds
    if m % s.number_of_rounds != 0:
        return None
    return [[str(a) for a in s._calculate_single_rank_operations(r) if a is not None] for r in range(p)]

for p, m in SIZES:
    order = orders(p, m, CHUNKS)
    if order is None:
        continue
    name = f"{sys.argv[1]}/interleaved1f1b_pp{p}_m{m}_v{CHUNKS}.json"
    with open(name, "w") as f:
        json.dump({"source": f"torch {torch.__version__} ScheduleInterleaved1F1B", "ranks": p,
                   "microbatches": m, "chunks": CHUNKS, "order": order}, f)
    print(name)
