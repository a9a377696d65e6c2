"""`split(layers, plan)`: a model given as an ordered list of layers cut into the plan's stages.

With `plan.layers_per_stage` (a plan built with a profile) the counts are per rank's share, in rank
order; a rank holding several stages (vpp, V layouts, DualPipeV) spreads its share over them in
stage order, earlier stages taking the extra layers (as `spread_shares` in core/src/ir/blocks.rs).
Without it the cut is even over the stages: stage k holds layers floor(kL/S) to floor((k+1)L/S).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from ._schedule import _error

__all__ = ["split", "stage_layer_counts"]


def spread_shares(owners: Sequence[int], shares: Sequence[int]) -> List[int]:
    """Per stage, its layers: `owners[k]` is the rank of stage k, `shares[r]` rank r's layers;
    each rank's share spread over its stages in order, the first ones taking the remainder."""
    counts = [0] * len(owners)
    for rank, share in enumerate(shares):
        held = [k for k in range(len(owners)) if owners[k] == rank]
        for i, k in enumerate(held):
            counts[k] = share // len(held) + (1 if i < share % len(held) else 0)
    return counts


def even_counts(layers: int, stages: int) -> List[int]:
    """The even cut: stage k holds floor(k*L/S) .. floor((k+1)*L/S)."""
    return [((k + 1) * layers) // stages - (k * layers) // stages for k in range(stages)]


def stage_layer_counts(num_layers: int, plan: Any, layers_per_stage: Optional[Sequence[int]] = None) -> List[int]:
    """Per global stage of `plan`, how many consecutive layers it holds.

    `num_layers`: the model's layer count. `plan`: a `pipeweave.Plan`. `layers_per_stage`: per
    rank's share (default: the `layers_per_stage` the plan was built with, else the even cut over
    the stages, as the planner costs a profiled plan built without a cut).
    Raises `pipeweave.Error` where the counts do not fit the model or the plan."""
    if layers_per_stage is None and getattr(plan, "cut_given", True):
        layers_per_stage = plan.report.get("layers_per_stage")
    owners = list(plan.stage_to_rank)
    if layers_per_stage is None:
        if num_layers < len(owners):
            raise _error(f"the model has {num_layers} layers, fewer than the plan's {len(owners)} stages")
        return even_counts(num_layers, len(owners))
    shares = [int(c) for c in layers_per_stage]
    if any(c < 0 for c in shares):
        raise _error(f"layers_per_stage {shares} has a negative count")
    if len(shares) == plan.ranks:
        counts = spread_shares(owners, shares)
    else:
        raise _error(
            f"layers_per_stage {shares} has {len(shares)} counts; the plan has {plan.ranks} ranks"
        )
    if sum(counts) != num_layers:
        raise _error(
            f"layers_per_stage {shares} sums to {sum(counts)}; the model has {num_layers} layers"
        )
    empty = [k for k, c in enumerate(counts) if c == 0]
    if empty:
        raise _error(f"layers_per_stage {shares} leaves stage(s) {empty} without a layer")
    return counts


def split(layers: Sequence[torch.nn.Module], plan: Any, *, layers_per_stage: Optional[Sequence[int]] = None) -> List[torch.nn.Sequential]:
    """The plan's stages as modules: one `nn.Sequential` per global stage, in stage order.

    `layers`: the model as an ordered list of modules (the first takes the input, the last gives
    what the loss reads; an `nn.Sequential` works too). `plan`: a `pipeweave.Plan`; its
    `layers_per_stage` (with a profile) or the even cut decides the cut. `layers_per_stage`:
    per rank's share, to override the plan's. The modules are the given layer objects (not
    copies): composing the stages in order is the original model.
    Raises `pipeweave.Error` for counts that do not sum to the layers."""
    layers = list(layers)
    counts = stage_layer_counts(len(layers), plan, layers_per_stage)
    out: List[torch.nn.Sequential] = []
    start = 0
    for c in counts:
        out.append(torch.nn.Sequential(*layers[start : start + c]))
        start += c
    return out
