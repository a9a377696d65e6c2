"""What a split backward costs beside the full one, per stage of the bench models (issue 44).

    python python/benches/split_backward.py [--rounds 9] [--microbatches 8] [--out split.json]

For each model family of python/benches/families.py, cut evenly in two stages (the first with
the embedding, the last with the head and the loss), one process with one thread
(`torch.set_num_threads(1)`) runs `--microbatches` forwards of a stage, then their backwards, the
gradients accumulating as in a step, three ways, in alternating rounds:
- `B`: the full backward, as autograd runs it;
- pipeweave's split (`pipeweave.torch._weight_grad`): `I` (the whole backward but the linear
  layers' weight gradients, each one's input and output gradient kept), then `W` (those
  gradients), each microbatch's I right after its forward's turn and its W after all the Is;
- PyTorch's split (`stage_backward_input`, then `stage_backward_weight`), as its own zero-bubble
  schedules run it.
The figures are the medians over the rounds of each round's mean per microbatch; the ratio is
(I + W) / B. It prints a markdown table and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import families  # noqa: E402


def stage_of(torch: Any, family: str, which: int, microbatches: int) -> Tuple[Any, List[Any], List[Any]]:
    """Stage `which` (0 or 1) of the even two-stage cut, its inputs and (for the last) targets."""
    layers = families.build(family, torch)
    x, y = families.batch(torch, microbatches)
    half = len(layers) // 2
    if which == 0:
        return torch.nn.Sequential(*layers[:half]), list(x.chunk(microbatches)), []
    with torch.no_grad():
        hidden = torch.nn.Sequential(*layers[:half])(x)
    return torch.nn.Sequential(*layers[half:]), [h.detach() for h in hidden.chunk(microbatches)], list(y.chunk(microbatches))


def run(torch: Any, stage: Any, inputs: List[Any], targets: List[Any], way: str) -> Dict[str, float]:
    """One step of `way` over the microbatches: the mean seconds per microbatch of each phase."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    from pipeweave.torch import _weight_grad as WG

    loss_fn = families.loss_fn(torch)
    holder = types.SimpleNamespace(submod=stage, dw_builder=None)
    installed = WG.install(holder) if way == "pipeweave" else None
    outs, ins = [], []
    for k, t in enumerate(inputs):
        inp = t.clone().requires_grad_(True) if t.is_floating_point() else t
        out = stage(inp)
        outs.append(loss_fn(out, targets[k]) if targets else out)
        ins.append(inp)
    times = {"B": 0.0, "I": 0.0, "W": 0.0}
    pending = []
    for out, inp in zip(outs, ins):
        grads = None if targets else [torch.ones_like(out)]
        t0 = time.perf_counter()
        if way == "full":
            torch.autograd.backward([out], grads)
            times["B"] += time.perf_counter() - t0
            continue
        if way == "pipeweave":
            installed.stash.backward = installed.stash.capturing = True
            torch.autograd.backward([out], grads)
            installed.stash.backward = installed.stash.capturing = False
            pending.append(holder.dw_builder())
        else:
            wanted = [inp] if inp.requires_grad else []
            if wanted:
                _, groups = stage_backward_input([out], grads, wanted, stage.parameters())
                pending.append(("groups", groups))
            else:  # token ids: PyTorch's first stage runs the whole backward as its W
                pending.append(("graph", ([out], grads)))
        times["I"] += time.perf_counter() - t0
    for item in pending:
        t0 = time.perf_counter()
        if way == "pipeweave":
            item()
        elif item[0] == "groups":
            stage_backward_weight(iter(p for p in stage.parameters() if p.requires_grad), item[1])
        else:
            torch.autograd.backward(*item[1])
        times["W"] += time.perf_counter() - t0
    if installed is not None:
        WG.uninstall(installed)
    stage.zero_grad(set_to_none=True)
    return {k: v / len(inputs) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--families", default=",".join(families.FAMILIES))
    parser.add_argument("--out", default="split_backward.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    results: Dict[str, Any] = {}
    print("| model | stage | B (ms) | pipeweave I + W (ms) | ratio | PyTorch I + W (ms) | ratio |")
    print("|---|---|---|---|---|---|---|")
    for family in args.families.split(","):
        for which in (0, 1):
            stage, inputs, targets = stage_of(torch, family, which, args.microbatches)
            rounds: Dict[str, List[Dict[str, float]]] = {"full": [], "pipeweave": [], "pytorch": []}
            for r in range(args.rounds + 1):
                ways = list(rounds)
                for way in ways[r % 3:] + ways[:r % 3]:
                    figures = run(torch, stage, inputs, targets, way)
                    if r > 0:  # the first round warms up
                        rounds[way].append(figures)
            med = {way: {k: statistics.median(f[k] for f in figs) for k in ("B", "I", "W")}
                   for way, figs in rounds.items()}
            b = med["full"]["B"]
            ours = med["pipeweave"]["I"] + med["pipeweave"]["W"]
            theirs = med["pytorch"]["I"] + med["pytorch"]["W"]
            results[f"{family} stage {which}"] = {"medians": med, "ours": ours / b, "pytorch": theirs / b}
            print(f"| {family} | {which} | {1e3 * b:.2f} | {1e3 * ours:.2f} | {ours / b:.3f}x | "
                  f"{1e3 * theirs:.2f} | {theirs / b:.3f}x |")
            sys.stdout.flush()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
