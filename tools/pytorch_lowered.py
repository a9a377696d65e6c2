#!/usr/bin/env python3
"""Writes PyTorch's own lowered schedules (its `compute_comms` CSV dumps) into OUTDIR, for
tests/pytorch_lowered.rs, which holds `pipeweave check` to accepting every one of them.

Usage: python3 tools/pytorch_lowered.py OUTDIR          (needs torch; no process group)

For each of the seven schedule classes of `torch.distributed.pipelining` (GPipe, 1F1B,
Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) at P in {2, 4}
ranks and every M from P to 3P microbatches, on every rank's view:
- the multi-stage classes are constructed as PyTorch's users construct them (their constructors
  build the compute order and lower it with `_prepare_schedule_with_comms`: UNSHARD/RESHARD,
  REDUCE_GRAD/WAIT_REDUCE_GRAD, sends, receives and their waits), with stand-in stage objects that
  carry the indices the constructors read, and dumped with their own `_dump_csv`;
- GPipe and 1F1B run one stage per rank in their own `_step_microbatches`, which has no lowered
  form. Their order is recorded by running that very method with a recording stand-in for the
  stage (every compute call noted, every communication call answered with nothing to post), then
  lowered and dumped by `_PipelineScheduleRuntime`, as a user who wants their lowered form does.
  (`Schedule1F1B._get_pipeline_order` is not used: in torch 2.15 it names microbatches 1..M on the
  last rank instead of 0..M-1, and PyTorch's own validation refuses it.)
Sizes a class refuses (its constructor raises) are listed in OUTDIR/index.json with the reason.
"""

import json
import os
import sys
import types

import torch
from torch.distributed.pipelining import schedules as S

RANKS = (2, 4)
LOOP, V = "loop", "v"
# (class, stages per rank, placement)
MULTI = [
    (S.ScheduleInterleaved1F1B, 2, LOOP),
    (S.ScheduleLoopedBFS, 2, LOOP),
    (S.ScheduleInterleavedZeroBubble, 2, LOOP),
    (S.ScheduleZBVZeroBubble, 2, V),
    (S.ScheduleDualPipeV, 2, V),
]
SINGLE = [S.ScheduleGPipe, S.Schedule1F1B]


def stand_in(index, stages, ranks, rank):
    """What the schedule constructors read of a stage."""
    return types.SimpleNamespace(
        stage_index=index,
        num_stages=stages,
        group_size=ranks,
        group_rank=rank,
        is_first=index == 0,
        is_last=index == stages - 1,
        submod=torch.nn.Linear(1, 1),
    )


def stage_indices(rank, ranks, per_rank, placement):
    if placement == LOOP:
        return [rank + k * ranks for k in range(per_rank)]
    return [rank, 2 * ranks - 1 - rank]


class Recorder:
    """A stage that records the compute calls of a single-stage schedule and posts nothing."""

    def __init__(self, index, stages, ranks):
        self.stage_index = index
        self.num_stages = stages
        self.group_size = ranks
        self.group_rank = index
        self.is_first = index == 0
        self.is_last = index == stages - 1
        self.submod = torch.nn.Linear(1, 1)
        self.actions = []

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.actions.append(S._Action(self.stage_index, S.FORWARD, mb))

    def backward_one_chunk(self, mb, *args, full_backward=True, **kwargs):
        kind = S.FULL_BACKWARD if full_backward else S.BACKWARD_INPUT
        self.actions.append(S._Action(self.stage_index, kind, mb))

    def backward_weight_one_chunk(self, mb, *args, **kwargs):
        self.actions.append(S._Action(self.stage_index, S.BACKWARD_WEIGHT, mb))

    def __getattr__(self, name):
        # Communication and bookkeeping calls: nothing to post, nothing to wait for.
        return lambda *args, **kwargs: []


def single_order(cls, ranks, microbatches):
    """The compute order `cls._step_microbatches` runs on every rank."""
    order = {}
    for rank in range(ranks):
        stage = Recorder(rank, ranks, ranks)
        schedule = cls(stage, microbatches)
        schedule._initialize_stage = lambda *args, **kwargs: None
        schedule._step_microbatches(
            arg_mbs=[()] * microbatches, kwarg_mbs=[{}] * microbatches
        )
        order[rank] = stage.actions
    return order


def dump_single(cls, ranks, microbatches, path):
    order = single_order(cls, ranks, microbatches)
    # Any rank's runtime lowers every rank's row.
    runtime = S._PipelineScheduleRuntime([stand_in(0, ranks, ranks, 0)], microbatches)
    runtime._prepare_schedule_with_comms(order)
    runtime._dump_csv(path)


def dump_multi(cls, per_rank, placement, ranks, microbatches, path):
    # Every rank's constructor lowers every rank's row; rank 0's view is the file.
    stages = ranks * per_rank
    own = [stand_in(i, stages, ranks, 0) for i in stage_indices(0, ranks, per_rank, placement)]
    schedule = cls(own, microbatches)
    schedule._dump_csv(path)


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    written, refused = [], []
    jobs = [(cls, 1, LOOP) for cls in SINGLE] + MULTI
    for cls, per_rank, placement in jobs:
        for ranks in RANKS:
            for microbatches in range(ranks, 3 * ranks + 1):
                name = f"{cls.__name__}_pp{ranks}_m{microbatches}.csv"
                path = os.path.join(outdir, name)
                try:
                    if per_rank == 1:
                        dump_single(cls, ranks, microbatches, path)
                    else:
                        dump_multi(cls, per_rank, placement, ranks, microbatches, path)
                    written.append(name)
                except Exception as error:  # the class refuses this size
                    if os.path.exists(path):
                        os.remove(path)
                    reason = str(error).strip().splitlines()[0]
                    refused.append({"file": name, "reason": reason})
    index = {
        "source": f"torch {torch.__version__} torch.distributed.pipelining, tools/pytorch_lowered.py",
        "written": written,
        "refused": refused,
    }
    with open(os.path.join(outdir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    print(f"{len(written)} files written, {len(refused)} sizes refused", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
