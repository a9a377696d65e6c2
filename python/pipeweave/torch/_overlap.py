"""`overlap(schedule)`: the plan's overlapped F;B pairs (`OVERLAP_F_B`, DualPipeV's) run in
PyTorch's runtime with the forward of one microbatch and the backward of the other interleaved
phase by phase, as DeepSeek-V3 does, for stages made of `MoePhases` blocks:

    B: combine's backward, then the combine's backward exchange issued   | F: attention, dispatch issued
    B: the experts' backward, the dispatch's backward exchange issued    | F: the experts, combine issued
    B: attention's backward (and the block before's combine), ...        | F: the combine, the next block ...

each exchange asynchronous and waited on only when its result is needed, while the other half
computes. With split tokens all four exchanges are all-to-alls; with replicated tokens (the
default) the dispatch's forward and the combine's backward move nothing (a rank takes its own
experts' rows), and the two that send (the F's combine, the B's dispatch backward) fly while the
B's attention and the F's experts compute. Without `overlap` the runtime runs a pair's two
sub-actions one after the other.

How: while a step runs, every forward of a stage holding `MoePhases` blocks is recorded phase by
phase on a `Tape` (`_tape`: each phase its own autograd graph, the backward segment by segment;
the runtime sees one autograd node per stage and microbatch and does its own bookkeeping).
`OVERLAP_F_B` is registered with the runtime (`register_custom_function`): it does what the
runtime does for an F and a B (receives, loss, same-rank hand-offs), but calls the B from inside
the F's forward once the F's phases are ready to run, and the B's tape runs the F's next phase
each time it has issued an exchange. The plan's recomputes run phase by phase (each phase again
from its kept inputs right before its backward, the exchanges not again); its offloads move
what the phases save (`SavedActivationMeter` sees those, not the tensors handed between phases).
A stage whose backward the plan splits (I, then W) has its I compute its weight gradients too.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.distributed.pipelining import schedules as _sched

from .._errors import Error
from . import _tape
from ._moe import MoePhases
from ._tape import Tape, Value

__all__ = ["overlap", "Overlap", "phase_chain"]


def _error(message: str) -> Exception:
    return Error(message)


# The runtime's step's arguments (`return_outputs`, `loss_kwargs`, which the custom function's
# context lacks), by name.
_STEP = inspect.signature(_sched._PipelineScheduleRuntime._step_microbatches)


# --------------------------------------------------------------------------------- stage programs


def phase_chain(module: torch.nn.Module) -> List[torch.nn.Module]:
    """The stage's module as the chain of modules it runs one after the other: an
    `nn.Sequential`'s children (nested ones flattened), else the module itself."""
    if isinstance(module, torch.nn.Sequential):
        out: List[torch.nn.Module] = []
        for child in module:
            out.extend(phase_chain(child))
        return out
    return [module]


def _data_parallel(module: torch.nn.Module) -> bool:
    """Whether FSDP (`fully_shard`) or DDP wraps the module."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        FSDPModule = ()  # type: ignore[assignment,misc]
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(module, (FSDPModule, DistributedDataParallel))  # type: ignore[arg-type]


def _as_tuple(out: Any) -> Tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class _Program:
    """One stage's forward as phases: its chain's `MoePhases` blocks in four phases each
    (attention, dispatch, experts, combine), the other modules as one phase each."""

    def __init__(self, index: int, chain: List[torch.nn.Module]):
        self.index = index
        self.chain = chain
        self.blocks = sum(isinstance(m, MoePhases) for m in chain)

    def forward(self, tape: Tape, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Iterator[None]:
        """A generator: the forward phase by phase, yielding after issuing each exchange;
        returns the stage's outputs as tape values."""
        values: Tuple[Optional[Value], ...] = tuple(
            tape.input(a) if isinstance(a, torch.Tensor) else None for a in args
        )
        if any(v is None for v in values):
            raise _error(f"stage {self.index}'s inputs are not all tensors; real overlap needs tensors")
        block = 0
        for position, module in enumerate(self.chain):
            first_kwargs = kwargs if position == 0 else {}
            if isinstance(module, MoePhases):
                if first_kwargs:
                    raise _error(f"stage {self.index}'s first block takes keyword inputs; MoePhases take one tensor")
                values = yield from self._block(tape, module, block, values)
                block += 1
            else:
                call: Callable[..., Tuple[Any, ...]] = (
                    lambda *xs, m=module, kw=first_kwargs: _as_tuple(m(*xs, **kw))
                )
                values = tape.compute(f"module {position}", call, *values)
        return values

    def _block(self, tape: Tape, block: MoePhases, n: int, values: Tuple[Any, ...]) -> Iterator[None]:
        if len(values) != 1:
            raise _error(f"stage {self.index}'s MoE block {n} gets {len(values)} values; it takes one tensor")
        phases = block.phase_functions()
        send, weights, *carry = tape.compute(f"attention {n}", phases.attention, values[0])
        layout = phases.layout
        assert layout is not None and send is not None
        pending = tape.exchange(f"dispatch {n}", send, layout.dispatch)
        yield
        recv = pending.wait()
        (y,) = tape.compute(f"experts {n}", phases.experts, recv)
        pending = tape.exchange(f"combine {n}", y, layout.combine)
        yield
        back = pending.wait()
        return tape.compute(f"merge {n}", phases.merge, back, weights, *carry)


