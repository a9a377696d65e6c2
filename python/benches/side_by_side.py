"""pipeweave beside PyTorch's own pipeline schedules, in PyTorch's runtime (issue 44's benchmark).

    python python/benches/side_by_side.py --out side_by_side.json [--families llama,gpt2,qwen2]
        [--microbatches 4,8,16] [--rounds 3] [--steps 3] [--no-autotune]

For each model family (python/benches/families.py: Llama, GPT-2 and Qwen2 from transformers'
configs, random weights, 8 layers of width 256, 4 sequences of 32 tokens per microbatch, float32)
and each microbatch count M, on P = 2 gloo ranks with one compute thread each
(`torch.set_num_threads(1)`), one launch of two worker processes measures, in alternating rounds:
- each of PyTorch's schedule classes (`Schedule1F1B`, `ScheduleInterleaved1F1B`,
  `ScheduleZBVZeroBubble`, `ScheduleInterleavedZeroBubble`, `ScheduleDualPipeV`), over PyTorch's
  own `PipelineStage`s of the model cut evenly (`pwt.split`'s cut);
- the same order through `pwt.schedule` (`pipeweave.check` of the class's compute order);
- pipeweave's expressions: tune's pick (`pipeweave.tune(profile=..., runtime="pytorch")`, the
  profile `pwt.profile` took of the model on this machine) and the zero-bubble plans;
- with autotune, `pwt.autotune`'s measured pick.
Each measurement is a training step (`schedule.step`, the gradients zeroed after it), the wall time
from the first rank's start to the last rank's end, all ranks released by a barrier; per round each
configuration takes `--steps` steps after one warm-up step and keeps their median; the figure is
the median over the rounds, whose order rotates. Ratios are to the fastest PyTorch class of the
same family and M, and, for the same orders, to their own class.

The tables (markdown) are printed and everything is written as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tools"))

import families  # noqa: E402
from torch_pipeline import WorkerGroup, free_port, join_group, pipeline_ends  # noqa: E402

RANKS = 2
# PyTorch's classes: (name, stages per rank, placement).
CLASSES = [
    ("Schedule1F1B", 1, "loop"),
    ("ScheduleInterleaved1F1B", 2, "loop"),
    ("ScheduleZBVZeroBubble", 2, "v"),
    ("ScheduleInterleavedZeroBubble", 2, "loop"),
    ("ScheduleDualPipeV", 2, "v"),
]
# pipeweave's own expressions measured beside them (tune's pick is added per family and M).
EXPRESSIONS = [
    "f1b(gpipe)",
    "zero_bubble(f1b(gpipe), policy=h1)",
    "zero_bubble(f1b(gpipe), policy=h2)",
    "zero_bubble(f1b(gpipe))",
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
]


# ----------------------------------------------------------------------------- orders


def stage_indices(rank: int, ranks: int, per_rank: int, placement: str) -> List[int]:
    if per_rank == 1:
        return [rank]
    if placement == "loop":
        return [rank + k * ranks for k in range(per_rank)]
    return [rank, 2 * ranks - 1 - rank]


def class_order(torch: Any, name: str, per_rank: int, placement: str, microbatches: int) -> Dict[int, List[str]]:
    """The compute order PyTorch's class `name` runs on every rank (no process group: stand-in
    stages, as tools/pytorch_lowered.py does)."""
    from torch.distributed.pipelining import schedules as S

    import pytorch_lowered as L

    cls = getattr(S, name)
    if per_rank == 1:
        order = L.single_order(cls, RANKS, microbatches)
    else:
        stages = RANKS * per_rank
        order = {}
        for rank in range(RANKS):
            own = [L.stand_in(i, stages, RANKS, rank) for i in stage_indices(rank, RANKS, per_rank, placement)]
            order[rank] = cls(own, microbatches).pipeline_order[rank]
    return {r: [str(a) for a in actions if a is not None] for r, actions in order.items()}


# ----------------------------------------------------------------------------- the worker


def stage_modules(torch: Any, layers: Sequence[Any], stages: int) -> List[Any]:
    """The model cut evenly into `stages` `nn.Sequential`s (as `pwt.split` cuts without counts)."""
    n = len(layers)
    bounds = [(k * n) // stages for k in range(stages + 1)]
    return [torch.nn.Sequential(*layers[bounds[k]:bounds[k + 1]]) for k in range(stages)]


class Config:
    """One measured schedule: how to build it on a rank."""

    def __init__(self, label: str, kind: str, name: str, plan: Any = None, per_rank: int = 1,
                 placement: str = "loop") -> None:
        self.label, self.kind, self.name = label, kind, name
        self.plan, self.per_rank, self.placement = plan, per_rank, placement


def build_schedule(torch: Any, config: Config, layers: Sequence[Any], rank: int, group: Any,
                   microbatches: int, loss: Any) -> Any:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S

    import pipeweave.torch as pwt

    device = torch.device("cpu")
    if config.kind == "class":
        stages = RANKS * config.per_rank
        modules = stage_modules(torch, layers, stages)
        mine = stage_indices(rank, RANKS, config.per_rank, config.placement)
        built = [PipelineStage(modules[s], s, stages, device, group=group) for s in mine]
        cls = getattr(S, config.name)
        schedule = cls(built[0], microbatches, loss_fn=loss) if config.per_rank == 1 else cls(built, microbatches, loss_fn=loss)
        return schedule, mine, stages
    plan = config.plan
    modules = pwt.split(layers, plan)
    mine = plan.stages_on(rank)
    built = [PipelineStage(modules[s], s, plan.stages, device, group=group) for s in mine]
    return pwt.schedule(plan, built, loss_fn=loss), mine, plan.stages


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import pipeweave

    torch.set_num_threads(1)
    join_group(args.rank, RANKS, args.port, 600)
    spec = json.load(open(args.configs))
    layers = families.build(spec["family"], torch)
    loss = families.loss_fn(torch)
    microbatches = spec["microbatches"]
    group = dist.group.WORLD
    configs = []
    for c in spec["configs"]:
        plan = None
        if c["kind"] == "check":
            plan = pipeweave.check(c["csv"])
        elif c["kind"] == "plan":
            plan = pipeweave.plan(c["name"], ranks=RANKS, microbatches=microbatches)
        configs.append(Config(c["label"], c["kind"], c["name"], plan, c.get("per_rank", 1), c.get("placement", "loop")))
    built = [build_schedule(torch, c, layers, args.rank, group, microbatches, loss) for c in configs]
    x, y = families.batch(torch, microbatches)
    times: Dict[str, List[float]] = {c.label: [] for c in configs}

    def step(schedule: Any, mine: Sequence[int], stages: int) -> float:
        inputs, target = pipeline_ends(mine, stages, x, y)
        losses: List[Any] = []
        dist.barrier()
        t0 = time.perf_counter()
        schedule.step(*inputs, target=target, losses=losses)
        t1 = time.perf_counter()
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        ends = [None] * RANKS
        dist.all_gather_object(ends, (t0, t1))
        return max(e[1] for e in ends) - min(e[0] for e in ends)

    order = list(range(len(configs)))
    for r in range(spec["rounds"]):
        shift = r % len(order)
        for i in order[shift:] + order[:shift]:
            schedule, mine, stages = built[i]
            step(schedule, mine, stages)  # warm-up
            runs = [step(schedule, mine, stages) for _ in range(spec["steps"])]
            times[configs[i].label].append(statistics.median(runs))
    if args.rank == 0:
        with open(args.out, "w") as f:
            json.dump(times, f)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent


def measure(family: str, microbatches: int, configs: List[Dict[str, Any]], rounds: int, steps: int,
            workdir: str) -> Dict[str, float]:
    spec = {"family": family, "microbatches": microbatches, "configs": configs, "rounds": rounds,
            "steps": steps}
    path = os.path.join(workdir, f"{family}_m{microbatches}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    out = os.path.join(workdir, f"{family}_m{microbatches}.times.json")
    port = free_port()
    commands = [[sys.executable, os.path.abspath(__file__), "worker", "--rank", str(r), "--port", str(port),
                 "--configs", path, "--out", out] for r in range(RANKS)]
    logs = [os.path.join(workdir, f"{family}_m{microbatches}.rank{r}.log") for r in range(RANKS)]
    with WorkerGroup(commands, logs) as group:
        failed = group.wait(3600)
    if failed:
        raise RuntimeError(f"{family} M={microbatches}: {failed}")
    with open(out) as f:
        times = json.load(f)
    return {label: statistics.median(values) for label, values in times.items()}


def configs_for(torch: Any, microbatches: int, workdir: str, extra: Sequence[str]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    for name, per_rank, placement in CLASSES:
        out.append({"label": name, "kind": "class", "name": name, "per_rank": per_rank, "placement": placement})
        order = class_order(torch, name, per_rank, placement, microbatches)
        csv = os.path.join(workdir, f"{name}_m{microbatches}.csv")
        with open(csv, "w") as f:
            for rank in range(RANKS):
                f.write(",".join(order[rank]) + "\n")
        out.append({"label": f"same order as {name}", "kind": "check", "name": name, "csv": csv})
    for expression in list(EXPRESSIONS) + [e for e in extra if e not in EXPRESSIONS]:
        out.append({"label": expression, "kind": "plan", "name": expression})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker")
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--configs", required=True)
    w.add_argument("--out", required=True)
    parser.add_argument("--out", default="side_by_side.json")
    parser.add_argument("--families", default=",".join(families.FAMILIES))
    parser.add_argument("--microbatches", default="4,8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.command == "worker":
        worker(args)
        return
    import torch

    results: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for family in args.families.split(","):
            for m in [int(v) for v in args.microbatches.split(",")]:
                configs = configs_for(torch, m, workdir, [])
                times = measure(family, m, configs, args.rounds, args.steps, workdir)
                results[f"{family} M={m}"] = times
                best = min(times[name] for name, _, _ in CLASSES)
                print(f"\n## {family}, P={RANKS}, M={m} (best PyTorch class {best:.3f} s)\n")
                print("| schedule | step (s) | vs best class | vs its class |")
                print("|---|---|---|---|")
                for label, t in times.items():
                    own = ""
                    if label.startswith("same order as "):
                        own = f"{t / times[label[len('same order as '):]]:.3f}x"
                    print(f"| {label} | {t:.3f} | {t / best:.3f}x | {own} |")
                sys.stdout.flush()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
