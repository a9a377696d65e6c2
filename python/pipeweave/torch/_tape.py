"""One stage's forward kept phase by phase, so that its backward can run phase by phase.

A `Tape` records a forward as segments: each compute phase (`compute(name, fn, *values)`) runs on
fresh leaves (its inputs detached, `requires_grad` kept) and keeps its own autograd graph; each
exchange between phases (`exchange(name, value, exchange)`, an `_moe.Exchange`: an all-to-all, or
a rank taking its own rows) is issued asynchronously and waited on when its result is needed
(`Pending.wait()`). The tape's outputs go to the runtime through one autograd node (`glue`): when
autograd reaches it, `backward_steps` runs the segments in reverse, `torch.autograd.backward`
segment by segment, an exchange's backward (the reverse all-to-all of its result's gradient, or
the gather of every rank's rows) issued asynchronously and waited on by the segment before it.
The program driving a tape (`_overlap`) yields right after issuing each exchange of the forward,
and `backward_steps` after each of the backward: whoever drives them runs the other half's next
phase there.

Each tensor a segment hands on is consumed once (by one later segment or one exchange); its
gradient is the consumer's leaf's `.grad` (or the exchange's backward's result). In a recomputed
tape (`recompute=True`) each compute phase runs without autograd and again, from its kept inputs
with the random state it had, right before its backward; the exchanges do not run again (their
results are the next phase's kept inputs).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

from ._moe import Exchange

Trace = Optional[Callable[[str, str, str], None]]  # (half, phase, event)


class Value:
    """A tensor one segment hands on to a later one (`wants_grad`: whether a gradient flows back
    to it), and where its gradient will come from."""

    __slots__ = ("tensor", "edge", "wants_grad", "leaf", "comm", "external")

    def __init__(self, tensor: torch.Tensor, wants_grad: bool):
        self.tensor: Optional[torch.Tensor] = tensor
        self.edge: Any = None  # the tensor's gradient edge once the tensor itself is let go
        self.wants_grad = wants_grad
        self.leaf: Optional[torch.Tensor] = None
        self.comm: Optional["_Comm"] = None
        self.external: Optional[torch.Tensor] = None  # a tape output's gradient, from autograd

    def take(self) -> torch.Tensor:
        """A fresh leaf of the tensor for the segment that consumes it (once)."""
        assert self.leaf is None and self.comm is None, "a tape value consumed twice"
        t = self.tensor
        assert t is not None
        leaf = t.detach()
        if self.wants_grad:
            leaf.requires_grad_(True)
        self.leaf = leaf
        return leaf

    def root(self) -> Any:
        """What autograd starts the producer's backward from: the tensor, or its edge."""
        return self.tensor if self.tensor is not None else self.edge

    def grad(self) -> Optional[torch.Tensor]:
        if self.external is not None:
            return self.external
        if self.comm is not None:
            return self.comm.source_grad()
        if self.leaf is not None:
            return self.leaf.grad
        return None


class _Segment:
    """One compute phase: its function, its leaves, what it handed on (and, recomputed, the
    random state it ran with)."""

    def __init__(self, name: str, fn: Callable[..., Tuple[Any, ...]], leaves: List[Optional[torch.Tensor]],
                 values: List[Optional[Value]], rng: Any):
        self.name = name
        self.fn: Optional[Callable[..., Tuple[Any, ...]]] = fn
        self.leaves = leaves
        self.values = values
        self.rng = rng


