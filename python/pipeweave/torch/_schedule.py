"""`schedule(plan, stages, loss_fn=...)`: a plan's order as a `torch.distributed.pipelining`
schedule, built in memory, with the plan's recompute and offload decisions carried out per
(stage, microbatch).

The compute actions of the plan's order (F, I, W, B and overlapped F;B pairs) become PyTorch's
`_Action`s, set as `pipeline_order` for every rank and lowered by PyTorch's own passes (what
`_load_csv(..., "compute_only")` does after reading a file): the runtime adds the sends and
receives, UNSHARD/RESHARD of FSDP stages and the gradient reduction, and runs them.

The residency actions are not PyTorch's; the schedule carries them out around the stages'
computes:
- a pair the plan recomputes (`R`) runs its forward under saved-tensor hooks that keep what it
  saves only while the forward runs; the first time its backward needs one of them, the stage's
  forward runs again on the same input (random state restored) and gives them back, so they
  live from the recompute (right before the backward, where the plan puts `R`) to their use;
- a pair the plan offloads keeps what its forward saves on the device until the plan's `OFFLOAD`
  (right after the forward), then in host memory (pinned with CUDA; on CPU a separate copy, the
  device's released) until the plan's `RELOAD`, which copies it back before the backward;
- every other forward keeps its activations, as PyTorch does.
Parameters and the stages' inputs (which the runtime keeps until the backward anyway) are left
where they are. `SavedActivationMeter` counts what is on the device.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

import torch
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime
from torch.utils._pytree import tree_leaves, tree_map

from .._errors import Error
from .._plan import parse_action
from . import _weight_grad
from ._memory import LEDGER, StorageKey, parameter_keys, storage_key, storage_nbytes
from ._moe import shape_probe

__all__ = ["schedule", "PlanSchedule", "DUALPIPE_V"]

# The one-route expression that does what DualPipe's two routes do.
DUALPIPE_V = "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))"

RESIDENCY = ("R", "OFFLOAD", "RELOAD")
COMPUTE = ("F", "I", "W", "B")

# (stage, kind, microbatch): one compute action of a rank, `kind` one of COMPUTE.
ComputeKey = Tuple[int, str, int]
# (name, stage, microbatch): one residency action, `name` one of RESIDENCY.
ResidencyAction = Tuple[str, int, int]


def _error(message: str) -> Exception:
    """A `pipeweave.Error` with `message`."""
    return Error(message)


def _parse(text: str) -> Tuple[int, str, int]:
    """`"2F5"` -> (2, "F", 5), as `pipeweave._plan.parse_action`."""
    try:
        return parse_action(text)
    except ValueError as e:
        raise _error(str(e)) from None


def lower_plan(
    plan: Any,
) -> Tuple[Dict[int, List[_Action]], Dict[int, Dict[ComputeKey, List[ResidencyAction]]], Dict[int, Dict[ComputeKey, List[ResidencyAction]]]]:
    """The plan's order split into what PyTorch runs and what this module runs.

    `plan`: a `pipeweave.Plan`. Returns `(orders, before, after)`: `orders[rank]` the rank's
    compute actions as PyTorch `_Action`s, in the plan's order; `before[rank][key]` the residency
    actions to carry out right before compute action `key` (a recompute or reload sits before the
    next compute of its rank), `after[rank][key]` those right after it (an offload follows the
    compute before it)."""
    orders: Dict[int, List[_Action]] = {}
    before: Dict[int, Dict[ComputeKey, List[ResidencyAction]]] = {}
    after: Dict[int, Dict[ComputeKey, List[ResidencyAction]]] = {}
    for rank in range(plan.ranks):
        actions: List[_Action] = []
        pending: List[ResidencyAction] = []
        mine_before: Dict[ComputeKey, List[ResidencyAction]] = {}
        mine_after: Dict[ComputeKey, List[ResidencyAction]] = {}
        last: Optional[ComputeKey] = None
        for text in plan.order[rank]:
            if text.startswith("("):
                action = _Action.from_str(text)
                keys = []
                for sub in action.sub_actions or ():
                    keys.append((sub.stage_index, sub.computation_type.value, sub.microbatch_index))
            else:
                stage, name, mb = _parse(text)
                if name in RESIDENCY:
                    residency = (name, stage, mb)
                    if name == "OFFLOAD" and last is not None:
                        mine_after.setdefault(last, []).append(residency)
                    else:
                        pending.append(residency)
                    continue
                if name not in COMPUTE:
                    raise _error(
                        f"rank {rank}'s order has `{text}`, which is neither a compute action "
                        f"({', '.join(COMPUTE)}) nor a residency action ({', '.join(RESIDENCY)})"
                    )
                action = _Action.from_str(text)
                keys = [(stage, name, mb)]
            actions.append(action)
            if pending:
                mine_before.setdefault(keys[0], []).extend(pending)
                pending = []
            last = keys[-1]
        if pending:
            if last is None:
                raise _error(f"rank {rank}'s order has residency actions but no compute")
            mine_after.setdefault(last, []).extend(pending)
        orders[rank] = actions
        before[rank] = mine_before
        after[rank] = mine_after
    return orders, before, after


@contextlib.contextmanager
def _tracked(stash: Optional[_weight_grad.WeightGradStash], deferring: Optional[bool] = None) -> Iterator[None]:
    """While it lasts, the stash's linear layers save their inputs as autograd saves tensors
    (through the saved-tensor hooks around them), deferring their weight gradients as `deferring`
    says where given: see `_weight_grad._deferred_forward`."""
    if stash is None:
        yield
        return
    before = (stash.tracked, stash.deferring)
    stash.tracked = True
    if deferring is not None:
        stash.deferring = deferring
    try:
        yield
    finally:
        stash.tracked, stash.deferring = before


def _input_keys(stage: Any, mb: int) -> Set[StorageKey]:
    """The storages of microbatch `mb`'s inputs on `stage` (the runtime's forward state of it,
    where this PyTorch release keeps one by that name; none otherwise)."""
    state = getattr(stage, "_forward_chunk_states", {}).get(mb)
    values = getattr(state, "input_values", ()) or ()
    return {k for k in (storage_key(t) for t in values if isinstance(t, torch.Tensor)) if k is not None}


def _compute_actions(actions: Iterable[_Action]) -> List[_Action]:
    """`actions` with each overlapped F;B pair's sub-actions in its place."""
    out: List[_Action] = []
    for action in actions:
        if action.sub_actions:
            out.extend(action.sub_actions)
        else:
            out.append(action)
    return out


