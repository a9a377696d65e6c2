"""`profile(layers, example_input, loss_fn=...)`: a PyTorch model's measured layer costs, in the
profile format `pipeweave plan/tune --profile` read (`pipeweave-profile/2`), as PyTorch's runtime
runs them through `pipeweave.torch.schedule`.

Per layer, with the layers run one after another on `example_input` (one microbatch):
- `forward`: seconds of its forward (the last layer's includes the loss);
- `backward`: seconds of its full backward, as a stage whose backward is not split runs it;
- `input_grad` and `weight_grad`: seconds of its split backward as the schedule runs it:
  pipeweave's split (`_weight_grad`: the I runs the whole backward but the linear layers' weight
  gradients, the W computes those) where the layer's modules allow it (`pwt.splittable`), else
  PyTorch's (`stage_backward_input`, then `stage_backward_weight`);
- `activation_bytes`: bytes of the tensors its forward saves for the backward (saved-tensor hooks;
  once per storage; its parameters left out). Its input counts where the layer saves it (inside a
  stage it is the previous layer's activation), so a stage's sum is `SavedActivationMeter`'s count
  of it plus the stage's input where its first layer saves that;
- `weight_grad_bytes`: the bytes its split's I keeps until the W, counted alike (pipeweave's: each
  linear layer's input and output gradient, which may be more than the forward saved; PyTorch's:
  what its input gradient leaves of the graph).
Times are medians over `repeats` runs after one warm-up run: CUDA events on a GPU, `perf_counter`
on CPU. `send`: the seconds to send the largest activation between two layers (the tensor a stage
sends): on CPU measured with gloo, a send and a receive between two process groups of this
process over loopback TCP (the transport of a CPU pipeline, without the second process); on CUDA
estimated by a device-to-device copy of that many bytes (a lower bound of NCCL's send).
`runtime` is `pytorch`; `action_seconds` (what the runtime adds to each compute action) is left
to a measurement of the runtime itself (`pwt.autotune`'s).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
import types
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import torch

from .._profile import Profile
from . import _weight_grad
from ._memory import LEDGER, SavedActivationMeter, storage_key

__all__ = ["profile", "FORMAT"]

FORMAT = "pipeweave-profile/2"

_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
}


class _Clock:
    """Times a callable: CUDA events on a CUDA device, `perf_counter` otherwise."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def time(self, fn: Callable[[], Any]) -> "tuple[float, Any]":
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1000.0, out
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out


