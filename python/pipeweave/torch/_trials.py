"""Candidate schedules run in PyTorch's runtime on the user's ranks, and measured: what
`autotune` compares and what `profile(..., group=...)` calibrates from.

A `Trial` is a pipeweave plan (an expression with the cut tune chose) or one of PyTorch's own
schedule classes (on the even cut); `build` makes its schedule on this rank over the user's
layers; `measure` runs trials for a few training steps each in rotating rounds, timing every
step (the wall time from the first rank's start to the last rank's end, a barrier releasing them
together) and every compute action of every stage (F, B, I, W as the runtime calls them). The
steps run the model's real forwards and backwards; the gradients are set to None after each (no
optimizer step runs), so the parameters are as they were.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._errors import Error

__all__ = ["Trial", "Built", "PYTORCH_CLASSES", "build", "measure", "device_of", "root_rank"]

# PyTorch's own schedule classes: (name, stages per rank, placement of a rank's stages: `loop`
# (r, r + P) or `v` (r, 2P - 1 - r)).
PYTORCH_CLASSES: Tuple[Tuple[str, int, str], ...] = (
    ("Schedule1F1B", 1, "loop"),
    ("ScheduleInterleaved1F1B", 2, "loop"),
    ("ScheduleInterleavedZeroBubble", 2, "loop"),
    ("ScheduleZBVZeroBubble", 2, "v"),
    ("ScheduleDualPipeV", 2, "v"),
)


@dataclass
class Trial:
    """One candidate schedule.

    `kind`: "pipeweave" (a plan: `expression`, with `layers_per_stage` the cut, per rank's share)
    or "pytorch" (PyTorch's class `name`, on the even cut, `stages_per_rank` stages per rank placed
    `placement`). `predicted`: the step `pipeweave.tune` predicted from the profile it was given
    (None for PyTorch's classes); `calibrated`: the prediction from the profile calibrated by the
    measurements (None where not calibrated); `measured`: the median of its rounds' step medians
    (seconds; None where it was not measured); `rounds`: each round's median step; `actions`: per
    (stage, kind) the durations of the compute actions timed on this rank."""

    name: str
    kind: str
    expression: Optional[str] = None
    layers_per_stage: Optional[List[int]] = None
    predicted: Optional[float] = None
    calibrated: Optional[float] = None
    measured: Optional[float] = None
    rounds: List[float] = field(default_factory=list)
    stages_per_rank: int = 1
    placement: str = "loop"
    actions: Dict[Tuple[int, str], List[float]] = field(default_factory=dict, repr=False)

    @classmethod
    def of_class(cls, name: str) -> "Trial":
        """The trial of PyTorch's class `name` (one of `PYTORCH_CLASSES`)."""
        for known, per_rank, placement in PYTORCH_CLASSES:
            if known == name:
                return cls(name=name, kind="pytorch", stages_per_rank=per_rank, placement=placement)
        raise Error(f"unknown PyTorch schedule class {name!r}; one of {', '.join(c[0] for c in PYTORCH_CLASSES)}")

    @classmethod
    def of_plan(cls, expression: str, layers_per_stage: Optional[Sequence[int]] = None,
                predicted: Optional[float] = None) -> "Trial":
        """The trial of a pipeweave expression with a cut."""
        return cls(name=expression, kind="pipeweave", expression=expression,
                   layers_per_stage=list(layers_per_stage) if layers_per_stage else None,
                   predicted=predicted)

    def plan(self, ranks: int, microbatches: int, profile: Any) -> Any:
        """A pipeweave trial's plan as tune built it: on the profile's costs (which decide a
        search's order) with the trial's cut."""
        import pipeweave

        return pipeweave.plan(self.expression, ranks=ranks, microbatches=microbatches, profile=profile,
                              layers_per_stage=self.layers_per_stage)

    def layer_counts(self, layers: int, ranks: int, microbatches: int, profile: Any) -> List[int]:
        """Per global stage, how many of the model's `layers` it holds."""
        if self.kind == "pytorch":
            stages = ranks * self.stages_per_rank
            bounds = [(k * layers) // stages for k in range(stages + 1)]
            return [bounds[k + 1] - bounds[k] for k in range(stages)]
        from ._split import stage_layer_counts

        return stage_layer_counts(layers, self.plan(ranks, microbatches, profile), self.layers_per_stage)


@dataclass
class Built:
    """A trial's schedule on this rank: the schedule, this rank's `PipelineStage`s, the stage
    indices it holds (`mine`) and the pipeline's stage count."""

    schedule: Any
    stages: List[Any]
    mine: List[int]
    num_stages: int

    def ends(self, x: Any, y: Any) -> Tuple[Tuple[Any, ...], Any]:
        """`schedule.step`'s inputs and target on this rank: `x` where it holds the first stage,
        `y` where it holds the last."""
        return ((x,) if 0 in self.mine else ()), (y if self.num_stages - 1 in self.mine else None)

    def step(self, x: Any, y: Any, losses: Optional[List[Any]] = None) -> Any:
        """One training step on the batch `x` with target `y` (given on every rank; each rank
        passes what its stages take), the last stage's microbatch losses appended to `losses`."""
        inputs, target = self.ends(x, y)
        return self.schedule.step(*inputs, target=target, losses=losses)


def device_of(layers: Sequence[torch.nn.Module]) -> torch.device:
    """Where the layers' parameters are (CPU for layers without any)."""
    for layer in layers:
        for p in layer.parameters():
            return p.device
    return torch.device("cpu")


def root_rank(group: Any) -> int:
    """The global rank of the group's first rank (the one that decides and shares)."""
    import torch.distributed as dist

    return 0 if group is None else dist.get_global_rank(group, 0)


def _stage_indices(rank: int, ranks: int, per_rank: int, placement: str) -> List[int]:
    if per_rank == 1:
        return [rank]
    if placement == "loop":
        return [rank + k * ranks for k in range(per_rank)]
    return [rank, 2 * ranks - 1 - rank]


def _even_modules(layers: Sequence[torch.nn.Module], stages: int) -> List[torch.nn.Sequential]:
    n = len(layers)
    if n < stages:
        raise Error(f"the model has {n} layers, fewer than the {stages} stages of the schedule")
    bounds = [(k * n) // stages for k in range(stages + 1)]
    return [torch.nn.Sequential(*layers[bounds[k]:bounds[k + 1]]) for k in range(stages)]


def build(trial: Trial, layers: Sequence[torch.nn.Module], ranks: int, microbatches: int,
          loss_fn: Callable[..., torch.Tensor], group: Any, device: torch.device, profile: Any) -> Built:
    """`trial`'s schedule on this rank, its stages over `layers` (the same objects), a pipeweave
    plan built as tune built it on `profile`. Raises what a class's constructor raises for sizes
    it refuses."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S

    from ._schedule import schedule
    from ._split import split

    rank = dist.get_rank(group)
    if trial.kind == "pytorch":
        stages = ranks * trial.stages_per_rank
        modules = _even_modules(layers, stages)
        mine = _stage_indices(rank, ranks, trial.stages_per_rank, trial.placement)
        built = [PipelineStage(modules[s], s, stages, device, group=group) for s in mine]
        cls = getattr(S, trial.name)
        first = built[0] if trial.stages_per_rank == 1 else built
        return Built(cls(first, microbatches, loss_fn=loss_fn), built, mine, stages)
    plan = trial.plan(ranks, microbatches, profile)
    modules = split(list(layers), plan, layers_per_stage=trial.layers_per_stage)
    mine = plan.stages_on(rank)
    built = [PipelineStage(modules[s], s, plan.stages, device, group=group) for s in mine]
    return Built(schedule(plan, built, loss_fn=loss_fn, rank=rank), built, mine, plan.stages)


class _ActionTimer:
    """While on, times each compute action of a rank's stages: per (stage, kind) the durations
    of the runtime's calls (F, B, I, W). Set as instance attributes, which `pwt.schedule` keeps
    (and calls) under its own per-step wrappers."""

    NAMES = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")

    def __init__(self, stages: Sequence[Any], durations: Dict[Tuple[int, str], List[float]]) -> None:
        self.stages = list(stages)
        self.durations = durations
        self.on = False

    def install(self) -> None:
        for stage in self.stages:
            for name in self.NAMES:
                setattr(stage, name, self._wrap(stage.stage_index, name, getattr(stage, name)))

    def uninstall(self) -> None:
        for stage in self.stages:
            for name in self.NAMES:
                stage.__dict__.pop(name, None)

    def _wrap(self, index: int, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(mb: int, *args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return call(mb, *args, **kwargs)
            t0 = time.perf_counter()
            out = call(mb, *args, **kwargs)
            elapsed = time.perf_counter() - t0
            if name == "forward_one_chunk":
                kind = "F"
            elif name == "backward_weight_one_chunk":
                kind = "W"
            else:
                full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
                kind = "B" if full else "I"
            self.durations.setdefault((index, kind), []).append(elapsed)
            return out

        return timed


def _step_seconds(built: Built, x: Any, y: Any, layers: Sequence[torch.nn.Module], group: Any) -> float:
    """One training step, the wall time from the first rank's start to the last rank's end."""
    import torch.distributed as dist

    dist.barrier(group=group)
    t0 = time.perf_counter()
    built.step(x, y, losses=[])
    t1 = time.perf_counter()
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    ends: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(ends, (t0, t1), group=group)
    return max(e[1] for e in ends) - min(e[0] for e in ends)


def measure(trials: Sequence[Trial], builts: Sequence[Built], layers: Sequence[torch.nn.Module], x: Any, y: Any,
            *, group: Any, steps: int, rounds: int, budget: float, started: float,
            contenders: Optional[float] = None) -> None:
    """Runs each trial `steps` timed steps (after one warm-up) per round, in rounds whose order
    rotates, until `rounds` are done or `budget` seconds have passed since `started` (a round
    under way is finished; every rank stops after the same round). With `contenders` (e.g. 0.1),
    a round after the first runs only the trials within that share of the fastest so far (by the
    medians of the rounds each ran), so the budget goes to telling the close ones apart; every
    rank drops the same ones (the step times are gathered). Fills each trial's `rounds`,
    `measured` and `actions`."""
    import torch.distributed as dist

    timers = [_ActionTimer(b.stages, t.actions) for t, b in zip(trials, builts)]
    for timer in timers:
        timer.install()
    try:
        running = list(range(len(trials)))
        for r in range(rounds):
            order = running[r % len(running):] + running[:r % len(running)]
            for i in order:
                _step_seconds(builts[i], x, y, layers, group)  # warm-up
                timers[i].on = True
                runs = [_step_seconds(builts[i], x, y, layers, group) for _ in range(steps)]
                timers[i].on = False
                trials[i].rounds.append(statistics.median(runs))
            spent: List[Any] = [time.perf_counter() - started]
            dist.broadcast_object_list(spent, src=root_rank(group), group=group)
            if spent[0] > budget:
                break
            if contenders is not None:
                so_far = {i: statistics.median(trials[i].rounds) for i in running}
                fastest = min(so_far.values())
                running = [i for i in running if so_far[i] <= fastest * (1.0 + contenders)]
    finally:
        for timer in timers:
            timer.uninstall()
    for trial in trials:
        if trial.rounds:
            trial.measured = statistics.median(trial.rounds)