# --------------------------------------------------------------------------------- residency


class _Holder:
    """What a managed forward's pack hook returns for one saved tensor: the tensor while it is on
    the device, its host copy while offloaded, nothing while dropped for a recompute."""

    __slots__ = ("frame", "index", "tensor", "key", "counted", "host", "meta", "__weakref__")

    def __init__(self, frame: "_Frame", index: int, tensor: torch.Tensor, key: Optional[StorageKey], counted: bool):
        self.frame = frame
        self.index = index
        # Detached: a saved output holding itself would make a cycle through its grad_fn that
        # no collector breaks (and keep its graph alive past the backward).
        self.tensor: Optional[torch.Tensor] = tensor.detach()
        self.key = key
        self.counted = counted
        self.host: Optional[torch.Tensor] = None
        self.meta: Any = None
        if counted and key is not None:
            LEDGER.device.hold(key, storage_nbytes(tensor))

    def _let_go(self) -> None:
        """Stops counting the device tensor (before it is dropped or moved)."""
        if self.counted and self.tensor is not None and self.key is not None:
            LEDGER.device.release(self.key)

    def __del__(self) -> None:
        try:
            self._let_go()
            if self.host is not None:
                LEDGER.host.release(id(self.host))
        except Exception:  # interpreter shutdown
            pass


def _detached(value: Any) -> Any:
    """A forward input for the recompute: tensors detached, `requires_grad` as before."""
    if isinstance(value, torch.Tensor):
        out = value.detach()
        if value.requires_grad:
            out.requires_grad_(True)
        return out
    return value


