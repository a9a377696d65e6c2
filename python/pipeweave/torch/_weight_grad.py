"""A split backward that costs what the full backward costs: the input-gradient backward (I) runs
the stage's whole autograd backward except the weight gradients of its linear layers, and keeps,
for each of them, what that gradient needs (the layer's input and its output gradient), as
DualPipe's `WeightGradStore` and Megatron's `delay_wgrad_compute` do; the weight-gradient backward
(W) computes those gradients from what was kept, with the same kernels autograd would run.

PyTorch's own split (`stage_backward_input`, then `stage_backward_weight`) walks the autograd graph
twice and keeps it between the two; on CPU it costs about 1.45x the full backward. Here the
graph is walked once, in I.

What is deferred: the weights of `torch.nn.Linear` and of transformers' `Conv1D` (GPT-2's
projections), whose forward runs through `DeferredLinear` while the stage is installed (a
subclass that computes otherwise, a LoRA or quantized layer, is a module this does not know). The
other parameters a stage may hold and still be split this way are those of modules whose
gradients cost what an elementwise op costs, computed in I as autograd computes them: norms and
biases (every parameter at most one-dimensional) and embeddings (`torch.nn.Embedding`). A stage
with any other parameter (a module this does not know) is left to PyTorch's autograd split
(`splittable` says which).

Use: `install(stage)` (`pipeweave.torch.schedule` does it for the stages its plan splits) sets the
stage's `dw_builder`, which PyTorch's runtime calls after each I for the closure its W runs, and
reroutes the linear layers' forwards; `uninstall` puts both back. While `capturing`, the backward
defers; otherwise (a full backward B, a recompute) the weight gradients are computed at once.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from ._memory import LEDGER, storage_key, storage_nbytes

__all__ = [
    "WeightGradStash", "DeferredLinear", "splittable", "install", "uninstall", "deferrable_modules",
    "weight_grad_bytes",
]


def _conv1d_type() -> Optional[type]:
    """transformers' `Conv1D`, where transformers is installed."""
    try:
        from transformers.pytorch_utils import Conv1D
    except Exception:  # transformers missing or broken: no Conv1D to defer
        return None
    return Conv1D


_CONV1D = _conv1d_type()


def _plain(module: torch.nn.Module, base: type) -> bool:
    """Whether `module` is a `base` that computes as `base` does: its class's forward is
    `base`'s (FSDP's wrapper classes keep it; a subclass that overrides it, a LoRA or quantized
    layer, does not) and no forward of its own was set on it."""
    return (
        isinstance(module, base)
        and type(module).forward is base.forward
        and "forward" not in module.__dict__
    )


def _is_linear(module: torch.nn.Module) -> bool:
    return _plain(module, torch.nn.Linear)


def _is_conv1d(module: torch.nn.Module) -> bool:
    return _CONV1D is not None and _plain(module, _CONV1D)


def deferrable_modules(root: torch.nn.Module) -> List[torch.nn.Module]:
    """The modules under `root` whose weight gradients I defers to W."""
    return [m for m in root.modules() if _is_linear(m) or _is_conv1d(m)]


def _cheap(module: torch.nn.Module) -> bool:
    """Whether `module`'s own parameters have gradients as cheap as an elementwise op."""
    own = list(module.parameters(recurse=False))
    return isinstance(module, torch.nn.Embedding) or all(p.dim() <= 1 for p in own)


def splittable(root: torch.nn.Module) -> Tuple[bool, str]:
    """Whether a stage's module can be split here: every parameter belongs to a linear layer or a
    module with cheap gradients; else the first one that does not, named."""
    for name, module in root.named_modules():
        if _is_linear(module) or _is_conv1d(module) or _cheap(module):
            continue
        params = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if params:
            where = f"{name}.{params[0]}" if name else params[0]
            return False, f"{where} ({type(module).__name__}) is not a linear layer, norm, bias or embedding"
    return True, ""


class _Entry:
    """One deferred weight gradient: the layer's weight, its input and its output gradient, and
    whether the weight is a Conv1D's (stored transposed)."""

    __slots__ = ("weight", "x", "grad", "conv1d")

    def __init__(self, weight: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, conv1d: bool) -> None:
        self.weight, self.x, self.grad, self.conv1d = weight, x, grad, conv1d