class _LayerSplit:
    """How the runtime splits one layer's backward, measured: pipeweave's split
    (`_weight_grad`: I runs the whole backward but the linear layers' weight gradients, W those)
    where the layer allows it, else PyTorch's (`stage_backward_input`, then
    `stage_backward_weight`; a layer whose input needs no gradient, as a first stage's token ids,
    runs its whole backward as the W, as PyTorch's first stage does)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        self.layer = layer
        self.ours = _weight_grad.splittable(layer)[0]
        self.holder = types.SimpleNamespace(submod=layer, dw_builder=None)
        self.install: Optional[_weight_grad.Installed] = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if not self.ours:
            yield
            return
        self.install = _weight_grad.install(self.holder)
        try:
            yield
        finally:
            _weight_grad.uninstall(self.install)
            self.install = None

    def input_grad(self, outputs: Any, grads: Any, inputs: List[torch.Tensor], count_inputs: bool = False) -> Any:
        """The I; returns what the W needs (what it keeps of `inputs` not counted by a meter
        unless `count_inputs`)."""
        if self.install is not None:
            stash = self.install.stash
            stash.inputs = set() if count_inputs else {k for k in (storage_key(t) for t in inputs) if k is not None}
            stash.backward = stash.capturing = True
            try:
                torch.autograd.backward(list(outputs), grads)
            finally:
                stash.backward = stash.capturing = False
            return ("ours", self.holder.dw_builder())
        return _backward_input(outputs, grads, inputs, self.layer)

    def kept_bytes_of(self, forward: Callable[[Any], Any], inp: Any) -> int:
        """The bytes this split's I keeps for its W after one forward of `inp` (its input counted
        where kept, as `activation_bytes` counts it where saved), counted as
        `SavedActivationMeter` counts them."""
        flat = _tensors(inp)
        with self.installed():
            if self.install is not None:
                # As a metered schedule runs a split stage: inputs saved through the hooks.
                self.install.stash.tracked = True
            with SavedActivationMeter([self.layer], hooks=True):
                before = LEDGER.device_bytes
                outputs, grads = forward(inp)
                state = self.input_grad(outputs, grads, flat, count_inputs=True)
                del outputs, grads
                kept = LEDGER.device_bytes - before
            self.weight_grad(state)
            del state
        return int(max(kept, 0))

    def weight_grad(self, state: Any) -> None:
        if state[0] == "ours":
            state[1]()
        else:
            _backward_weight(state, self.layer)


def _backward_input(out: Any, grads: Any, inputs: List[torch.Tensor], layer: torch.nn.Module) -> Any:
    """The input gradient as PyTorch's stage_backward_input; returns what W needs."""
    try:
        from torch.distributed.pipelining._backward import stage_backward_input
    except ImportError:  # pragma: no cover
        stage_backward_input = None
    outputs = out if isinstance(out, tuple) else (out,)
    if not any(t.requires_grad for t in inputs):
        # No input gradient (token ids): as PyTorch's first stage, W runs the whole backward.
        return ("graph", (outputs, grads))
    if stage_backward_input is not None:
        _, param_groups = stage_backward_input(list(outputs), grads, inputs, layer.parameters())
        return ("groups", param_groups)
    wanted = [t for t in inputs if t.requires_grad]
    if wanted:
        torch.autograd.grad(outputs, wanted, grad_outputs=grads, retain_graph=True, allow_unused=True)
    return ("graph", (outputs, grads))


def _backward_weight(state: Any, layer: torch.nn.Module) -> None:
    """The weight gradients from what `_backward_input` kept, as stage_backward_weight."""
    kind, value = state
    params = [p for p in layer.parameters() if p.requires_grad]
    if kind == "groups":
        from torch.distributed.pipelining._backward import stage_backward_weight

        stage_backward_weight(iter(params), value)
    elif params:
        outputs, grads = value
        torch.autograd.grad(outputs, params, grad_outputs=grads, allow_unused=True)


def _send_seconds(nbytes: int, device: torch.device, repeats: int) -> float:
    """Seconds to send `nbytes`: gloo between two process groups of this process on CPU, a
    device-to-device copy on CUDA."""
    nbytes = max(int(nbytes), 1)
    if device.type == "cuda":
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        clock = _Clock(device)
        dst.copy_(src)
        return statistics.median(clock.time(lambda: dst.copy_(src))[0] for _ in range(repeats))
    import torch.distributed as dist

    store = dist.HashStore()
    groups: Dict[int, Any] = {}
    errors: List[BaseException] = []

    def make(rank: int) -> None:
        try:
            groups[rank] = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=30))
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors or len(groups) != 2:
        raise RuntimeError(f"could not make two gloo groups to time a send: {errors}")
    src = torch.empty(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)

    def once() -> float:
        receiver = threading.Thread(target=lambda: groups[1].recv([dst], 0, 0).wait())
        t0 = time.perf_counter()
        receiver.start()
        groups[0].send([src], 1, 0).wait()
        receiver.join()
        return time.perf_counter() - t0

    once()
    return statistics.median(once() for _ in range(repeats))


def _model_fields(layers: Sequence[torch.nn.Module], example_input: Any) -> Dict[str, Any]:
    names: List[str] = []
    for layer in layers:
        name = type(layer).__name__
        if name not in names:
            names.append(name)
    dtype = "f32"
    for layer in layers:
        for p in layer.parameters():
            if p.is_floating_point():
                dtype = _DTYPES.get(p.dtype, str(p.dtype).replace("torch.", ""))
                break
        else:
            continue
        break
    seq_len = microbatch = None
    if isinstance(example_input, torch.Tensor) and example_input.dim() >= 1:
        microbatch = int(example_input.shape[0])
        if example_input.dim() >= 3 or (example_input.dim() == 2 and not example_input.is_floating_point()):
            seq_len = int(example_input.shape[1])
    return {"name": "+".join(names), "seq_len": seq_len, "microbatch_size": microbatch, "dtype": dtype}