class _Frame:
    """One forward of one (stage, microbatch) and what it saved: kept, recomputed or offloaded."""

    def __init__(self, stage: Any, mb: int, mode: str, call: Callable[..., Any], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any], stash: Optional[_weight_grad.WeightGradStash] = None):
        self.stage = stage
        # The stage's split-backward stash, whose linear layers must save their inputs through
        # this frame's hooks (`_weight_grad._deferred_forward`) when it runs the forward again, as
        # they ran it (deferring the weight gradients or not).
        self.stash = stash
        self.deferring = stash.deferring if stash is not None else False
        self.mb = mb
        self.mode = mode  # "keep", "recompute" or "offload"
        self.call = call
        self.count = 0
        self.holders: List["weakref.ref[_Holder]"] = []
        self.param_keys: Optional[Set[StorageKey]] = None
        self.input_keys = {
            k for k in (storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)) if k is not None
        }
        self.args = args if mode == "recompute" else None
        self.kwargs = kwargs if mode == "recompute" else None
        self.rng: Any = None
        self.recomputed = False
        self.device = None
        if mode == "recompute":
            self.rng = (torch.get_rng_state(), self._cuda_rng())

    def _cuda_rng(self) -> Any:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.get_rng_state()
        return None

    # ------------------------------------------------------------------ hooks
    def pack(self, tensor: torch.Tensor) -> _Holder:
        index = self.count
        self.count += 1
        key = storage_key(tensor)
        if key is None:
            return _Holder(self, index, tensor, None, counted=False)
        if self.param_keys is None:
            self.param_keys = parameter_keys([self.stage.submod])
        if key in self.param_keys or key in self.input_keys:
            return _Holder(self, index, tensor, key, counted=False)
        holder = _Holder(self, index, tensor, key, counted=True)
        self.holders.append(weakref.ref(holder))
        return holder

    @staticmethod
    def unpack(holder: _Holder) -> torch.Tensor:
        if holder.tensor is None:
            if holder.host is not None:
                holder.frame.reload()
            else:
                holder.frame.recompute()
        assert holder.tensor is not None
        return holder.tensor

    def _live(self) -> List[_Holder]:
        return [h for h in (r() for r in self.holders) if h is not None]

    # ------------------------------------------------------------------ recompute
    def drop(self) -> None:
        """After a recomputed pair's forward: lets go of what it saved."""
        for h in self._live():
            if h.tensor is not None:
                h._let_go()
                h.tensor = None

    def recompute(self) -> None:
        """Runs the forward again on the same input and hands each dropped holder its tensor."""
        if self.recomputed:
            raise RuntimeError(
                f"stage {self.stage.stage_index} microbatch {self.mb}: a saved tensor was needed "
                "again after its recompute had been handed out"
            )
        self.recomputed = True
        saved: List[torch.Tensor] = []

        def pack(t: torch.Tensor) -> int:
            saved.append(t.detach())
            return len(saved) - 1

        def unpack(i: int) -> torch.Tensor:
            return saved[i]

        args = tree_map(_detached, self.args)
        kwargs = tree_map(_detached, self.kwargs)
        cpu_state, cuda_state = self.rng
        devices = [torch.cuda.current_device()] if cuda_state is not None else []
        with torch.random.fork_rng(devices=devices, enabled=True):
            torch.set_rng_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state)
            with torch.enable_grad(), _tracked(self.stash, self.deferring), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                out = self.call(*args, **kwargs)
        del out
        if len(saved) != self.count:
            raise RuntimeError(
                f"stage {self.stage.stage_index} microbatch {self.mb}: the recomputed forward saved "
                f"{len(saved)} tensors, the first {self.count}; the stage's forward must do the "
                "same work every time to be recomputed"
            )
        for h in self._live():
            if h.tensor is None and h.host is None:
                t = saved[h.index]
                h.tensor = t
                h.key = storage_key(t)
                if h.key is not None:
                    LEDGER.device.hold(h.key, storage_nbytes(t))
        self.args = self.kwargs = None

    # ------------------------------------------------------------------ offload
    def offload(self) -> None:
        """The plan's OFFLOAD: what the forward saved moves to host memory, once per storage."""
        groups: Dict[StorageKey, List[_Holder]] = {}
        for h in self._live():
            if h.tensor is not None and h.key is not None:
                groups.setdefault(h.key, []).append(h)
        for key, holders in groups.items():
            src = holders[0].tensor
            storage = src.untyped_storage()
            nbytes = storage.nbytes()
            raw = torch.empty(0, dtype=torch.uint8, device=src.device).set_(storage, 0, (nbytes,), (1,))
            if src.device.type == "cpu":
                host = raw.clone()  # a real second copy: the device's is let go
            else:
                host = torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=True)
                host.copy_(raw)
            for h in holders:
                t = h.tensor
                h.meta = (t.dtype, t.device, t.storage_offset(), tuple(t.size()), tuple(t.stride()), t.requires_grad)
                h._let_go()
                h.tensor = None
                h.host = host
                LEDGER.host.hold(id(host), nbytes)

    def reload(self) -> None:
        """The plan's RELOAD: the offloaded tensors come back to the device, once per storage."""
        copies: Dict[int, torch.Tensor] = {}
        for h in self._live():
            if h.host is None:
                continue
            host = h.host
            dtype, device, offset, size, stride, _ = h.meta
            back = copies.get(id(host))
            if back is None:
                back = host.clone() if device.type == "cpu" else host.to(device, non_blocking=False)
                copies[id(host)] = back
            t = torch.empty(0, dtype=dtype, device=device).set_(back.untyped_storage(), offset, size, stride)
            h.tensor = t
            h.key = storage_key(t)
            if h.key is not None:
                LEDGER.device.hold(h.key, storage_nbytes(t))
            LEDGER.host.release(id(host))
            h.host = None