class _Comm:
    """One exchange (None: nothing moves): its source value, its result (a value of the next
    segment, `out`'s shape), and in the backward the exchange of that result's gradient."""

    def __init__(self, tape: "Tape", name: str, source: Value, exchange: Optional[Exchange], out: torch.Tensor):
        self.tape = tape
        self.name = name
        self.source = source
        self.exchange = exchange
        self.result: Optional[Value] = None
        self.shape, self.dtype, self.device = tuple(out.shape), out.dtype, out.device
        self.reverse: Optional[Tuple[torch.Tensor, Any, Any]] = None

    def issue_reverse(self) -> None:
        """Moves the gradient of the result back (zeros where none came), asynchronously."""
        g = self.result.grad() if self.result is not None else None
        if g is None:
            g = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.reverse = (g, None, None) if self.exchange is None else self.exchange.backward(g, True)
        self.tape.note("B", self.name, "issue")

    def source_grad(self) -> torch.Tensor:
        assert self.reverse is not None, "an exchange's backward waited on before it was issued"
        g, work, _ = self.reverse
        if work is not None:
            work.wait()
            self.reverse = (g, None, None)
            self.tape.note("B", self.name, "wait")
        return g


class Pending:
    """An exchange issued in the forward: `wait()` gives its result as the next segment's value."""

    def __init__(self, comm: _Comm, out: torch.Tensor, work: Any, sent: torch.Tensor, wants_grad: bool):
        self.comm, self.out, self.work, self.sent, self.wants_grad = comm, out, work, sent, wants_grad

    def wait(self) -> Value:
        if self.work is not None:
            self.work.wait()
            self.comm.tape.note("F", self.comm.name, "wait")
        self.sent = None
        value = Value(self.out, self.wants_grad)
        self.comm.result = value
        return value


