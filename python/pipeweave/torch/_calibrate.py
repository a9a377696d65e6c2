"""A profile fed back with what the runtime measured: the costs of the runtime, not of a layer sum.

Layers timed one at a time on a quiet core run faster than the same layers inside a stage of a
running pipeline (their data is cold, the other ranks share the caches and the memory bus): on
the bench machine the layer sums came out 25-35% below the steps. `calibrate` scales each layer
by what trials measured in the runtime (`_trials.measure`): per stage and kind of action (F, B,
I, W), the median duration the runtime took over the sum of the stage's layers in the profile
(each layer keeps its share; F and B from every trial, I and W from pipeweave's plans only, as
PyTorch's classes split the backward their own way), the medians over the trials and ranks that
held a layer. Then the seconds the runtime adds to each action (`action_seconds`: its calls, the
messages' waits) are fitted so that the calibrated predictions of the measured plans match their
measured steps (their median error zero). The result is marked `calibrated`.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Sequence, Tuple

from ._trials import Trial

__all__ = ["calibrate", "ACTION_LADDER"]

# The action costs tried when fitting `action_seconds` (seconds): 0 to 4 ms by 0.1 ms.
ACTION_LADDER = tuple(k * 1e-4 for k in range(41))

_KEYS = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight_grad"}


def calibrate(profile: Any, trials: Sequence[Trial], ranks: int, microbatches: int, group: Any) -> Any:
    """`profile` scaled to what `trials` measured on this group's ranks (see the module
    docstring): every rank gathers every rank's action times, so every rank gets the same
    profile. Trials that were not measured are left out; a layer no trial timed keeps its figures."""
    import torch.distributed as dist

    import pipeweave

    doc = profile.data
    count = len(doc["layers"])
    mine: List[Tuple[int, str, float]] = []
    for trial in trials:
        if trial.measured is None:
            continue
        counts = trial.layer_counts(count, ranks, microbatches, profile)
        starts = [sum(counts[:k]) for k in range(len(counts))]
        for (stage, kind), durations in trial.actions.items():
            if not durations or (kind in ("I", "W") and trial.kind != "pipeweave"):
                continue
            members = range(starts[stage], starts[stage] + counts[stage])
            key = _KEYS[kind]
            alone = sum(doc["layers"][j].get(key) or 0.0 for j in members)
            if alone <= 0.0:
                continue
            factor = statistics.median(durations) / alone
            mine.extend((j, key, factor) for j in members)
    gathered: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    factors: Dict[Tuple[int, str], List[float]] = {}
    for part in gathered:
        for j, key, factor in part:
            factors.setdefault((j, key), []).append(factor)
    layers = []
    for j, layer in enumerate(doc["layers"]):
        layer = dict(layer)
        for key in _KEYS.values():
            found = factors.get((j, key))
            if found and layer.get(key) is not None:
                layer[key] = layer[key] * statistics.median(found)
        layers.append(layer)
    scaled = dict(doc, layers=layers, calibrated=True, runtime="pytorch")
    plans = [t for t in trials if t.kind == "pipeweave" and t.measured is not None]
    if plans:
        best: Tuple[float, float] = (float("inf"), 0.0)
        for action in ACTION_LADDER:
            candidate = pipeweave.Profile(dict(scaled, action_seconds=action))
            errors = [t.plan(ranks, microbatches, candidate).makespan / t.measured - 1.0 for t in plans]
            best = min(best, (abs(statistics.median(errors)), action))
        scaled["action_seconds"] = best[1]
    return pipeweave.Profile(scaled)