class _StageHooks:
    """Wraps one stage's compute methods for the length of a step, with only what this step
    needs of them (decided when the step starts, from what the plan asks of the stage): the
    residency actions around its computes, the saved-tensor hooks of the forwards the plan
    recomputes or offloads (and of every forward while a `SavedActivationMeter` is on), and the
    split backward's capture around its I. A stage that needs none of them runs PyTorch's
    methods untouched."""

    def __init__(self, schedule: "PlanSchedule", stage: Any, *, metering: bool):
        self.schedule = schedule
        self.stage = stage
        self.index = stage.stage_index
        self.metering = metering
        self.current: Optional[int] = None
        self.originals: Dict[str, Any] = {}
        self.split: Optional[_weight_grad.Installed] = None

    def install(self) -> None:
        schedule = self.schedule
        index = self.index
        residency = index in schedule._residency_stages
        wrappers = []
        if residency or self.metering:
            wrappers += [
                ("forward_one_chunk", self.forward_one_chunk),
                ("forward_maybe_with_nosync", self.forward_call),
            ]
        elif index in schedule._split_stages:
            # Only whether each forward's backward will be split.
            wrappers += [("forward_one_chunk", self.forward_one_chunk)]
        if residency or index in schedule._split_stages:
            wrappers += [
                ("backward_one_chunk", self.backward_one_chunk),
                ("backward_weight_one_chunk", self.backward_weight_one_chunk),
            ]
        if index in schedule._split_stages:
            self.split = _weight_grad.install(self.stage)
            schedule._stashes[index] = self.split.stash
        for name, wrapper in wrappers:
            self.originals[name] = self.stage.__dict__.get(name)
            setattr(self.stage, name, wrapper)

    def uninstall(self) -> None:
        for name, previous in self.originals.items():
            if previous is None:
                self.stage.__dict__.pop(name, None)
            else:
                setattr(self.stage, name, previous)
        self.originals.clear()
        if self.split is not None:
            _weight_grad.uninstall(self.split)
            self.schedule._stashes.pop(self.index, None)
            self.split = None

    def _original(self, name: str) -> Callable[..., Any]:
        previous = self.originals.get(name)
        return previous if previous is not None else getattr(type(self.stage), name).__get__(self.stage)

    # ------------------------------------------------------------------ wrappers
    def forward_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> Any:
        key = (self.index, "F", mb)
        self.schedule._residency(self.schedule._before.get(key, ()))
        if self.split is not None:
            self.split.stash.deferring = (self.index, mb) in self.schedule._split_pairs
        self.current = mb
        try:
            out = self._original("forward_one_chunk")(mb, *args, **kwargs)
        finally:
            self.current = None
        self.schedule._residency(self.schedule._after.get(key, ()))
        return out

    def forward_call(self, *args: Any, **kwargs: Any) -> Any:
        call = self._original("forward_maybe_with_nosync")
        mb = self.current
        if mb is None:  # a metadata probe, not one of the plan's forwards
            return call(*args, **kwargs)
        mode = self.schedule._modes.get((self.index, mb), "keep")
        if mode == "keep" and not self.metering:
            # The plan keeps what this forward saves, as PyTorch does: nothing to do.
            return call(*args, **kwargs)
        stash = self.split.stash if self.split is not None else None
        frame = _Frame(self.stage, mb, mode, call, args, kwargs, stash)
        self.schedule._frames[(self.index, mb)] = frame
        with _tracked(stash), torch.autograd.graph.saved_tensors_hooks(frame.pack, frame.unpack):
            out = call(*args, **kwargs)
        if mode == "recompute":
            frame.drop()
        return out

    def backward_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> Any:
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        key = (self.index, "B" if full else "I", mb)
        self.schedule._residency(self.schedule._before.get(key, ()))
        if self.split is not None:
            # An I keeps its linear layers' weight gradients for its W; a B computes them.
            self.split.stash.backward = True
            self.split.stash.capturing = not full
            self.split.stash.inputs = _input_keys(self.stage, mb) if not full else set()
        try:
            out = self._original("backward_one_chunk")(mb, *args, **kwargs)
        finally:
            if self.split is not None:
                self.split.stash.capturing = False
                self.split.stash.backward = False
        if self.split is not None:
            self.split.stash.claim(mb)
        self.schedule._residency(self.schedule._after.get(key, ()))
        return out

    def backward_weight_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> Any:
        key = (self.index, "W", mb)
        self.schedule._residency(self.schedule._before.get(key, ()))
        out = self._original("backward_weight_one_chunk")(mb, *args, **kwargs)
        if self.split is not None:
            self.split.stash.kept.pop(mb, None)
        self.schedule._residency(self.schedule._after.get(key, ()))
        return out


