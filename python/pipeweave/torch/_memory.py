"""Saved activations: where every tensor a stage's forward saves for its backward lives, and how
many bytes of them are alive on the device (and in host memory) at any moment.

One ledger per process counts storages, not tensors: a storage that several saved tensors share
(a `Tanh`'s output that the next `Linear` saves too) is counted once, and a storage is counted as
long as one saved tensor of it is alive on the device. Parameters are never counted (they are not
activations), nor are the stage's inputs (PyTorch's runtime keeps each microbatch's input until its
backward whatever the schedule does: they are the receive buffers, not the forward's activations).

`SavedActivationMeter` reads the ledger (current and peak bytes, device and host); the schedules of
`pipeweave.torch.schedule` write to it as they keep, drop, recompute, offload and reload what their
forwards saved; with `hooks=True` the meter's own saved-tensor hooks count other forwards too.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import torch

__all__ = ["SavedActivationMeter", "activation_bytes"]

# A storage's identity: (device, data pointer).
StorageKey = Tuple[str, int]


def storage_key(t: torch.Tensor) -> Optional[StorageKey]:
    """The identity of `t`'s storage, or None for a tensor without one (a DTensor's wrapper, a
    tensor subclass, a meta tensor)."""
    try:
        if t.device.type == "meta":
            return None
        return (str(t.device), t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def storage_nbytes(t: torch.Tensor) -> int:
    """The bytes of `t`'s whole storage (what keeping `t` keeps alive)."""
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError, TypeError):
        return int(t.numel() * t.element_size())


def parameter_keys(modules: Iterable[torch.nn.Module]) -> Set[StorageKey]:
    """The storages of `modules`' parameters as they are registered now (during a forward, FSDP's
    unsharded parameters)."""
    keys: Set[StorageKey] = set()
    for module in modules:
        for p in module.parameters():
            local = getattr(p, "_local_tensor", p)
            key = storage_key(local)
            if key is not None:
                keys.add(key)
    return keys


class _Holdings:
    """The storages saved tensors hold in one memory of a ledger (the device's storages, or the
    host copies of offloaded ones): each with how many saved tensors hold it and its bytes, and
    their total. Takes the ledger's lock; tells the ledger whenever the total changes."""

    def __init__(self, ledger: "_Ledger") -> None:
        self._ledger = ledger
        self.entries: Dict[Any, List[int]] = {}  # key -> [holders, bytes]
        self.bytes = 0

    def hold(self, key: Any, nbytes: int) -> None:
        """One more saved tensor holds storage `key` of `nbytes`."""
        with self._ledger.lock:
            entry = self.entries.get(key)
            if entry is None:
                self.entries[key] = [1, nbytes]
                self.bytes += nbytes
                self._ledger._notify()
            else:
                entry[0] += 1

    def release(self, key: Any) -> None:
        """A saved tensor let go of storage `key`."""
        with self._ledger.lock:
            entry = self.entries.get(key)
            if entry is None:
                return
            entry[0] -= 1
            if entry[0] == 0:
                del self.entries[key]
                self.bytes -= entry[1]
                self._ledger._notify()


class _Ledger:
    """Per process: each storage held by saved activations, with how many saved tensors hold it,
    on the device and on the host; the totals; and the meters that follow them."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.device = _Holdings(self)  # keys: StorageKey
        self.host = _Holdings(self)  # keys: the id of a host copy
        self.meters: "weakref.WeakSet[SavedActivationMeter]" = weakref.WeakSet()

    @property
    def device_bytes(self) -> int:
        return self.device.bytes

    @property
    def host_bytes(self) -> int:
        return self.host.bytes

    def _notify(self) -> None:
        for meter in list(self.meters):
            meter._observe(self.device_bytes, self.host_bytes)


LEDGER = _Ledger()


class _Counted:
    """What a meter's own pack hook returns: the saved tensor, counted while autograd keeps it."""

    __slots__ = ("tensor", "key", "__weakref__")

    def __init__(self, tensor: torch.Tensor, key: Optional[StorageKey]):
        # Detached: a saved output holding itself would make a cycle through its grad_fn that
        # no collector breaks.
        self.tensor = tensor.detach()
        self.key = key
        if key is not None:
            LEDGER.device.hold(key, storage_nbytes(tensor))

    def __del__(self) -> None:
        if self.key is not None:
            LEDGER.device.release(self.key)


