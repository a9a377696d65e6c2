#!/usr/bin/env python3
"""Trains a small PyTorch model with a pipeweave schedule on PyTorch's own pipeline runtime.

One process per pipeline rank (gloo on CPU), every rank builds the same plan in memory, cuts the
model into the plan's stages (`pwt.split`), wraps its stages in `PipelineStage` and runs the plan
through `pwt.schedule`; rank 0 then compares the losses and gradients with the same model trained on
one device. The plan recomputes activations to fit one microbatch's per rank
(`recompute(f1b(gpipe), memory=1)`): the forwards the plan drops run without keeping their
activations and run again right before their backward, and the measured saved-activation peak is
printed beside the plan's.

Run: `pip install './python[torch]' && python examples/torch_schedule.py [--ranks 2] [--steps 3]`
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage

import pipeweave
import pipeweave.torch as pwt

EXPRESSION = "recompute(f1b(gpipe), memory=1)"
PLAIN = "f1b(gpipe)"
LAYERS, WIDTH, ROWS = 8, 16, 4


def layers():
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double()
            for _ in range(LAYERS)]


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def data(microbatches, step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(microbatches * ROWS, WIDTH, dtype=torch.float64, generator=g)
    return x, torch.randn(x.shape, dtype=torch.float64, generator=g)


def make_plan(ranks, microbatches, expression=EXPRESSION):
    return pipeweave.plan(expression, ranks=ranks, microbatches=microbatches)


def single_device(ranks, microbatches, steps):
    model = torch.nn.Sequential(*layers())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = data(microbatches, step)
        optimizer.zero_grad()
        step_losses = []
        for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
            loss = loss_fn(model(xm), ym)
            (loss / microbatches).backward()
            step_losses.append(loss.item())
        optimizer.step()
        losses.append(step_losses)
    return losses


def rank_main(rank, ranks, microbatches, steps, port, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks)
    plan = make_plan(ranks, microbatches)          # the same plan on every rank, built in memory
    parts = pwt.split(layers(), plan)               # one nn.Sequential per stage of the plan
    mine = plan.stages_on(rank)
    stages = [PipelineStage(parts[s], s, plan.stages, torch.device("cpu")) for s in mine]
    schedule = pwt.schedule(plan, stages, loss_fn=loss_fn)
    params = [p for s in mine for p in parts[s].parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1)
    all_losses = []
    for step in range(steps):
        x, y = data(microbatches, step)
        optimizer.zero_grad()
        losses = []
        inputs = (x,) if 0 in mine else ()
        target = y if plan.stages - 1 in mine else None
        with pwt.SavedActivationMeter() as meter:
            schedule.step(*inputs, target=target, losses=losses)
        optimizer.step()
        all_losses.append([l.item() for l in losses])
    results[rank] = {"losses": all_losses if target is not None else None,
                     "peak": meter.peak_bytes - meter.start_bytes,
                     "unit": sum(pwt.activation_bytes(parts[s], torch.randn(ROWS, WIDTH, dtype=torch.float64,
                                                                            requires_grad=s > 0))
                                 for s in mine)}
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    plan = make_plan(args.ranks, args.microbatches)
    print(f"{plan.expression}: makespan {plan.makespan}, predicted peak per rank "
          f"{plan.peak_activations_per_rank} (the plain plan's: "
          f"{make_plan(args.ranks, args.microbatches, PLAIN).peak_activations_per_rank})")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(rank_main, args=(args.ranks, args.microbatches, args.steps, free_port(), results),
                           nprocs=args.ranks, join=True, start_method="spawn")
        results = dict(results)
    pipelined = results[args.ranks - 1]["losses"]
    reference = single_device(args.ranks, args.microbatches, args.steps)
    for step, (ours, theirs) in enumerate(zip(pipelined, reference)):
        worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(ours, theirs))
        print(f"step {step}: mean loss {sum(ours) / len(ours):.6f} (one device {sum(theirs) / len(theirs):.6f}, "
              f"largest relative difference {worst:.1e})")
    for rank in range(args.ranks):
        r = results[rank]
        print(f"rank {rank}: measured saved-activation peak {r['peak'] / r['unit']:.2f} microbatches "
              f"(plan: {plan.peak_activations_per_rank[rank]:.2f})")
    ok = all(abs(a - b) <= 1e-6 * max(abs(b), 1e-30) for o, t in zip(pipelined, reference) for a, b in zip(o, t))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