# --------------------------------------------------------------------------------- the schedule


class PlanSchedule(_PipelineScheduleRuntime):
    """A pipeweave plan run by PyTorch's pipelining runtime (`_PipelineScheduleRuntime`).

    Build it with `pipeweave.torch.schedule(plan, stages, loss_fn=...)`; use it as PyTorch's
    own: `step(x, target=y, losses=losses)` on every rank (inputs on the rank of stage 0, the
    target on that of the last stage). `plan` is the plan it runs; `residency` maps each
    (stage, microbatch) pair of this rank the plan recomputes or offloads to "recompute" or
    "offload"; `split_backward` maps each stage of this rank whose backward the plan splits (an I
    and a W) to how: "pipeweave" (`_weight_grad`: I runs the whole backward but the linear
    layers' weight gradients, W those, at the full backward's cost) or "autograd (...)" (PyTorch's
    own split, for a stage with a parameter of a module the former does not know, named)."""

    def __init__(
        self,
        plan: Any,
        stages: Sequence[Any],
        *,
        loss_fn: Optional[Callable[..., torch.Tensor]],
        rank: int,
        scale_grads: bool = True,
        **runtime_kwargs: Any,
    ):
        """See `pipeweave.torch.schedule`, which checks the arguments first."""
        super().__init__(list(stages), plan.microbatches, loss_fn=loss_fn, scale_grads=scale_grads, **runtime_kwargs)
        self.plan = plan
        orders, before, after = lower_plan(plan)
        self.pipeline_order = dict(orders)
        if hasattr(self, "_prepare_schedule_with_comms"):
            self._prepare_schedule_with_comms(self.pipeline_order)
        elif hasattr(self, "_load_actions"):  # PyTorch 2.6 and 2.7's name
            self._load_actions(self.pipeline_order)
        else:  # pragma: no cover
            raise _error(f"PyTorch {torch.__version__}'s pipelining runtime has no in-memory loader")
        self._before = before[rank]
        self._after = after[rank]
        mine = {s.stage_index for s in stages}
        self.residency: Dict[Tuple[int, int], str] = {}
        for pair in plan.recomputed:
            if pair[0] in mine:
                self.residency[pair] = "recompute"
        for pair in plan.offloaded:
            if pair[0] in mine:
                self.residency[pair] = "offload"
        self._modes = self.residency
        self._frames: "weakref.WeakValueDictionary[Tuple[int, int], _Frame]" = weakref.WeakValueDictionary()
        # Decided once: the stages whose computes carry residency actions or recompute/offload
        # modes, and how each stage of this rank the plan splits (an I and a W) is split.
        self._residency_stages = {s for s, _ in self.residency} | {
            k[0] for k in list(before[rank]) + list(after[rank])
        }
        # The (stage, microbatch) pairs of this rank whose backward the plan splits.
        self._split_pairs = {
            (a.stage_index, a.microbatch_index)
            for a in _compute_actions(orders[rank])
            if a.computation_type.value == "I"
        }
        split = {stage for stage, _ in self._split_pairs}
        self.split_backward: Dict[int, str] = {}
        for stage in stages:
            if stage.stage_index not in split:
                continue
            ok, why = _weight_grad.splittable(stage.submod)
            self.split_backward[stage.stage_index] = "pipeweave" if ok else f"autograd ({why})"
        self._split_stages = {s for s, how in self.split_backward.items() if how == "pipeweave"}
        # During a step: the stashes of the stages split here.
        self._stashes: Dict[int, _weight_grad.WeightGradStash] = {}

    def _residency(self, actions: Iterable[ResidencyAction]) -> None:
        for name, stage, mb in actions:
            if name == "R":
                # A recompute runs when the backward first needs what the forward dropped, which
                # is right after the plan's R.
                continue
            # What the pair holds now: its forward's saved tensors until its I, then what the
            # split backward keeps for its W (a frame gone has nothing saved left to move).
            frame = self._frames.get((stage, mb))
            stash = self._stashes.get(stage)
            kept = stash.kept.get(mb) if stash is not None else None
            for holder in (frame, kept):
                if holder is None:
                    continue
                if name == "OFFLOAD":
                    holder.offload()
                elif name == "RELOAD":
                    holder.reload()

    def _initialize_stages(self, *args: Any, **kwargs: Any) -> Any:
        # The runtime's shape probe runs later stages on uninitialized tensors (different on each
        # expert rank): replicated MoE blocks send nothing while it runs.
        with shape_probe():
            return super()._initialize_stages(*args, **kwargs)

    def _step_microbatches(self, *args: Any, **kwargs: Any) -> Any:
        metering = bool(LEDGER.meters)
        hooks = [_StageHooks(self, stage, metering=metering) for stage in self._stages]
        for h in hooks:
            h.install()
        try:
            return super()._step_microbatches(*args, **kwargs)
        finally:
            for h in hooks:
                h.uninstall()


