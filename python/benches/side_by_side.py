"""pipeweave beside PyTorch's own pipeline schedules, in PyTorch's runtime (issue 44's benchmark).

    python python/benches/side_by_side.py --out side_by_side.json [--families llama,gpt2,qwen2]
        [--microbatches 4,8,16] [--rounds 3] [--steps 3] [--budget 60]

For each model family (python/benches/families.py: Llama, GPT-2 and Qwen2 from transformers'
configs, random weights, 8 layers of width 256, 4 sequences of 32 tokens per microbatch, float32)
and each microbatch count M, on P = 2 gloo ranks with one compute thread each
(`torch.set_num_threads(1)`), one launch of two worker processes:
1. profiles the model in the runtime (`pwt.profile(..., group=...)`: the layers timed, then
   calibrated by short runs of PyTorch's 1F1B and pipeweave's zero bubble);
2. runs `pwt.autotune` on that profile (tune's best three for PyTorch's runtime and PyTorch's
   classes, up to four rounds of two steps, the later ones for those within 10% of the fastest,
   within `--budget` seconds): its choice is the measured pick;
3. measures, in `--rounds` alternating rounds of `--steps` steps after a warm-up each:
   - each of PyTorch's classes (`Schedule1F1B`, `ScheduleInterleaved1F1B`, `ScheduleZBVZeroBubble`,
     `ScheduleInterleavedZeroBubble`, `ScheduleDualPipeV`) on the even cut;
   - the same order through `pwt.schedule` (`pipeweave.check` of the class's compute order);
   - pipeweave's zero-bubble plans on the even cut, tune's pick (its cut), the measured pick.
Each figure is the median over the rounds of each round's median step (the wall time from the
first rank's start to the last rank's end, a barrier releasing them together; the gradients set to
None after each step); a schedule listed twice (a pick that is one of the classes, or a plan of the
same orders on the same cut as another row) is measured once and shown in both rows. Ratios are to
the fastest PyTorch class of the same family and M, and, for the same orders, to their own class,
each the median over the rounds of the two configurations' ratio in that round; `predicted` is the step the plan's simulation gives on the
runtime profile (an error against the measured step beside it). The tables (markdown) are printed
and everything is written as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tools"))

import families  # noqa: E402
from torch_pipeline import WorkerGroup, free_port, join_group  # noqa: E402

RANKS = 2
CLASSES = ["Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble",
           "ScheduleInterleavedZeroBubble", "ScheduleDualPipeV"]
# pipeweave's zero-bubble plans measured on the even cut beside tune's pick.
EXPRESSIONS = [
    "zero_bubble(f1b(gpipe), policy=h1)",
    "zero_bubble(f1b(gpipe))",
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
]


def class_order(torch: Any, name: str, microbatches: int) -> Dict[int, List[str]]:
    """The compute order PyTorch's class `name` runs on every rank (no process group: stand-in
    stages, as tools/pytorch_lowered.py does)."""
    from torch.distributed.pipelining import schedules as S

    import pytorch_lowered as L
    from pipeweave.torch._trials import Trial, _stage_indices

    trial = Trial.of_class(name)
    cls = getattr(S, name)
    if trial.stages_per_rank == 1:
        order = L.single_order(cls, RANKS, microbatches)
    else:
        stages = RANKS * trial.stages_per_rank
        order = {}
        for rank in range(RANKS):
            own = [L.stand_in(i, stages, RANKS, rank)
                   for i in _stage_indices(rank, RANKS, trial.stages_per_rank, trial.placement)]
            order[rank] = cls(own, microbatches).pipeline_order[rank]
    return {r: [str(a) for a in actions if a is not None] for r, actions in order.items()}


def write_orders(torch: Any, microbatches: int, workdir: str) -> Dict[str, str]:
    """Each class's compute order as a compute-only CSV: per class, its path."""
    paths = {}
    for name in CLASSES:
        order = class_order(torch, name, microbatches)
        path = os.path.join(workdir, f"{name}_m{microbatches}.csv")
        with open(path, "w") as f:
            for rank in range(RANKS):
                f.write(",".join(order[rank]) + "\n")
        paths[name] = path
    return paths


