"""`profile(layers, example_input, loss_fn=...)`: a PyTorch model's measured layer costs, in the
profile format `pipeweave plan/tune --profile` read (`pipeweave-profile/2`).

Per layer, with the layers run one after another on `example_input` (one microbatch):
- `forward`: seconds of its forward (the last layer's includes the loss);
- `input_grad`: seconds of the gradient with respect to its input only, as PyTorch's
  `stage_backward_input` computes it for a stage (the graph kept for the weight gradient);
- `weight_grad`: seconds of its weight gradients from there, as `stage_backward_weight`;
- `activation_bytes`: bytes of the tensors its forward saves for the backward (saved-tensor hooks;
  once per storage; its parameters left out). Its input counts where the layer saves it (inside a
  stage it is the previous layer's activation), so a stage's sum is `SavedActivationMeter`'s count
  of it plus the stage's input where its first layer saves that;
- `weight_grad_bytes`: of those, the bytes still alive after the input gradient, kept until W.
Times are medians over `repeats` runs after one warm-up run: CUDA events on a GPU, `perf_counter`
on CPU. `send`: the seconds to send the largest activation between two layers (the tensor a stage
sends): on CPU measured with gloo, a send and a receive between two process groups of this
process over loopback TCP (the transport of a CPU pipeline, without the second process); on CUDA
estimated by a device-to-device copy of that many bytes (a lower bound of NCCL's send).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch

from .._profile import Profile
from ._memory import LEDGER, SavedActivationMeter

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
    `any`)."""
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
        forward_s: List[float] = []
        input_s: List[float] = []
        weight_s: List[float] = []
        act_bytes = wg_bytes = 0
        for run in range(repeats + 1):
            inp = _as_input(inputs[index])
            flat_inputs = _tensors(inp)
            meter = SavedActivationMeter([layer], hooks=True)

            def forward() -> Any:
                with meter:
                    out = layer(*inp) if isinstance(inp, tuple) else layer(inp)
                if index == last:
                    loss = loss_fn(out, target) if target is not None else loss_fn(out)
                    return out, loss
                return out, None

            with torch.enable_grad():
                before = LEDGER.device_bytes
                seconds, (out, loss) = clock.time(forward)
                held_f = LEDGER.device_bytes - before
                if index == last:
                    roots, grads = loss, None
                else:
                    roots = out
                    grads = [torch.randn_like(t) for t in _tensors(out)]
                    send_bytes = max(send_bytes, sum(t.numel() * t.element_size() for t in _tensors(out)))
                outputs = roots if isinstance(roots, tuple) else (roots,)
                i_seconds, state = clock.time(lambda: _backward_input(tuple(outputs), grads, flat_inputs, layer))
                del outputs, roots, out, loss
                held_w = LEDGER.device_bytes - before
                w_seconds, _ = clock.time(lambda: _backward_weight(state, layer))
                del state
            if run == 0:
                continue  # warm-up
            forward_s.append(seconds)
            input_s.append(i_seconds)
            weight_s.append(w_seconds)
            act_bytes, wg_bytes = max(act_bytes, held_f), max(wg_bytes, held_w)
        records.append(
            {
                "name": str(index),
                "placement": "any",
                "forward": statistics.median(forward_s),
                "input_grad": statistics.median(input_s),
                "weight_grad": statistics.median(weight_s),
                "activation_bytes": int(act_bytes),
                "weight_grad_bytes": int(min(wg_bytes, act_bytes)),
            }
        )
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
    }
    return Profile(document)