def _check(plan: Any, stages: Sequence[Any], rank: Optional[int]) -> int:
    """Refuses what the runtime cannot run; returns the rank."""
    routes = plan.report.get("routes") or []
    tied = plan.report.get("tied_stages") or []
    if len(routes) > 1 or tied:
        raise _error(
            f"`{plan.expression}` runs on {len(routes)} routes (DualPipe's two directions, stages "
            f"tied across them: {tied}), which PyTorch's pipelining runtime cannot express; "
            f"`{DUALPIPE_V}` (DualPipeV) does the same on one route"
        )
    chunks = plan.report.get("seq_chunks") or 1
    if chunks > 1:
        raise _error(
            f"`{plan.expression}` splits each microbatch's sequence into {chunks} chunks "
            f"(seq_split), and PyTorch's pipelining runtime keeps no state between the "
            f"microbatches of a stage (a chunk's attention needs the keys and values of the chunks "
            f"before it); pipeweave's own trainer runs such plans (train_gpt --schedule ...)"
        )
    rebuilt = [a for order in plan.order for a in order if a[0].isdigit() and _parse(a)[1] == "RW"]
    if rebuilt:
        raise _error(
            f"`{plan.expression}` recomputes what {len(rebuilt)} weight-gradient backward(s) keep "
            f"(`{rebuilt[0]}`: the forward and the I again before the W), which pipeweave.torch "
            f"cannot do in PyTorch's runtime (the I would run again without sending its gradient "
            f"or adding its norms' gradients twice); add `weight_grads=keep` to the "
            f"recompute to recompute activations only, or offload what the W keeps instead"
        )
    if not stages:
        raise _error("schedule() needs this rank's PipelineStage objects; got none")
    if rank is None:
        rank = stages[0].group_rank
    if not isinstance(rank, int) or not 0 <= rank < plan.ranks:
        raise _error(f"rank {rank} is out of range: the plan has {plan.ranks} ranks")
    for stage in stages:
        if stage.num_stages != plan.stages:
            raise _error(
                f"stage {stage.stage_index} belongs to a pipeline of {stage.num_stages} stages; "
                f"the plan `{plan.expression}` has {plan.stages}"
            )
        if stage.group_size != plan.ranks:
            raise _error(
                f"the stages' pipeline group has {stage.group_size} ranks; the plan "
                f"`{plan.expression}` has {plan.ranks}"
            )
        if stage.group_rank != rank:
            raise _error(f"stage {stage.stage_index} is on rank {stage.group_rank}, not rank {rank}")
    have = [s.stage_index for s in stages]
    want = [s for s, r in enumerate(plan.stage_to_rank) if r == rank]
    if sorted(have) != want:
        raise _error(
            f"rank {rank} holds stages {want} in the plan `{plan.expression}`; got stages {have}"
        )
    return rank


