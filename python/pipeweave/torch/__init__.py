"""pipeweave.torch: pipeweave plans run by PyTorch's pipelining runtime.

    import pipeweave, pipeweave.torch as pwt
    plan = pipeweave.plan("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", ranks=P, microbatches=M)
    parts = pwt.split(layers, plan)                                   # one nn.Sequential per stage
    stages = [PipelineStage(parts[s], s, plan.stages, device, group=pp_group)
              for s in plan.stages_on(rank)]
    schedule = pwt.schedule(plan, stages, loss_fn=loss_fn)            # a torch.distributed.pipelining schedule
    schedule.step(x, target=y, losses=losses)                         # as PyTorch's own schedules

- `schedule(plan, stages, *, loss_fn, rank=None, scale_grads=True, **runtime_kwargs)`: the plan's
  order lowered in memory by PyTorch's own passes (communication, FSDP UNSHARD/RESHARD, gradient
  reduction) and run by `_PipelineScheduleRuntime`; the plan's recomputes and offloads are carried
  out per (stage, microbatch). DualPipe's two routes raise `pipeweave.Error` naming DualPipeV.
- `SavedActivationMeter`: bytes of saved activations alive on the device (and offloaded to the
  host), with peaks; `activation_bytes(module, *inputs)`: what one forward saves;
  `weight_grad_bytes(module, *inputs)`: what its split backward keeps from I to W.
- Split backwards (an I and a W) cost what the full backward costs: I runs the whole backward but
  the linear layers' weight gradients and keeps each one's input and output gradient, W computes
  those (`_weight_grad`); `splittable(module)` says whether a stage's modules allow it (linear
  layers, norms, biases, embeddings), else PyTorch's own autograd split runs.
- `profile(layers, example_input, *, loss_fn, target=None, repeats=5, device=None, group=None,
  batch=None, microbatches=None)`: per layer F, the full B, the split's I and W seconds and
  activation bytes, and one send, as a `pipeweave.Profile`; with `group` the runtime's (calibrated
  by short runs on the ranks).
- `autotune(layers, x, y, *, loss_fn, microbatches, ...)`: tune's best candidates and PyTorch's
  classes measured on the ranks; the fastest measured, the same on every rank (`Autotuned`:
  `best`, `trials` with predicted and measured steps, the calibrated `profile`, `build`).
- `split(layers, plan)`: the model's layers cut into the plan's stages.
- `overlap(schedule, trace=False)`: the plan's overlapped F;B pairs (DualPipeV's `OVERLAP_F_B`)
  run with one microbatch's forward and the other's backward interleaved phase by phase, the
  all-to-alls asynchronous, for stages of mixture-of-experts blocks described by their phases
  (`MoePhases`; `phased_moe(layer, group)` for transformers' Mixtral and Qwen2-MoE layers, experts
  over an expert-parallel group, the tokens `replicated` over it (one device's bits) or `split`,
  then `average_expert_parallel_grads(modules, group)` after the step).

Supported PyTorch: 2.6 or later (the contract's floor; `pip install './python[torch]'`), tested with
2.15 on CPU (gloo), plain and FSDP-wrapped (`fully_shard`) stages. The schedule uses the runtime's
private in-memory loader (`_prepare_schedule_with_comms`, or `_load_actions` where older releases
call it that) and wraps the stages' `forward_one_chunk`, `forward_maybe_with_nosync`,
`backward_one_chunk` and `backward_weight_one_chunk` for the length of each `step`; overlapped
F;B pairs (DualPipeV) need a release whose runtime has `OVERLAP_F_B`. Only 2.15 is tested.
"""

from ._autotune import Autotuned, Trial, autotune
from ._memory import SavedActivationMeter, activation_bytes
from ._moe import MoePhases, Routed, average_expert_parallel_grads, phased_moe
from ._overlap import Overlap, overlap
from ._profile import profile
from ._schedule import DUALPIPE_V, PlanSchedule, lower_plan, schedule
from ._split import split, stage_layer_counts
from ._weight_grad import splittable, weight_grad_bytes

__all__ = [
    "Autotuned",
    "DUALPIPE_V",
    "MoePhases",
    "Overlap",
    "PlanSchedule",
    "Routed",
    "SavedActivationMeter",
    "Trial",
    "activation_bytes",
    "autotune",
    "average_expert_parallel_grads",
    "lower_plan",
    "overlap",
    "phased_moe",
    "profile",
    "schedule",
    "split",
    "splittable",
    "stage_layer_counts",
    "weight_grad_bytes",
]
