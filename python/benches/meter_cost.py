"""What `pwt.SavedActivationMeter` costs a step while it is on (issue 44): with a meter, every
forward of a `pwt.schedule` stage runs under saved-tensor hooks that count what it keeps (and
the split backward's linear layers through a tracked product), where without one the forwards
the plan keeps run as PyTorch's schedules run them.

    python python/benches/meter_cost.py [--family llama] [--microbatches 8] [--rounds 7]

Two gloo ranks, one thread each; `zero_bubble(f1b(gpipe))` and `f1b(gpipe)` on the even cut, each
step with and without a meter around it, in alternating rounds (3 steps each after a warm-up);
prints the median step of each and the medians of the rounds' paired ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))

import families  # noqa: E402
from torch_pipeline import WorkerGroup, free_port, join_group  # noqa: E402

EXPRESSIONS = ["f1b(gpipe)", "zero_bubble(f1b(gpipe))"]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import pipeweave.torch as pwt
    from pipeweave.torch import _trials as T

    torch.set_num_threads(1)
    join_group(args.rank, 2, args.port, 600)
    m = args.microbatches
    layers = families.build(args.family, torch)
    loss = families.loss_fn(torch)
    x, y = families.batch(torch, m)
    builts = {e: T.build(T.Trial.of_plan(e), layers, 2, m, loss, dist.group.WORLD, torch.device("cpu"), None)
              for e in EXPRESSIONS}
    times: Dict[str, List[float]] = {}

    def step(built: Any, metered: bool) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        if metered:
            with pwt.SavedActivationMeter():
                built.step(x, y, losses=[])
        else:
            built.step(x, y, losses=[])
        t1 = time.perf_counter()
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        ends: List[Any] = [None, None]
        dist.all_gather_object(ends, (t0, t1))
        return max(e[1] for e in ends) - min(e[0] for e in ends)

    configs = [(e, metered) for e in EXPRESSIONS for metered in (False, True)]
    for r in range(args.rounds):
        for e, metered in configs[r % 4:] + configs[:r % 4]:
            step(builts[e], metered)
            times.setdefault(f"{e} {'metered' if metered else 'plain'}", []).append(
                statistics.median(step(builts[e], metered) for _ in range(3)))
    if args.rank == 0:
        with open(args.out, "w") as f:
            json.dump(times, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker")
    for name in ("rank", "port", "microbatches", "rounds"):
        w.add_argument(f"--{name}", type=int, required=True)
    w.add_argument("--family", required=True)
    w.add_argument("--out", required=True)
    parser.add_argument("--family", default="llama")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if args.command == "worker":
        worker(args)
        return
    with tempfile.TemporaryDirectory() as workdir:
        out = os.path.join(workdir, "times.json")
        port = free_port()
        commands = [[sys.executable, os.path.abspath(__file__), "worker", "--rank", str(r), "--port", str(port),
                     "--microbatches", str(args.microbatches), "--rounds", str(args.rounds),
                     "--family", args.family, "--out", out] for r in range(2)]
        logs = [os.path.join(workdir, f"rank{r}.log") for r in range(2)]
        with WorkerGroup(commands, logs) as group:
            failed = group.wait(3600)
        if failed:
            raise RuntimeError(failed)
        with open(out) as f:
            times = json.load(f)
    for e in EXPRESSIONS:
        plain, metered = times[f"{e} plain"], times[f"{e} metered"]
        ratio = statistics.median(a / b for a, b in zip(metered, plain))
        print(f"{e}: {statistics.median(plain):.3f} s plain, {statistics.median(metered):.3f} s metered: {ratio:.3f}x")


if __name__ == "__main__":
    main()