def schedule(
    plan: Any,
    stages: Sequence[Any],
    *,
    loss_fn: Optional[Callable[..., torch.Tensor]],
    rank: Optional[int] = None,
    scale_grads: bool = True,
    **runtime_kwargs: Any,
) -> PlanSchedule:
    """The plan's order as a `torch.distributed.pipelining` schedule on this rank.

    `plan`: a `pipeweave.Plan` (from `pipeweave.plan(...)` or `Plan.from_report`) with one route.
    `stages`: this rank's `PipelineStage` objects, the stages `plan.stages_on(rank)` names (any
    order), each built with `num_stages=plan.stages` on a pipeline group of `plan.ranks` ranks;
    their modules may be wrapped with FSDP (`fully_shard`). `loss_fn`: `loss_fn(output, target)`,
    as for PyTorch's schedules (the rank of the last stage computes it per microbatch). `rank`:
    this rank in the pipeline group (default: the stages' `group_rank`). `scale_grads`: divide
    the gradients by the number of microbatches at the end of the step (for a mean loss), as
    PyTorch's schedules do. `runtime_kwargs`: passed to `_PipelineScheduleRuntime`
    (`max_active_stages`, `defer_pp_recv`, ...).

    Returns a schedule whose `step(x, target=y, losses=losses)` runs one training step: the
    plan's order with PyTorch's own communication, FSDP residency and gradient reduction, and the
    plan's recomputes and offloads per (stage, microbatch). Raises `pipeweave.Error` for a plan
    PyTorch cannot express (DualPipe's two routes: it names the DualPipeV expression that does
    the same on one route; recomputes for a weight gradient, `RW`; sequence chunks, `seq_split`)
    or stages that do not match the plan's ranks and stages."""
    rank = _check(plan, stages, rank)
    return PlanSchedule(plan, stages, loss_fn=loss_fn, rank=rank, scale_grads=scale_grads, **runtime_kwargs)