class Tape:
    """One (stage, microbatch) forward, phase by phase (see the module's doc). `grad`: whether
    the forward builds autograd graphs (a training forward); `recompute`: whether each compute
    phase runs again before its backward instead of keeping what it saves; `trace(half, phase,
    event)` is told every phase's start and end (a recomputed one's "recompute" before) and
    every exchange's issue and wait (a wait only where a message was pending)."""

    def __init__(self, *, grad: bool, recompute: bool, trace: Trace = None):
        self.grad = grad
        self.recompute = recompute and grad
        self.trace = trace
        self.items: List[Any] = []  # _Segment and _Comm, in forward order
        self.inputs: List[Value] = []
        self.outputs: List[Value] = []

    def note(self, half: str, phase: str, event: str) -> None:
        if self.trace is not None:
            self.trace(half, phase, event)

    # ------------------------------------------------------------------ forward
    def input(self, tensor: torch.Tensor) -> Value:
        value = Value(tensor, self.grad and tensor.requires_grad)
        self.inputs.append(value)
        return value

    def compute(self, name: str, fn: Callable[..., Tuple[Any, ...]], *values: Optional[Value]) -> Tuple[Value, ...]:
        """Runs `fn` on fresh leaves of `values` (None passes as None); returns its outputs."""
        leaves = [v.take() if v is not None else None for v in values]
        rng = _rng_state() if self.recompute else None
        self.note("F", name, "start")
        with torch.set_grad_enabled(self.grad and not self.recompute):
            outs = fn(*leaves)
        self.note("F", name, "end")
        # Recomputed, nothing requires grad yet: every floating-point output will.
        handed = [Value(o, self.grad and (o.is_floating_point() if self.recompute else o.requires_grad))
                  if isinstance(o, torch.Tensor) else None for o in outs]
        self.items.append(_Segment(name, fn, leaves, handed, rng))
        return tuple(handed)  # type: ignore[return-value]

    def exchange(self, name: str, value: Value, exchange: Optional[Exchange]) -> Pending:
        """Issues `exchange`'s forward on `value` (None: `value` itself goes on)."""
        src = value.tensor
        assert src is not None
        out, work, sent = (src.detach(), None, src) if exchange is None else exchange.forward(src, True)
        comm = _Comm(self, name, value, exchange, out)
        value.comm = comm
        self.items.append(comm)
        # The producer's backward needs only where the sent tensor's gradient goes (recomputed,
        # not even that): its storage goes once the exchange has read it.
        value.tensor = None
        if src.grad_fn is not None:
            value.edge = torch.autograd.graph.get_gradient_edge(src)
        self.note("F", name, "issue")
        return Pending(comm, out, work, sent, value.wants_grad)

    def glue(self, inputs: Sequence[Any], outputs: Sequence[Value]) -> Any:
        """The tape's outputs as the outputs of one autograd node on `inputs` (the stage's own
        inputs): what the runtime sees, sends and runs the backward of."""
        self.outputs = list(outputs)
        tensors = [v.tensor for v in outputs]
        if not self.grad:
            return tensors[0] if len(tensors) == 1 else tuple(tensors)
        anchor = torch.empty(0, requires_grad=True)  # an input that requires grad: the node exists
        outs = _Glue.apply(self, anchor, *[a for a in inputs if isinstance(a, torch.Tensor)])
        return outs[0] if len(outs) == 1 else outs

    # ------------------------------------------------------------------ backward
    def backward_steps(self, grads: Sequence[Optional[torch.Tensor]]) -> Iterator[None]:
        """The tape's backward, segment by segment in reverse, yielding after issuing each
        exchange's backward; `grads`: the outputs' gradients."""
        for value, g in zip(self.outputs, grads):
            value.external = g
        self.outputs = []
        for item in reversed(self.items):
            if isinstance(item, _Comm):
                item.issue_reverse()
                item.result = None
                yield
            else:
                self._backward(item)
        self.items = []

    def _backward(self, seg: _Segment) -> None:
        """The segment's backward: (recomputed first, before any wait), then its outputs'
        gradients (waiting on an exchange's backward if one brings them), then autograd."""
        outs: Sequence[Any] = [v.root() if v is not None else None for v in seg.values]
        if self.recompute:
            self.note("B", seg.name, "recompute")
            outs = self._rerun(seg)
        roots, grads = [], []
        for out, value in zip(outs, seg.values):
            if value is None or out is None or (isinstance(out, torch.Tensor) and not out.requires_grad):
                continue
            g = value.grad()
            if g is not None:
                roots.append(out)
                grads.append(g)
        self.note("B", seg.name, "start")
        if roots:
            torch.autograd.backward(roots, grads)
        for value in seg.values:
            if value is not None:
                value.tensor = value.edge = value.leaf = value.external = None
        seg.fn = None
        seg.values = []
        self.note("B", seg.name, "end")

    def _rerun(self, seg: _Segment) -> Sequence[Any]:
        """The segment's forward again, from its leaves, with the random state it first ran with
        (the caller's restored after); no saved-tensor hooks of the caller apply."""
        assert seg.fn is not None
        now = _rng_state()
        _set_rng_state(seg.rng)
        try:
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_same, _same):
                return seg.fn(*seg.leaves)
        finally:
            _set_rng_state(now)

    def input_grads(self) -> List[Optional[torch.Tensor]]:
        return [v.leaf.grad if v.leaf is not None else None for v in self.inputs]


def _same(t: Any) -> Any:
    return t


def _rng_state() -> Tuple[torch.Tensor, Any]:
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: Tuple[torch.Tensor, Any]) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


# Set by `_overlap` while a step runs: called at each yield of a tape's backward (runs the other
# half's next phase there).
STEP_OTHER: List[Callable[[], None]] = []


class _Glue(torch.autograd.Function):
    """The tape's outputs as one node: its backward is the tape's, phase by phase."""

    @staticmethod
    def forward(ctx: Any, tape: Tape, anchor: torch.Tensor, *inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.tape = tape
        return tuple(v.tensor.detach() for v in tape.outputs)  # type: ignore[union-attr]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Any, ...]:
        tape: Tape = ctx.tape
        ctx.tape = None
        step = STEP_OTHER[-1] if STEP_OTHER else None
        for _ in tape.backward_steps(grads):
            if step is not None:
                step()
        got = tape.input_grads()
        tape.inputs = []
        return (None, None, *got)