def _as_input(value: Any) -> Any:
    """A layer's input for the measurement: detached, requiring grad where it is floating."""
    if isinstance(value, torch.Tensor):
        out = value.detach()
        if out.is_floating_point():
            out.requires_grad_(True)
        return out
    if isinstance(value, tuple):
        return tuple(_as_input(v) for v in value)
    return value


def _tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_move(v, device) for v in value)
    return value


def profile(
    layers: Sequence[torch.nn.Module],
    example_input: Any,
    *,
    loss_fn: Callable[..., torch.Tensor],
    target: Any = None,
    repeats: int = 5,
    device: Optional[Union[str, torch.device]] = None,
    group: Any = None,
    batch: Any = None,
    microbatches: Optional[int] = None,
) -> Profile:
    """Measures each layer of a model and returns its profile, a `pipeweave.Profile`.

    `layers`: the model as an ordered list of modules (an `nn.Sequential` works): the first takes
    `example_input`, each the previous one's output (a tuple is passed as positional arguments),
    the last gives the output `loss_fn` reads. `example_input`: one microbatch's input. `loss_fn`:
    `loss_fn(output, target)` (or `loss_fn(output)` when `target` is None), a scalar.
    `target`: one microbatch's target. `repeats`: timed runs per measurement (the median is
    kept), after one warm-up run. `device`: where to run (default: the layers' device).

    The layers are moved to `device` and their gradients are left as they were (the measurement's
    weight gradients are discarded). See the module docstring for what each field is and how the
    send is measured. The profile's `layers_per_stage` counts every layer (all are `placement`
    `any`).

    With `group` (a process group of the pipeline's ranks; call it on every one of them), the
    profile is the runtime's: the layers are timed on the group's first rank, then every rank
    runs `batch` (`(x, y)`, all `microbatches` microbatches, on every rank) through PyTorch's
    `Schedule1F1B` and pipeweave's `zero_bubble(f1b(gpipe))` for a few steps, and the layers are
    scaled to what those runs measured, with the runtime's cost per action fitted
    (`pwt._calibrate`; the profile says `calibrated`). Every rank returns the same profile."""
    if group is not None or batch is not None or microbatches is not None:
        return _in_runtime(layers, example_input, loss_fn=loss_fn, target=target, repeats=repeats,
                           device=device, group=group, batch=batch, microbatches=microbatches)
    layers = list(layers)
    if not layers:
        raise ValueError("profile() needs at least one layer")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if device is None:
        device = next((p.device for layer in layers for p in layer.parameters()), torch.device("cpu"))
    device = torch.device(device)
    for layer in layers:
        layer.to(device)
    example_input = _move(example_input, device)
    target = _move(target, device)
    clock = _Clock(device)
    saved_grads = {id(p): p.grad for layer in layers for p in layer.parameters()}

    # The inputs each layer sees, from one forward without a graph.
    inputs: List[Any] = []
    with torch.no_grad():
        value = example_input
        for layer in layers:
            inputs.append(value)
            value = layer(*value) if isinstance(value, tuple) else layer(value)

    records: List[Dict[str, Any]] = []
    send_bytes = 0
    last = len(layers) - 1
    for index, layer in enumerate(layers):
        split = _LayerSplit(layer)

        def forward(inp: Any) -> Any:
            out = layer(*inp) if isinstance(inp, tuple) else layer(inp)
            if index == last:
                loss = loss_fn(out, target) if target is not None else loss_fn(out)
                return (loss,), None
            outputs = tuple(_tensors(out))
            return outputs, [torch.ones_like(t) for t in outputs]

        times: Dict[str, List[float]] = {"forward": [], "backward": [], "input_grad": [], "weight_grad": []}
        with torch.enable_grad():
            for run in range(repeats + 1):
                # The forward and the full backward, as a stage whose backward is not split runs them.
                inp = _as_input(inputs[index])
                f_seconds, (outputs, grads) = clock.time(lambda: forward(inp))
                b_seconds, _ = clock.time(lambda: torch.autograd.backward(list(outputs), grads))
                del outputs, grads
                # The split as the runtime runs it: pipeweave's (the forward with the weight
                # gradients deferred) where the layer allows it, else PyTorch's.
                inp = _as_input(inputs[index])
                with split.installed():
                    outputs, grads = forward(inp)
                    i_seconds, state = clock.time(lambda: split.input_grad(outputs, grads, _tensors(inp)))
                    del outputs, grads
                    w_seconds, _ = clock.time(lambda: split.weight_grad(state))
                    del state
                if run == 0:
                    continue  # warm-up
                for key, value in (("forward", f_seconds), ("backward", b_seconds),
                                   ("input_grad", i_seconds), ("weight_grad", w_seconds)):
                    times[key].append(value)
            # The bytes, once: what the forward saves, and what the split's I keeps for the W
            # (the layer's input counted where it is saved or kept: inside a stage, it is the
            # previous layer's activation).
            inp = _as_input(inputs[index])
            with SavedActivationMeter([layer], hooks=True):
                before = LEDGER.device_bytes
                outputs, grads = forward(inp)
                act_bytes = LEDGER.device_bytes - before
            if index != last:
                send_bytes = max(send_bytes, sum(t.numel() * t.element_size() for t in outputs))
            del outputs, grads
            wg_bytes = split.kept_bytes_of(forward, _as_input(inputs[index]))
        record: Dict[str, Any] = {"name": str(index), "placement": "any"}
        record.update({key: statistics.median(values) for key, values in times.items()})
        record.update({"activation_bytes": int(act_bytes), "weight_grad_bytes": int(wg_bytes)})
        records.append(record)
    for layer in layers:
        for p in layer.parameters():
            p.grad = saved_grads.get(id(p))
    if send_bytes == 0:
        send_bytes = sum(t.numel() * t.element_size() for t in _tensors(example_input))
    document = {
        "format": FORMAT,
        "model": _model_fields(layers, example_input),
        "threads_per_rank": torch.get_num_threads(),
        "repeats": int(repeats),
        "calibrated": False,
        "layers": records,
        "send": {"bytes": int(send_bytes), "seconds": _send_seconds(send_bytes, device, repeats)},
        "runtime": "pytorch",
    }
    return Profile(document)


