"""`autotune(layers, x, y, loss_fn=..., microbatches=M)`: tuning that measures. On the user's own
ranks it profiles the model in the runtime (`profile(..., group=...)`: the layers timed, then
calibrated by a short run of PyTorch's 1F1B and a pipeweave zero-bubble plan), asks
`pipeweave.tune` for the best few schedules PyTorch's runtime can run on that profile, runs them
and PyTorch's own schedule classes for a few training steps each in alternating rounds within a
time budget (`_trials.measure`), and returns the fastest measured: the same choice on every rank,
with the predicted and measured step of every candidate, and the profile calibrated again by
everything measured (`Autotuned.profile`, for `pipeweave.tune(profile=...)` later).

The trial steps run the model's real forwards and backwards on the batch given; the gradients
are set to None after each (no optimizer step runs), so the parameters are as they were, and the
random generator's state moves on as the steps draw from it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import torch

from .._errors import Error
from ._trials import PYTORCH_CLASSES, Built, Trial, build, device_of, measure, root_rank

__all__ = ["autotune", "Autotuned"]


@dataclass
class Autotuned:
    """What `autotune` found: the fastest measured trial (`best`), every trial (`trials`, in the
    order they were listed: tune's picks, then PyTorch's classes), the profile calibrated by the
    measurements (`profile`), and the profile the plans were built on (`planned_with`: their
    orders follow its costs)."""

    best: Trial
    trials: List[Trial]
    profile: Any
    ranks: int
    microbatches: int
    planned_with: Any

    def build(self, layers: Sequence[torch.nn.Module], *, loss_fn: Callable[..., torch.Tensor],
              group: Any = None, device: Any = None, trial: Optional[Trial] = None) -> Built:
        """The schedule of `trial` (default: the best) on this rank, its stages over `layers` (the
        same layer objects autotune measured), built as autotune built it: `built.schedule.step(
        *built.ends(x, y)...)` trains."""
        return build(trial or self.best, list(layers), self.ranks, self.microbatches, loss_fn, group,
                     torch.device(device) if device is not None else device_of(layers), self.planned_with)


def _whole(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise Error(f"autotune(): {name} must be a whole number >= {low}, got {value!r}")
    return value


def autotune(
    layers: Sequence[torch.nn.Module],
    x: Any,
    y: Any,
    *,
    loss_fn: Callable[..., torch.Tensor],
    microbatches: int,
    group: Any = None,
    device: Any = None,
    profile: Any = None,
    memory_limit: Any = None,
    top: int = 3,
    classes: bool = True,
    budget: float = 60.0,
    steps: int = 2,
    rounds: int = 4,
    contenders: float = 0.1,
) -> Autotuned:
    """Measures the best schedules for this model on these ranks and returns the fastest.

    Call it on every rank of the pipeline group, with the same arguments. `layers`: the model as
    an ordered list of modules (the same objects on which the chosen schedule then trains).
    `x`, `y`: one training batch (all `microbatches` microbatches) and its target, on every rank.
    `loss_fn(output, target)`: the loss. `group`: the pipeline's process group (default: the
    world). `device`: where the stages run (default: the layers'). `profile`: a
    `pipeweave.Profile` of the model (default: `pwt.profile(..., group=group)` on the batch's first
    microbatch: the layers timed on the group's first rank, then calibrated in the runtime).
    `memory_limit`: as `pipeweave.tune`'s. `top`: how many of tune's candidates (for PyTorch's
    runtime) to measure. `classes`: measure PyTorch's own schedule classes too (those that
    accept these sizes). `budget`: seconds the measurement may take (a round under way is
    finished; if the first round cannot finish, the candidates measured so far compete).
    `steps`: timed steps per candidate and round (after one warm-up step). `rounds`: rounds over
    the candidates, in rotating order; after the first, only those within `contenders` (a share,
    0.1: 10%) of the fastest so far run again, so the budget goes to the close ones.

    Returns an `Autotuned`; `result.build(layers, loss_fn=...)` gives the chosen schedule on this
    rank. Raises `pipeweave.Error` for bad arguments or where nothing could be measured."""
    import torch.distributed as dist

    import pipeweave

    from ._calibrate import calibrate
    from ._profile import profile as measure_profile

    if not dist.is_initialized():
        raise Error("autotune() runs on the pipeline's ranks: initialise torch.distributed first")
    microbatches = _whole("microbatches", microbatches)
    top, steps, rounds = _whole("top", top), _whole("steps", steps), _whole("rounds", rounds)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise Error(f"autotune(): budget must be a positive number of seconds, got {budget!r}")
    if isinstance(contenders, bool) or not isinstance(contenders, (int, float)) or contenders < 0:
        raise Error(f"autotune(): contenders must be a share >= 0, got {contenders!r}")
    layers = list(layers)
    ranks = dist.get_world_size(group)
    dev = torch.device(device) if device is not None else device_of(layers)
    started = time.perf_counter()
    if profile is None:
        profile = measure_profile(layers, x.chunk(microbatches)[0], loss_fn=loss_fn,
                                  target=y.chunk(microbatches)[0], device=dev, group=group,
                                  batch=(x, y), microbatches=microbatches)
    else:
        # The same profile on every rank: the first rank's.
        shared: List[Any] = [profile.to_json()]
        dist.broadcast_object_list(shared, src=root_rank(group), group=group)
        profile = pipeweave.Profile.from_json(shared[0])

    trials = [Trial.of_plan(c.expression, c.layers_per_stage, c.makespan)
              for c in pipeweave.tune(ranks=ranks, microbatches=microbatches, profile=profile,
                                      memory_limit=memory_limit, top=top, runtime="pytorch")]
    if classes:
        trials += [Trial.of_class(name) for name, _, _ in PYTORCH_CLASSES]
    kept: List[Trial] = []
    builts: List[Built] = []
    for trial in trials:
        try:
            builts.append(build(trial, layers, ranks, microbatches, loss_fn, group, dev, profile))
            kept.append(trial)
        except (ValueError, RuntimeError, Error):
            # A class that refuses these sizes (its constructor says why): not a candidate.
            continue
    if not kept:
        raise Error("autotune(): no candidate could be built for these sizes")
    measure(kept, builts, layers, x, y, group=group, steps=steps, rounds=rounds, budget=budget, started=started,
            contenders=float(contenders))
    measured = [t for t in kept if t.measured is not None]
    if not measured:
        raise Error("autotune(): the budget ran out before any candidate was measured")
    # Every rank computed the same figures (the step times are all-gathered); the first rank's
    # choice is shared all the same.
    choice: List[Any] = [min(range(len(kept)), key=lambda i: (kept[i].measured is None, kept[i].measured or 0.0))]
    dist.broadcast_object_list(choice, src=root_rank(group), group=group)
    calibrated = calibrate(profile, kept, ranks, microbatches, group)
    for t in kept:
        if t.kind == "pipeweave":
            t.calibrated = t.plan(ranks, microbatches, calibrated).makespan
    return Autotuned(best=kept[choice[0]], trials=kept, profile=calibrated, ranks=ranks,
                     microbatches=microbatches, planned_with=profile)
