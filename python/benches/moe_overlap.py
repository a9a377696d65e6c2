"""One training step of a Mixtral-block model under DualPipeV three ways: PyTorch's own
`ScheduleDualPipeV`, `pwt.schedule` of DualPipeV with the runtime's sequential pairs, and the
same with `pwt.overlap` (the real overlap of the F;B pairs).

    python python/benches/moe_overlap.py [--ranks 2] [--expert-ranks 2] [--tokens replicated]
        [--hidden 64] [--seq 32] [--rows 2] [--layers 2] [--microbatches 8] [--rounds 5] [--steps 2]
        [--out moe_overlap.json]

The model is the real-overlap tests' (python/tests/torch_overlap_harness.py): transformers
`MixtralDecoderLayer`s (random weights, 4 experts, top-2, float32) as `pwt.phased_moe` blocks,
`--layers` per stage on the 2 x `--ranks` stages of DualPipeV (the same cut and placement for the
three ways), `--microbatches` microbatches of `--rows` sequences of `--seq` tokens. Each pipeline
rank is `--expert-ranks` processes (the experts split over them, `--tokens` shared as
`phased_moe` says), one compute thread each (`torch.set_num_threads(1)`), gloo on CPU. PyTorch's
class runs its `OVERLAP_F_B` pairs' halves one after the other. Every stage is given its shapes
(`PipelineStage(input_args=, output_args=)`), so no runtime probes them.

After a warm-up step of each, `--rounds` rounds time `--steps` steps of each way (barriers around
them, gradients set to None before each step), the ways' order rotating from round to round.
Printed: each way's median step and, per pair of ways, the median over the rounds of their ratio
in the same round; and whether the first step's losses were the same bits in all three ways.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))
sys.path.insert(0, os.path.join(REPO, "tools"))

import torch_overlap_harness as H  # noqa: E402
from torch_pipeline import pipeline_mesh  # noqa: E402

WAYS = ["pytorch", "sequential", "overlap"]
LABELS = {"pytorch": "PyTorch ScheduleDualPipeV", "sequential": "pwt.schedule, sequential pairs",
          "overlap": "pwt.schedule + pwt.overlap"}
SIZES = {"hidden": 64, "seq": 32, "rows": 2, "layers": 2, "microbatches": 8, "rounds": 5, "steps": 2}


# ----------------------------------------------------------------------------- the worker


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import ScheduleDualPipeV

    import pipeweave
    import pipeweave.torch as pwt

    torch.set_num_threads(1)
    shape = H.Shape(hidden=args.hidden, layers_per_stage=args.layers, rows=args.rows, seq=args.seq,
                    dtype="float32")
    mesh, pp_group, pp_rank, replica = pipeline_mesh(args.rank, args.ranks, args.expert_ranks, args.port,
                                                     timeout=120)
    ep_group = mesh["dp"].get_group()
    plan = pipeweave.plan(H.DUALPIPE_V, ranks=args.ranks, microbatches=args.microbatches)
    schedules: Dict[str, Any] = {}
    modules: Dict[str, List[Any]] = {}
    for way in WAYS:
        built, stages = H.build(torch, shape, plan, pp_rank, pp_group, ep_group, args.tokens, static=True)
        modules[way] = list(built.values())
        if way == "pytorch":
            schedules[way] = ScheduleDualPipeV(stages, args.microbatches, loss_fn=H.loss_fn)
        else:
            schedules[way] = pwt.schedule(plan, stages, loss_fn=H.loss_fn)
        if way == "overlap":
            pwt.overlap(schedules[way])
    x, y = H.batch(torch, shape, args.microbatches, replica if args.tokens == "split" else 0)
    mine = plan.stages_on(pp_rank)
    inputs = (x,) if 0 in mine else ()
    target = y if plan.stages - 1 in mine else None

    def step(way: str, losses: Any = None) -> None:
        for module in modules[way]:
            module.zero_grad(set_to_none=True)
        schedules[way].step(*inputs, target=target, losses=losses)
        if args.tokens == "split":
            pwt.average_expert_parallel_grads(modules[way], ep_group)

    first: Dict[str, List[str]] = {}
    for way in WAYS:
        losses: List[Any] = []
        step(way, losses)
        first[way] = [float(v).hex() for v in losses]
    times: Dict[str, List[float]] = {way: [] for way in WAYS}
    for r in range(args.rounds):
        for way in WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step(way)
            dist.barrier()
            times[way].append((time.perf_counter() - start) / args.steps)
    gathered: List[Any] = [None] * args.world
    dist.all_gather_object(gathered, first if target is not None else None)
    with open(args.results, "w") as f:
        if args.rank == 0:
            same = all(len({json.dumps(g[way]) for way in WAYS}) == 1 for g in gathered if g is not None)
            f.write(json.dumps({"times": times, "same_losses": same}) + "\n")
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Launches the workers; returns rank 0's times and whether the losses agreed."""
    options = [f"--{name.replace('_', '-')}={getattr(args, name)}"
               for name in ["expert_ranks", "tokens", *SIZES]]
    (result,) = H.run([], args.ranks, args.expert_ranks, timeout=3600, options=options, script=__file__)
    return result


def paired(times: Dict[str, List[float]], a: str, b: str) -> float:
    """The median over the rounds of `a`'s step over `b`'s in the same round."""
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def report(args: argparse.Namespace, result: Dict[str, Any]) -> str:
    times = result["times"]
    lines = [f"DualPipeV, P={args.ranks} x {args.expert_ranks} expert ranks ({args.tokens} tokens), "
             f"M={args.microbatches}, {2 * args.ranks * args.layers} Mixtral layers of width {args.hidden}, "
             f"{args.rows} x {args.seq} tokens per microbatch, float32, one thread per process; "
             f"medians of {args.rounds} rounds of {args.steps} steps",
             "", "| way | median step (ms) | rounds (ms) |", "|---|---|---|"]
    for way in WAYS:
        rounds = ", ".join(f"{1e3 * t:.0f}" for t in times[way])
        lines.append(f"| {LABELS[way]} | {1e3 * statistics.median(times[way]):.1f} | {rounds} |")
    lines += ["", f"overlap / PyTorch's class: {paired(times, 'overlap', 'pytorch'):.3f}x; "
                  f"sequential / PyTorch's class: {paired(times, 'sequential', 'pytorch'):.3f}x; "
                  f"overlap / sequential: {paired(times, 'overlap', 'sequential'):.3f}x (medians of paired rounds)",
              f"first step's losses the same bits in the three ways: {'yes' if result['same_losses'] else 'NO'}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", choices=["worker"])
    for name in ("rank", "world", "port"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--cases")
    parser.add_argument("--results")
    parser.add_argument("--out", default=None)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--expert-ranks", type=int, default=2)
    parser.add_argument("--tokens", choices=["replicated", "split"], default="replicated")
    for name, value in SIZES.items():
        parser.add_argument(f"--{name}", type=int, default=value)
    args = parser.parse_args()
    if args.mode == "worker":
        worker(args)
        return
    result = run(args)
    print(report(args, result))
    if args.out:
        options = {k: v for k, v in vars(args).items() if k not in ("mode", "rank", "world", "port", "cases",
                                                                     "results", "out")}
        with open(args.out, "w") as f:
            json.dump({"options": options, **result}, f, indent=1)


if __name__ == "__main__":
    main()