# ----------------------------------------------------------------------------- the worker


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    import pipeweave
    import pipeweave.torch as pwt
    from pipeweave.torch import _trials as T

    torch.set_num_threads(1)
    join_group(args.rank, RANKS, args.port, 3600)
    spec = json.load(open(args.spec))
    m = spec["microbatches"]
    layers = families.build(spec["family"], torch)
    loss = families.loss_fn(torch)
    x, y = families.batch(torch, m)
    device = torch.device("cpu")
    group = dist.group.WORLD
    started = time.perf_counter()
    profile = pwt.profile(layers, x.chunk(m)[0], loss_fn=loss, target=y.chunk(m)[0], group=group,
                          batch=(x, y), microbatches=m)
    profiled = time.perf_counter() - started
    found = pwt.autotune(layers, x, y, loss_fn=loss, microbatches=m, profile=profile, top=3,
                         budget=spec["budget"])
    tuned = time.perf_counter() - started - profiled
    pick = pipeweave.tune(ranks=RANKS, microbatches=m, profile=profile, runtime="pytorch", top=1)[0]

    rows: List[Dict[str, Any]] = []
    trials: List[Any] = []
    seen: Dict[Any, int] = {}

    def add(label: str, trial: Any, plan: Any = None) -> None:
        """A row; a schedule already listed (the same class, or a plan of the same orders on the
        same cut) is not built again: the row shows that one's measurement."""
        predicted = None
        if trial.kind == "pipeweave":
            built_plan = trial.plan(RANKS, m, profile)
            predicted = built_plan.makespan
            key: Any = ("plan", json.dumps(built_plan.order),
                        tuple(trial.layer_counts(len(layers), RANKS, m, profile)))
        else:
            key = (trial.kind, trial.name)
        same = seen.get(key)
        if same is None:
            same = seen[key] = len(trials)
            trials.append((trial, plan))
        rows.append({"label": label, "kind": trial.kind, "name": trial.name, "cut": trial.layers_per_stage,
                     "predicted": predicted, "config": same})

    for name in CLASSES:
        add(name, T.Trial.of_class(name))
    for name in CLASSES:
        add(f"same order as {name}", T.Trial(name=name, kind="imported"), pipeweave.check(spec["orders"][name]))
    for expression in EXPRESSIONS:
        add(expression, T.Trial.of_plan(expression))
    add(f"tune's pick: {pick.expression}", T.Trial.of_plan(pick.expression, pick.layers_per_stage))
    best = found.best
    add(f"measured pick: {best.name}", dataclasses.replace(best, rounds=[], measured=None, actions={}))
    builts = []
    for trial, plan in trials:
        if plan is not None:  # the same order: the imported plan as it is, on the even cut
            modules = pwt.split(layers, plan)
            mine = plan.stages_on(args.rank)
            stages = [PipelineStage(modules[s], s, plan.stages, device, group=group) for s in mine]
            builts.append(T.Built(pwt.schedule(plan, stages, loss_fn=loss), stages, mine, plan.stages))
        else:
            builts.append(T.build(trial, layers, RANKS, m, loss, group, device, profile))
    T.measure([t for t, _ in trials], builts, layers, x, y, group=group, steps=spec["steps"],
              rounds=spec["rounds"], budget=float("inf"), started=time.perf_counter())
    # Per trial, every rank's median action durations per (stage, kind), gathered on rank 0.
    actions = [{f"{stage}{kind}": statistics.median(d) for (stage, kind), d in t.actions.items() if d}
               for t, _ in trials]
    gathered: List[Any] = [None] * RANKS
    dist.all_gather_object(gathered, actions)
    if args.rank == 0:
        for row in rows:
            trial = trials[row["config"]][0]
            row["measured"], row["rounds"] = trial.measured, trial.rounds
            row["actions"] = {k: v for part in gathered for k, v in part[row["config"]].items()}
        autotune = [{"name": t.name, "kind": t.kind, "cut": t.layers_per_stage, "predicted": t.predicted,
                     "calibrated": t.calibrated, "measured": t.measured} for t in found.trials]
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "autotune": autotune, "profile": profile.data,
                       "profile_seconds": profiled, "autotune_seconds": tuned,
                       "autotune_profile": found.profile.data}, f)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent


def run(family: str, microbatches: int, orders: Dict[str, str], args: argparse.Namespace,
        workdir: str) -> Dict[str, Any]:
    spec = {"family": family, "microbatches": microbatches, "orders": orders, "rounds": args.rounds,
            "steps": args.steps, "budget": args.budget}
    path = os.path.join(workdir, f"{family}_m{microbatches}.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    out = os.path.join(workdir, f"{family}_m{microbatches}.out.json")
    port = free_port()
    commands = [[sys.executable, os.path.abspath(__file__), "worker", "--rank", str(r), "--port", str(port),
                 "--spec", path, "--out", out] for r in range(RANKS)]
    logs = [os.path.join(workdir, f"{family}_m{microbatches}.rank{r}.log") for r in range(RANKS)]
    with WorkerGroup(commands, logs, env=dict(os.environ, OMP_NUM_THREADS="1")) as group:
        failed = group.wait(7200)
    if failed:
        raise RuntimeError(f"{family} M={microbatches}: {failed}")
    with open(out) as f:
        return json.load(f)


def paired(row: Dict[str, Any], to: Dict[str, Any]) -> float:
    """The median over the rounds of `row`'s step over `to`'s in the same round: the ratio with
    the machine's drift between rounds paired out."""
    return statistics.median(a / b for a, b in zip(row["rounds"], to["rounds"]))


def table(family: str, microbatches: int, result: Dict[str, Any]) -> str:
    rows = result["rows"]
    by_label = {r["label"]: r for r in rows}
    best_class = min(CLASSES, key=lambda name: by_label[name]["measured"])
    best = by_label[best_class]
    lines = [f"\n## {family}, P={RANKS}, M={microbatches} (best PyTorch class {best_class}, "
             f"{best['measured']:.3f} s; ratios are medians of the rounds' paired ratios)\n",
             "| schedule | step (s) | vs best class | vs its class | predicted (s) | error |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        own = ""
        if r["label"].startswith("same order as "):
            own = f"{paired(r, by_label[r['label'][len('same order as '):]]):.3f}x"
        predicted = error = ""
        if r["predicted"] is not None and not r["label"].startswith("same order"):
            predicted = f"{r['predicted']:.3f}"
            error = f"{100 * (r['predicted'] / r['measured'] - 1):+.1f}%"
        cut = f" (cut {','.join(map(str, r['cut']))})" if r.get("cut") else ""
        lines.append(f"| {r['label']}{cut} | {r['measured']:.3f} | {paired(r, best):.3f}x | {own} | {predicted} | {error} |")
    return "\n".join(lines)


def split_table(family: str, microbatches: int, result: Dict[str, Any]) -> str:
    """Per stage of the even cut: the full backward as PyTorch's 1F1B ran it, and I and W as
    `zero_bubble(f1b(gpipe))` ran them through `pwt.schedule` (medians of the timed actions)."""
    by_label = {r["label"]: r for r in result["rows"]}
    full = by_label["Schedule1F1B"]["actions"]
    split = by_label["zero_bubble(f1b(gpipe))"]["actions"]
    lines = [f"\n{family}, M={microbatches}: | stage | B (ms) | I (ms) | W (ms) | (I+W)/B |", "|---|---|---|---|---|"]
    for stage in range(RANKS):
        b, i, w = full.get(f"{stage}B"), split.get(f"{stage}I"), split.get(f"{stage}W")
        if None in (b, i, w):
            continue
        lines.append(f"| {stage} | {1e3 * b:.2f} | {1e3 * i:.2f} | {1e3 * w:.2f} | {(i + w) / b:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker")
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--spec", required=True)
    w.add_argument("--out", required=True)
    parser.add_argument("--out", default="side_by_side.json")
    parser.add_argument("--families", default=",".join(families.FAMILIES))
    parser.add_argument("--microbatches", default="4,8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budget", type=float, default=60.0)
    args = parser.parse_args()
    if args.command == "worker":
        worker(args)
        return
    import torch

    results: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for m in [int(v) for v in args.microbatches.split(",")]:
            orders = write_orders(torch, m, workdir)
            for family in args.families.split(","):
                result = run(family, m, orders, args, workdir)
                results[f"{family} M={m}"] = result
                print(table(family, m, result))
                print(split_table(family, m, result))
                sys.stdout.flush()
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