class Kept:
    """What one I kept for its W: the entries, the storages counted for the activation meter, and
    while offloaded the host copies (the plan's `OFFLOAD` after the I, `RELOAD` before the W)."""

    def __init__(self, entries: List[_Entry], counted: Set[Any], inputs: Set[Any]) -> None:
        self.entries = entries
        # Device storages this object counts in the ledger (once each), by key.
        self.counted = counted
        # The stage's inputs among them: never counted, never moved (the meter's rule).
        self.inputs = inputs
        # While offloaded: per tensor slot (entry index, "x" or "grad"), its host copy and how to
        # rebuild the tensor; None on the device.
        self.host: Optional[Dict[Tuple[int, str], Tuple[torch.Tensor, Any]]] = None

    def weight_gradients(self) -> None:
        """Computes the kept weight gradients (reloading first if the plan did not) and lets go.
        A gradient added to an existing one is added by the product itself (`addmm_`, no fresh
        product: on CPU a fresh one per layer and microbatch costs the allocator's page faults,
        which the full backward's hot temporaries do not). That is autograd's `grad += product`
        bit for bit where the matrix library adds the finished product, as every library measured
        here does; else within its rounding."""
        if self.host is not None:
            self.reload()
        with torch.no_grad():
            for e in self.entries:
                if e.weight.grad is None:
                    e.weight.grad = _weight_grad(e.x, e.grad, e.conv1d)
                else:
                    _add_weight_grad(e.weight.grad, e.x, e.grad, e.conv1d)
        self.entries = []
        for key in self.counted:
            LEDGER.device.release(key)
        self.counted = set()

    def offload(self) -> None:
        """Moves the kept tensors to host memory, one copy per storage (CPU: a real second copy,
        the device's released; CUDA: pinned)."""
        if self.host is not None or not self.entries:
            return
        copies: Dict[Any, torch.Tensor] = {}
        host: Dict[Tuple[int, str], Tuple[torch.Tensor, Any]] = {}
        for i, e in enumerate(self.entries):
            for slot in ("x", "grad"):
                t = getattr(e, slot)
                storage = t.untyped_storage()
                key = (str(t.device), storage.data_ptr())
                if key in self.inputs:
                    continue
                copy = copies.get(key)
                if copy is None:
                    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))
                    if t.device.type == "cpu":
                        copy = raw.clone()
                    else:
                        copy = torch.empty(storage.nbytes(), dtype=torch.uint8, device="cpu", pin_memory=True)
                        copy.copy_(raw)
                    copies[key] = copy
                    LEDGER.host.hold(id(copy), copy.numel())
                host[(i, slot)] = (copy, (t.dtype, t.device, t.storage_offset(), tuple(t.size()), tuple(t.stride())))
                setattr(e, slot, None)
        for key in self.counted:
            LEDGER.device.release(key)
        self.host = host

    def reload(self) -> None:
        """Brings the offloaded tensors back to the device, once per storage."""
        if self.host is None:
            return
        back: Dict[int, torch.Tensor] = {}
        counted: Set[Any] = set()
        for (i, slot), (copy, (dtype, device, offset, size, stride)) in self.host.items():
            restored = back.get(id(copy))
            if restored is None:
                restored = copy.clone() if device.type == "cpu" else copy.to(device)
                back[id(copy)] = restored
                if LEDGER.meters or self.counted:
                    key = storage_key(restored)
                    if key is not None and key not in counted:
                        LEDGER.device.hold(key, storage_nbytes(restored))
                        counted.add(key)
                LEDGER.host.release(id(copy))
            t = torch.empty(0, dtype=dtype, device=device).set_(restored.untyped_storage(), offset, size, stride)
            setattr(self.entries[i], slot, t)
        self.counted = counted
        self.host = None