def _in_runtime(layers: Sequence[torch.nn.Module], example_input: Any, *, loss_fn: Callable[..., torch.Tensor],
                target: Any, repeats: int, device: Any, group: Any, batch: Any,
                microbatches: Optional[int]) -> Profile:
    """`profile(..., group=...)`: the layers timed on the group's first rank, shared, then
    calibrated by short runs of PyTorch's 1F1B and a pipeweave zero-bubble plan."""
    import torch.distributed as dist

    from .._errors import Error
    from ._calibrate import calibrate
    from ._trials import Trial, build, device_of, measure, root_rank

    if batch is None or microbatches is None:
        raise Error("profile(group=...) needs batch=(x, y) and microbatches= to run the runtime")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise Error(f"profile(): microbatches must be a whole number >= 1, got {microbatches!r}")
    if not dist.is_initialized():
        raise Error("profile(group=...) runs on the pipeline's ranks: initialise torch.distributed first")
    layers = list(layers)
    dev = torch.device(device) if device is not None else device_of(layers)
    shared: List[Any] = [None]
    if dist.get_rank(group) == 0:
        shared[0] = profile(layers, example_input, loss_fn=loss_fn, target=target, repeats=repeats,
                            device=dev).to_json()
    dist.broadcast_object_list(shared, src=root_rank(group), group=group)
    base = Profile.from_json(shared[0])
    x, y = batch
    ranks = dist.get_world_size(group)
    trials = [Trial.of_class("Schedule1F1B"), Trial.of_plan("zero_bubble(f1b(gpipe))")]
    builts = [build(t, layers, ranks, microbatches, loss_fn, group, dev, base) for t in trials]
    measure(trials, builts, layers, x, y, group=group, steps=2, rounds=1, budget=float("inf"),
            started=time.perf_counter())
    return calibrate(base, trials, ranks, microbatches, group)