def _drain(gen: Iterator[None]) -> Any:
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


class _Driver:
    """Runs one half's generator a phase at a time from the other half's yields."""

    def __init__(self, gen: Iterator[None]):
        self.gen: Optional[Iterator[None]] = gen
        self.result: Any = None

    def step(self) -> None:
        if self.gen is None:
            return
        try:
            next(self.gen)
        except StopIteration as stop:
            self.result = stop.value
            self.gen = None

    def finish(self) -> Any:
        if self.gen is not None:
            self.result = _drain(self.gen)
            self.gen = None
        return self.result


# --------------------------------------------------------------------------------- the overlap


class Overlap:
    """Real overlap installed on a `PlanSchedule` (see the module's doc). `programs`: the stage
    indices of this rank run phase by phase; `events`: with `trace=True`, every phase's start
    and end (and "recompute" before a recomputed phase's backward) and every exchange's issue
    and wait (a wait only where a message was pending) of the last step, in order, as (half, stage, microbatch, phase, event) with half "F"
    or "B" (a phase is `attention n`, `dispatch n`, `experts n`, `combine n`, `merge n` for block
    n of the stage, or `module i`); `pairs`: how many overlapped pairs the last step ran
    interleaved. `close()` gives the runtime back its own sequential pairs."""

    def __init__(self, schedule: Any, *, trace: bool = False):
        active = getattr(schedule, "_pipeweave_overlap", None)
        if active is not None and not active._closed:
            raise _error("this schedule runs with pwt.overlap already; close() that one first")
        self.schedule = schedule
        self.trace = trace
        self.events: List[Tuple[str, int, int, str, str]] = []
        self.pairs = 0
        self._stages = {s.stage_index: s for s in schedule._stages}
        self.programs: Dict[int, _Program] = {}
        self._check_and_build()
        self._current: Dict[int, Optional[int]] = {}
        self._pending: Optional[Tuple[int, int, Callable[[], None]]] = None
        self._step_args: Dict[str, Any] = {}
        self._installed: List[Tuple[Any, str, Any]] = []
        self._closed = False
        # The runtime's own step, wrapped to install the stages' wrappers for its length.
        self._inner_step = schedule._step_microbatches
        schedule._step_microbatches = self._step
        schedule.register_custom_function(_sched.OVERLAP_F_B, self._run_pair)
        schedule._pipeweave_overlap = self

    # ------------------------------------------------------------------ checks
    def _check_and_build(self) -> None:
        schedule = self.schedule
        if not hasattr(schedule, "register_custom_function") or not hasattr(_sched, "OVERLAP_F_B"):
            raise _error(f"PyTorch {torch.__version__}'s pipelining runtime has no custom OVERLAP_F_B")
        paired = set()
        for action in schedule.pipeline_order.get(schedule.rank, ()):
            if action is not None and action.computation_type == _sched.OVERLAP_F_B:
                paired.update(a.stage_index for a in action.sub_actions or ())
        for index, stage in sorted(self._stages.items()):
            chain = phase_chain(stage.submod)
            blocks = [m for m in chain if isinstance(m, MoePhases)]
            nested = [m for m in stage.submod.modules() if isinstance(m, MoePhases)]
            if not blocks:
                if index in paired:
                    why = (" (they are nested inside other modules: make the stage an nn.Sequential "
                           "whose items are the blocks)" if nested else "")
                    raise _error(
                        f"stage {index} runs in overlapped F;B pairs but its module has no MoE block "
                        f"described by phases{why}; real overlap needs pwt.MoePhases blocks "
                        f"(pwt.phased_moe(layer) for a transformers MoE layer)"
                    )
                continue
            if len(nested) != len(blocks):
                raise _error(f"stage {index} has MoE blocks nested inside other modules; real overlap "
                             f"needs them as items of the stage's nn.Sequential")
            if _data_parallel(stage.submod) or not isinstance(stage.submod, (torch.nn.Sequential, MoePhases)):
                raise _error(f"stage {index}'s module is a {type(stage.submod).__name__}; real overlap "
                             f"runs an nn.Sequential of blocks (not wrapped by FSDP or DDP)")
            self.programs[index] = _Program(index, chain)
        # A taped stage's I runs the tape's whole backward: weight gradients included.
        for index in self.programs:
            if index in schedule._split_stages:
                schedule._split_stages.discard(index)
            if index in schedule.split_backward:
                schedule.split_backward[index] = "autograd (phased: I computes the weight gradients, W none)"

    def close(self) -> None:
        """Unregisters the custom OVERLAP_F_B and gives back the runtime's own step."""
        if self._closed:
            return
        self._closed = True
        self.schedule._comp_type_to_function_map.pop(_sched.OVERLAP_F_B, None)
        if self.schedule.__dict__.get("_step_microbatches") == self._step:
            del self.schedule.__dict__["_step_microbatches"]

    # ------------------------------------------------------------------ the step
    def _step(self, *args: Any, **kwargs: Any) -> Any:
        bound = _STEP.bind(self.schedule, *args, **kwargs)
        bound.apply_defaults()
        self._step_args = dict(bound.arguments)
        self.events = []
        self.pairs = 0
        for index in self.programs:
            stage = self._stages[index]
            self._wrap(stage, "forward_one_chunk", self._forward_one_chunk(index, stage))
            self._wrap(stage, "forward_maybe_with_nosync", self._forward_call(index, stage))
        try:
            return self._inner_step(*args, **kwargs)
        finally:
            for stage, name, previous in reversed(self._installed):
                if previous is None:
                    stage.__dict__.pop(name, None)
                else:
                    setattr(stage, name, previous)
            self._installed.clear()
            self._current.clear()
            self._pending = None

    def _wrap(self, stage: Any, name: str, wrapper: Any) -> None:
        self._installed.append((stage, name, stage.__dict__.get(name)))
        setattr(stage, name, wrapper)

    def _forward_one_chunk(self, index: int, stage: Any) -> Callable[..., Any]:
        original = stage.__dict__.get("forward_one_chunk") or type(stage).forward_one_chunk.__get__(stage)

        def forward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
            self._current[index] = mb
            try:
                return original(mb, *args, **kwargs)
            finally:
                self._current[index] = None

        return forward_one_chunk

    def _forward_call(self, index: int, stage: Any) -> Callable[..., Any]:
        original = (stage.__dict__.get("forward_maybe_with_nosync")
                    or type(stage).forward_maybe_with_nosync.__get__(stage))
        program = self.programs[index]

        def forward_call(*args: Any, **kwargs: Any) -> Any:
            mb = self._current.get(index)
            if mb is None:  # not one of the plan's forwards (a metadata probe)
                return original(*args, **kwargs)
            recompute = self.schedule._modes.get((index, mb)) == "recompute"
            tape = Tape(grad=torch.is_grad_enabled(), recompute=recompute, trace=self._tracer(index, mb))
            gen = program.forward(tape, args, kwargs)
            pending = self._pending
            if pending is not None and pending[:2] == (index, mb):
                # The pair's B, run now: its tape runs this forward's next phase at each yield.
                self._pending = None
                driver = _Driver(gen)
                _tape.STEP_OTHER.append(driver.step)
                try:
                    pending[2]()
                finally:
                    _tape.STEP_OTHER.pop()
                outputs = driver.finish()
                self.pairs += 1
            else:
                outputs = _drain(gen)
            return tape.glue(args, outputs)

        return forward_call

    def _tracer(self, index: int, mb: int) -> Optional[Callable[[str, str, str], None]]:
        if not self.trace:
            return None
        events = self.events
        return lambda half, phase, event: events.append((half, index, mb, phase, event))

    # ------------------------------------------------------------------ OVERLAP_F_B
    def _run_pair(self, action: Any, ctx: Any) -> None:
        subs = list(action.sub_actions or ())
        forwards = [a for a in subs if a.computation_type == _sched.FORWARD]
        backwards = [a for a in subs if a.computation_type in (_sched.FULL_BACKWARD, _sched.BACKWARD_INPUT)]
        if len(subs) != 2 or len(forwards) != 1 or len(backwards) != 1:
            raise _error(f"{action} is not one forward and one backward; pwt.overlap runs F;B pairs")
        f, b = forwards[0], backwards[0]
        self._forward(f, ctx, during=lambda: self._backward(b, ctx))

    def _forward(self, action: Any, ctx: Any, during: Optional[Callable[[], None]] = None) -> None:
        """The runtime's FORWARD (as `_PipelineScheduleRuntime._step_microbatches` runs it),
        with `during` run from inside the forward once its phases are ready (or after it)."""
        schedule = self.schedule
        index, mb = action.stage_index, action.microbatch_index
        stage = self._stages[index]
        schedule._assert_unsharded(stage)
        if not stage.is_first and index - 1 not in self._stages:
            if (index, mb) not in schedule.fwd_recv_ops:
                raise AssertionError(f"Computing {action=} before receiving input")
            _sched._wait_batch_p2p(schedule.fwd_recv_ops.pop((index, mb)))
        self._pending = (index, mb, during) if during is not None and index in self.programs else None
        try:
            output = stage.forward_one_chunk(mb, ctx.arg_mbs[mb], ctx.kwarg_mbs[mb],
                                             save_forward_output=self._step_args.get("return_outputs", True))
        finally:
            left = self._pending
            self._pending = None
        schedule._maybe_compute_loss(stage, output, ctx.target_mbs, mb, self._step_args.get("loss_kwargs"))
        if index + 1 in self._stages:
            self._stages[index + 1].set_local_fwd_input(output, mb)
        if during is not None and (left is not None or index not in self.programs):
            during()  # the forward ran no phases: the B after it, as the runtime does

    def _backward(self, action: Any, ctx: Any) -> None:
        """The runtime's FULL_BACKWARD or BACKWARD_INPUT."""
        schedule = self.schedule
        index, mb = action.stage_index, action.microbatch_index
        stage = self._stages[index]
        full = action.computation_type == _sched.FULL_BACKWARD
        schedule._assert_unsharded(stage)
        if not stage.is_last and index + 1 not in self._stages:
            if (index, mb) not in schedule.bwd_recv_ops:
                raise AssertionError(f"Attempted to run compute {action=} before receiving input")
            _sched._wait_batch_p2p(schedule.bwd_recv_ops.pop((index, mb)))
        loss = schedule._maybe_get_loss(stage, mb)
        last = False
        if full:
            schedule.backward_counter[index] += 1
            last = schedule.backward_counter[index] == schedule._n_microbatches
        stage.backward_one_chunk(mb, loss=loss, full_backward=full, last_backward=last)
        if index - 1 in self._stages:
            self._stages[index - 1].set_local_bwd_input(stage.get_local_bwd_output(mb), mb)


def overlap(schedule: Any, *, trace: bool = False) -> Overlap:
    """Real overlap of the plan's F;B pairs on this rank's `schedule` (a `pwt.schedule(...)`);
    see the module's doc. Its stages in overlapped pairs must be `nn.Sequential`s holding
    `MoePhases` blocks (`pwt.phased_moe(layer, group)`), not wrapped by FSDP or DDP. Returns
    the `Overlap` (its `events` with `trace=True`); raises `pipeweave.Error` otherwise."""
    return Overlap(schedule, trace=trace)