class WeightGradStash:
    """One stage's deferred weight gradients: while `capturing`, each linear layer's backward
    leaves its entry in `pending`; `take()` gathers them into a `Kept` (`last`) and hands its W
    closure to the runtime; `kept[mb]` finds it again for the plan's offload and reload."""

    def __init__(self) -> None:
        self.capturing = False
        # Whether the forwards running now need their saved tensors tracked (see
        # `_deferred_forward`).
        self.tracked = False
        # Whether the stage's own backward (an I or a B) is running.
        self.backward = False
        # Whether the forward running now is of a microbatch whose backward is split (an I and a
        # W); else the layers run as their classes do. True unless the schedule says otherwise.
        self.deferring = True
        self.pending: List[_Entry] = []
        # The storages of the inputs of the microbatch being captured: not counted, as the
        # meter counts none of a stage's inputs (see `_memory`).
        self.inputs: Set[Any] = set()
        self.last: Optional[Kept] = None
        self.kept: Dict[int, Kept] = {}

    def keep(self, weight: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, conv1d: bool) -> None:
        # Detached: a saved tensor unpacked through hooks comes back attached to the graph, and
        # the W must build none.
        self.pending.append(_Entry(weight, x.detach(), grad.detach(), conv1d))

    def arrived(self, weight: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, conv1d: bool) -> None:
        """A layer's output gradient, in a backward: kept while capturing (an I), its weight
        gradient added at once in the stage's full backward (a B), as autograd's own backward of
        the layer does, and nothing in any other backward (the runtime's metadata inference asks
        autograd for the input gradients alone)."""
        if not self.backward:
            return
        if self.capturing:
            self.keep(weight, x, grad, conv1d)
            return
        with torch.no_grad():
            if weight.grad is None:
                weight.grad = _weight_grad(x, grad.detach(), conv1d)
            else:
                _add_weight_grad(weight.grad, x, grad.detach(), conv1d)

    def take(self) -> Callable[[], None]:
        """The closure that computes the weight gradients kept since the last take (counted in
        the ledger, once per storage, while a meter is on)."""
        entries, self.pending = self.pending, []
        counted: Set[Any] = set()
        if LEDGER.meters:
            for e in entries:
                for t in (e.x, e.grad):
                    key = storage_key(t)
                    if key is not None and key not in self.inputs and key not in counted:
                        LEDGER.device.hold(key, storage_nbytes(t))
                        counted.add(key)
        kept = Kept(entries, counted, set(self.inputs))
        self.last = kept if entries else None
        return kept.weight_gradients

    def claim(self, mb: int) -> None:
        """Files what the last take kept under microbatch `mb` (for its offload and reload)."""
        if self.last is not None:
            self.kept[mb] = self.last
        self.last = None


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _weight_grad(x: torch.Tensor, grad: torch.Tensor, conv1d: bool) -> torch.Tensor:
    """The weight gradient as autograd's own backward of the layer computes it (the same mm, so
    the same bits): `g^T x` for a Linear (weight `[out, in]`), `x^T g` for a Conv1D (`[in, out]`)."""
    x2, g2 = _flat(x), _flat(grad)
    return torch.mm(x2.t(), g2) if conv1d else torch.mm(g2.t(), x2)


def _add_weight_grad(into: torch.Tensor, x: torch.Tensor, grad: torch.Tensor, conv1d: bool) -> None:
    """`into += ` the weight gradient of `_weight_grad`, by one `addmm_`."""
    x2, g2 = _flat(x), _flat(grad)
    if conv1d:
        into.addmm_(x2.t(), g2)
    else:
        into.addmm_(g2.t(), x2)


class DeferredLinear(torch.autograd.Function):
    """`F.linear(x, weight, bias)` (or a Conv1D's `addmm`) whose backward defers the weight
    gradient to the stash while it captures."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                stash: WeightGradStash, conv1d: bool) -> torch.Tensor:
        ctx.save_for_backward(x)
        # The parameter itself (not through saved-tensor hooks, which hand back copies): its
        # gradient accumulates into it.
        ctx.weight = weight
        ctx.stash = stash
        ctx.conv1d = conv1d
        ctx.has_bias = bias is not None
        return _linear(x, weight, bias, conv1d)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        weight, stash, conv1d = ctx.weight, ctx.stash, ctx.conv1d
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            flat = _flat(grad)
            product = torch.mm(flat, weight.t()) if conv1d else torch.mm(flat, weight)
            grad_x = product.view(x.shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = _flat(grad).sum(0)
        if ctx.needs_input_grad[1]:
            if stash.capturing:
                stash.keep(weight, x, grad, conv1d)
            else:
                grad_w = _weight_grad(x, grad, conv1d)
        return grad_x, grad_w, grad_b, None, None


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], conv1d: bool) -> torch.Tensor:
    """The layer's own product, as its forward computes it."""
    if conv1d:
        out = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight)
        return out.view(x.shape[:-1] + (weight.shape[-1],))
    return torch.nn.functional.linear(x, weight, bias)