class SavedActivationMeter:
    """Counts the bytes of saved activations alive on this process's device, with their peak.

    Use as a context manager around training code:

        with pwt.SavedActivationMeter() as meter:
            schedule.step(x, target=y, losses=losses)
        meter.peak_bytes, meter.host_peak_bytes

    Inside, every saved tensor of a `pipeweave.torch.schedule` stage's forward is counted while it
    is on the device (once per storage; parameters and the stages' inputs excluded, see the module
    docstring), offloaded ones in `host_bytes` while they are in host memory. What the loss
    function saves is not a stage's activation and is not counted. With `hooks=True` the meter also
    counts forwards run outside such a schedule through its own saved-tensor hooks (parameters of
    `modules` and the tensors in `exclude` left out; without `modules`, every tensor that is a
    leaf requiring grad, or a view of one, is taken for a parameter).

    With CUDA, `cuda_peak_bytes` is `torch.cuda.max_memory_allocated` over the context (all
    allocations, not only activations); None on CPU.
    """

    def __init__(
        self,
        modules: Optional[Iterable[torch.nn.Module]] = None,
        *,
        hooks: bool = False,
        exclude: Iterable[torch.Tensor] = (),
        device: Optional[torch.device] = None,
    ):
        """`modules`: the modules whose parameters the meter's own hooks leave out (None: leaves
        requiring grad and their views are taken for parameters). `hooks`: also count forwards
        run outside a pipeweave schedule (default: only the schedules' stage forwards). `exclude`: tensors (inputs) not
        to count when a forward saves them. `device`: the CUDA device whose allocator peak to
        read (default: the current one, when CUDA is available)."""
        self._modules = list(modules) if modules is not None else None
        self._exclude = {k for k in (storage_key(t) for t in exclude) if k is not None}
        self._device = device
        self.start_bytes = 0
        self.current_bytes = 0
        self.peak_bytes = 0
        self.host_bytes = 0
        self.host_peak_bytes = 0
        self.cuda_peak_bytes: Optional[int] = None
        self._own_hooks = hooks
        self._param_keys: Optional[Set[StorageKey]] = None
        self._hooks: Any = None
        self._cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")

    # -------------------------------------------------------------- the ledger's figures
    def _observe(self, device_bytes: int, host_bytes: int) -> None:
        self.current_bytes = device_bytes
        self.peak_bytes = max(self.peak_bytes, device_bytes)
        self.host_bytes = host_bytes
        self.host_peak_bytes = max(self.host_peak_bytes, host_bytes)

    def reset_peak(self) -> None:
        """Starts the peaks again from what is alive now."""
        self.peak_bytes = LEDGER.device_bytes
        self.host_peak_bytes = LEDGER.host_bytes
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self._device)

    # -------------------------------------------------------------- the meter's own hooks
    def _pack(self, tensor: torch.Tensor) -> Any:
        key = storage_key(tensor)
        if key is None or key in self._exclude:
            return _Counted(tensor, None)
        if self._modules is not None:
            if self._param_keys is None:
                self._param_keys = parameter_keys(self._modules)
            if key in self._param_keys:
                return _Counted(tensor, None)
        else:
            base = tensor._base if tensor._base is not None else tensor
            if base.is_leaf and base.requires_grad:
                return _Counted(tensor, None)
        return _Counted(tensor, key)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor

    def __enter__(self) -> "SavedActivationMeter":
        LEDGER.meters.add(self)
        self.start_bytes = LEDGER.device_bytes
        self._observe(LEDGER.device_bytes, LEDGER.host_bytes)
        self.reset_peak()
        self._param_keys = None
        if self._own_hooks:
            self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(*exc)
            self._hooks = None
        if self._cuda:
            self.cuda_peak_bytes = int(torch.cuda.max_memory_allocated(self._device))
        LEDGER.meters.discard(self)

    def __repr__(self) -> str:
        return (
            f"SavedActivationMeter(current_bytes={self.current_bytes}, peak_bytes={self.peak_bytes}, "
            f"host_bytes={self.host_bytes}, host_peak_bytes={self.host_peak_bytes})"
        )


def activation_bytes(module: torch.nn.Module, *inputs: Any, **kwargs: Any) -> int:
    """The bytes of activations one forward of `module` on `inputs` saves for its backward, counted
    as the schedules count them (once per storage; `module`'s parameters and the inputs left out).

    `module`: the module (a stage's `nn.Sequential`, one layer). `inputs`, `kwargs`: its forward's
    arguments; tensors among them are excluded from the count. The forward runs with gradients
    enabled and its graph is dropped afterwards."""
    flat = [a for a in list(inputs) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    with torch.enable_grad(), SavedActivationMeter([module], hooks=True, exclude=flat) as meter:
        before = LEDGER.device_bytes
        out = module(*inputs, **kwargs)
        held = LEDGER.device_bytes - before
        del out
    return int(held)