def _deferred_forward(stash: WeightGradStash, conv1d: bool, native: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A linear layer's forward while its stage is split here: its class's own (`native`) for a
    microbatch whose backward is whole (`stash.deferring` false: autograd computes everything in
    the B), else one of two ways, the same products and gradients:
    - untracked (the plan keeps this forward's activations and no meter counts them): the native
      product with the weight detached, so autograd computes the input (and bias) gradient alone,
      and a hook on the output, which receives its gradient, keeps (or, in a full backward,
      applies) the weight gradient with the layer's input, held by the hook: no Python in the
      autograd graph;
    - tracked (`stash.tracked`: a forward the plan recomputes or offloads, whose saved tensors
      the schedule's hooks manage, or any forward while a meter counts them), or where the
      output would need no gradient without the weight: `DeferredLinear`, whose input is saved
      as autograd saves it."""

    def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not stash.deferring:
            return native(self, x)
        weight = self.weight
        if stash.tracked or not weight.requires_grad or not torch.is_grad_enabled():
            return DeferredLinear.apply(x, weight, self.bias, stash, conv1d)
        bias = self.bias
        if not (x.requires_grad or (bias is not None and bias.requires_grad)):
            return DeferredLinear.apply(x, weight, bias, stash, conv1d)
        out = _linear(x, weight.detach(), bias, conv1d)
        held = x.detach()

        def arrived(grad: torch.Tensor) -> None:
            stash.arrived(weight, held, grad, conv1d)

        out.register_hook(arrived)
        return out

    return forward


class Installed:
    """What `install` changed on one stage, to put back: each rerouted module with the forward
    its instance had of its own (None: its class's), and the stage's `dw_builder`."""

    def __init__(self, stage: Any, stash: WeightGradStash, modules: List[Tuple[torch.nn.Module, Any]],
                 dw_builder: Any) -> None:
        self.stage = stage
        self.stash = stash
        self.modules = modules
        self.dw_builder = dw_builder


def install(stage: Any) -> Installed:
    """Splits `stage`'s backward here: its linear layers' forwards run through `DeferredLinear`
    and its `dw_builder` hands each I's deferred gradients to its W."""
    stash = WeightGradStash()
    modules = []
    for module in deferrable_modules(stage.submod):
        modules.append((module, module.__dict__.get("forward")))
        forward = _deferred_forward(stash, _is_conv1d(module), type(module).forward)
        module.forward = types.MethodType(forward, module)
    previous = stage.dw_builder
    stage.dw_builder = stash.take
    return Installed(stage, stash, modules, previous)


def uninstall(installed: Installed) -> None:
    """Puts back what `install` changed."""
    for module, own in installed.modules:
        if own is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = own
    installed.stage.dw_builder = installed.dw_builder


def weight_grad_bytes(module: torch.nn.Module, *inputs: Any, **kwargs: Any) -> int:
    """The bytes a split backward keeps from its I to its W for one forward of `module` on
    `inputs` (with `kwargs`), counted as `SavedActivationMeter` counts them (the inputs left
    out): this module's split
    where `splittable` says so (each linear layer's input and output gradient), else PyTorch's
    (`stage_backward_input`, which keeps the graph's weight branches). The output gradient is
    random; the forward runs with gradients enabled and everything is dropped afterwards."""
    from ._memory import SavedActivationMeter

    flat = [a for a in list(inputs) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    ok, _ = splittable(module)
    holder = types.SimpleNamespace(submod=module, dw_builder=None)
    installed = install(holder) if ok else None
    if installed is not None:
        # As the schedule runs a stage under a meter: inputs saved through the meter's hooks.
        installed.stash.tracked = True
    saved = {id(p): p.grad for p in module.parameters()}
    try:
        with torch.enable_grad(), SavedActivationMeter([module], hooks=True, exclude=flat):
            before = LEDGER.device_bytes
            out = module(*inputs, **kwargs)
            outputs = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]
            grads = [torch.randn_like(t) for t in outputs]
            if installed is not None:
                installed.stash.inputs = {k for k in map(storage_key, flat) if k is not None}
                installed.stash.backward = installed.stash.capturing = True
                torch.autograd.backward(outputs, grads)
                installed.stash.backward = installed.stash.capturing = False
                weight_gradients = holder.dw_builder()
                del out, outputs
                kept = LEDGER.device_bytes - before
                weight_gradients()
            else:
                from torch.distributed.pipelining._backward import stage_backward_input

                wanted = [t for t in flat if t.requires_grad]
                _, groups = stage_backward_input(outputs, grads, wanted, module.parameters())
                del out, outputs
                kept = LEDGER.device_bytes - before
                del groups
    finally:
        if installed is not None:
            uninstall(installed)
        for p in module.parameters():
            p.grad = saved.get(id(p))
    return int(kept)
