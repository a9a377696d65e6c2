"""Mixture-of-experts blocks described by their phases, for the real overlap of `pwt.overlap`.

    block = pwt.phased_moe(layer, group=ep_group)   # a transformers MixtralDecoderLayer / Qwen2MoeDecoderLayer
    out = block(x)                                   # the layer's forward, experts over the group

A block says once what its phases compute (`MoePhases`): `attention(x)` (everything before the
experts, the router included) returns the tokens the experts read, each token's expert weights and
indices, and what `combine` needs besides the experts' output (`Routed`); `expert(index, rows)`
runs one expert; `combine(routed, *carry)` finishes the block. This module does the rest: the
dispatch (the token rows sorted by expert, each expert-parallel rank running its `E/X` experts on
theirs), the experts, and the combine (every expert's rows summed per token with their weights).
`forward(x)` runs them one after the other, the exchanges as autograd functions;
`pwt.overlap` runs the same functions phase by phase (`_tape`).

Two ways to share a microbatch's tokens over the X expert-parallel ranks (`tokens=`):

- "replicated" (the default): the X ranks get the same microbatches, and each runs the attention,
  the norms and the router on every token (the same bits everywhere) and its own experts on
  exactly the rows one device would give them, in the same order. The dispatch sends nothing (a
  rank takes its experts' rows); the combine sends each rank's experts' outputs to every other
  rank (an `all_to_all_single` whose payload is its experts' rows), and every rank sums all
  experts' rows per token in one device's order. In the backward the combine's gradient is
  already everywhere (each rank takes its experts' rows) and the dispatch's sends each rank's
  experts' input gradients to every other. Losses and every gradient are one device's, bit for
  bit: the replicated parameters' the same on every rank (nothing to reduce), an expert's on its
  holder. The attention's work is done X times. As the Rust trainer's expert parallelism.
- "split": each rank gets its own microbatches (data parallel over the group); the dispatch sends
  each (token, expert) row to the rank holding the expert and the combine sends the outputs back
  (`all_to_all_single` both, after a synchronous exchange of the E token counts), and
  `average_expert_parallel_grads` makes the gradients the mean over the ranks'. No work is
  repeated; an expert multiplies the rows of every rank's tokens in one product and the
  replicated gradients are summed by an all-reduce, so the result is one device's (all ranks'
  batches in turn) within rounding (1e-12 relative in float64), not bit for bit.

Either way the exchanges that carry rows are issued asynchronously where overlapped.
"""

from __future__ import annotations

import contextlib
import sys
from functools import partial
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._errors import Error

__all__ = ["MoePhases", "Routed", "phased_moe", "average_expert_parallel_grads", "shape_probe", "TOKENS"]

# How a microbatch's tokens are shared over the expert-parallel ranks (the module's doc).
TOKENS = ("replicated", "split")


class Routed(NamedTuple):
    """What a block's `attention` phase returns: `tokens` ([N, H], one row per token, what the
    experts read), `weights` ([N, k], each token's weight for its k experts), `experts` ([N, k],
    their indices in 0..E-1, integers) and `carry` (the tensors `combine` needs besides the
    experts' output: the residual stream, a shared expert's output)."""

    tokens: torch.Tensor
    weights: torch.Tensor
    experts: torch.Tensor
    carry: Tuple[torch.Tensor, ...] = ()


def _group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _group_rank(group: Any) -> int:
    return 0 if group is None else dist.get_rank(group)


class MoePhases(torch.nn.Module):
    """A mixture-of-experts block described by its phases (subclass it, or wrap a transformers
    layer with `phased_moe`). A subclass calls `super().__init__(num_experts, group, tokens)` and
    defines `attention(x) -> Routed`, `expert(index, rows) -> rows` (a global expert index this
    rank holds: `local_experts`) and `combine(routed, *carry) -> out`. `group`: the
    expert-parallel process group (X ranks, each holding E/X experts, rank r those from r*E/X);
    None: this rank holds every expert and nothing is sent. `tokens`: "replicated" (every rank of
    the group gets the same microbatches; one device's bits) or "split" (each its own), as the
    module's doc says."""

    def __init__(self, num_experts: int, group: Any = None, tokens: str = "replicated"):
        super().__init__()
        if tokens not in TOKENS:
            raise Error(f"unknown tokens mode {tokens!r}; MoE blocks take tokens='replicated' or tokens='split'")
        size = _group_size(group)
        if num_experts < 1 or num_experts % size:
            raise Error(f"{num_experts} experts do not divide over {size} expert-parallel ranks")
        self.num_experts = num_experts
        self.group = group  # a process group: neither a submodule nor a buffer
        self.tokens = tokens
        per = num_experts // size
        lo = _group_rank(group) * per
        self.local_experts = range(lo, lo + per)

    # ------------------------------------------------------------------ the protocol
    def attention(self, x: torch.Tensor) -> Routed:  # pragma: no cover - abstract
        raise NotImplementedError

    def expert(self, index: int, rows: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def combine(self, routed: torch.Tensor, *carry: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def expert_parameters(self) -> Sequence[torch.nn.Parameter]:
        """The parameters of this rank's experts (held by no other rank of the group); the
        others are replicated over it (`average_expert_parallel_grads`)."""
        return ()

    # ------------------------------------------------------------------ the phases as functions
    def phase_functions(self) -> "Phases":
        """The block's compute phases as functions of tensors (one set per forward: the first
        `attention` call fixes the dispatch layout, which a recompute reuses)."""
        return Phases(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's forward, phase after phase, the exchanges waited on at once."""
        phases = self.phase_functions()
        send, weights, *carry = phases.attention(x)
        layout = phases.layout
        assert layout is not None
        recv = send if layout.dispatch is None else _Exchanged.apply(send, layout.dispatch)
        (y,) = phases.experts(recv)
        back = y if layout.combine is None else _Exchanged.apply(y, layout.combine)
        (out,) = phases.merge(back, weights, *carry)
        return out


# --------------------------------------------------------------------------------- exchanges

# One direction of an exchange: `move(x, async_op) -> (out, work, sent)`: the result (its buffer
# while `work`, the collective's handle, is pending; None when done) and the tensor sent (to keep
# until the work completes).
Move = Callable[[torch.Tensor, bool], Tuple[torch.Tensor, Any, torch.Tensor]]


class Exchange(NamedTuple):
    """How rows cross the expert-parallel group between two phases: `forward` moves the
    tensor, `backward` the gradient of its result (to the gradient of the tensor moved)."""

    forward: Move
    backward: Move


class _Exchanged(torch.autograd.Function):
    """An exchange as one autograd node (forward and backward waited on at once)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, exchange: Exchange) -> torch.Tensor:
        ctx.exchange = exchange
        return exchange.forward(x, False)[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        return ctx.exchange.backward(grad, False)[0], None


def all_to_all(x: torch.Tensor, async_op: bool, *, out_rows: Sequence[int], in_rows: Sequence[int],
               group: Any) -> Tuple[torch.Tensor, Any, torch.Tensor]:
    """`x`'s rows sent with `all_to_all_single` (`in_rows` to each rank, `out_rows` from each)."""
    x = x.detach().contiguous()
    out = x.new_empty((sum(out_rows),) + tuple(x.shape[1:]))
    work = dist.all_to_all_single(out, x, list(out_rows), list(in_rows), group=group, async_op=async_op)
    return out, work, x


class _Probe:
    """Whether PyTorch's runtime is probing the stages' shapes (`shape_probe`)."""

    active = False


@contextlib.contextmanager
def shape_probe() -> Iterator[None]:
    """Marks the runtime's shape probe (a forward and backward of a later stage on uninitialized
    tensors, different on each expert rank, to learn its shapes): replicated blocks send nothing
    while it runs."""
    before, _Probe.active = _Probe.active, True
    try:
        yield
    finally:
        _Probe.active = before


class _Replicated:
    """The moves of replicated tokens on one expert rank: `own` takes its experts' rows of the
    sorted pairs, which every rank has (no message); `gather` sends its experts' rows to every
    rank and returns every rank's, in rank order (one device's order of the pairs). `counts`:
    this rank's token count per expert. Right after the router every rank sends its counts to
    every other (asynchronously); the first gather checks that all ranks routed alike. In the
    runtime's shape probe nothing is sent: `gather` puts this rank's rows among zeros."""

    def __init__(self, counts: torch.Tensor, block: "MoePhases"):
        self.group = block.group
        size = _group_size(self.group)
        self.rank = _group_rank(self.group)
        self.counts = counts
        self.rows = counts.view(size, -1).sum(1).tolist()
        self.start = sum(self.rows[:self.rank])
        self.probe = _Probe.active
        n = counts.numel()
        self.pending = None if self.probe else all_to_all(counts.repeat(size), True, out_rows=[n] * size,
                                                          in_rows=[n] * size, group=self.group)

    def own(self, x: torch.Tensor, async_op: bool) -> Tuple[torch.Tensor, Any, torch.Tensor]:
        return x.detach().narrow(0, self.start, self.rows[self.rank]).clone(), None, x

    def gather(self, x: torch.Tensor, async_op: bool) -> Tuple[torch.Tensor, Any, torch.Tensor]:
        x = x.detach()
        if self.probe:
            out = x.new_zeros((sum(self.rows),) + tuple(x.shape[1:]))
            out.narrow(0, self.start, x.shape[0]).copy_(x)
            return out, None, x
        self._agree()
        copies = x.repeat(len(self.rows), *[1] * (x.dim() - 1))
        return all_to_all(copies, async_op, out_rows=self.rows, in_rows=[x.shape[0]] * len(self.rows),
                          group=self.group)

    def _agree(self) -> None:
        if self.pending is None:
            return
        out, work, _ = self.pending
        self.pending = None
        work.wait()
        grid = out.view(len(self.rows), -1)
        for r, theirs in enumerate(grid):
            if not torch.equal(theirs, self.counts):
                raise Error(
                    f"expert rank {r} routed {theirs.tolist()} tokens per expert, expert rank {self.rank} "
                    f"{self.counts.tolist()}: tokens='replicated' needs every expert rank of a pipeline rank "
                    f"fed the same microbatches (PyTorch's own schedules probe a later stage's shapes with "
                    f"uninitialized tensors: give its PipelineStage input_args and output_args, or use "
                    f"pwt.schedule)")


# --------------------------------------------------------------------------------- dispatch layout


class Layout:
    """Where each (token, expert) pair goes: `order` sorts the [k*N] pairs (choice-major) by
    expert (stable), `token` is each sorted pair's token; `dispatch` and `combine` are the
    exchanges before and after the experts (None with one expert-parallel rank: nothing moves);
    `expert_rows` counts the rows this rank's experts get, per local expert, and `perm` (split
    tokens over several ranks; else None) sorts the received rows by local expert (then by
    source rank), `unperm` undoes it. Built once per forward (over several ranks it starts a
    collective: split tokens exchange the counts and wait, replicated ones send them)."""

    def __init__(self, experts: torch.Tensor, block: MoePhases):
        group = block.group
        size = _group_size(group)
        per = block.num_experts // size
        self.tokens = experts.shape[0]
        self.k = experts.shape[-1] if experts.dim() > 1 else 1
        # Pairs numbered choice-major (every token's first expert, then every token's second...),
        # as transformers' experts loop visits them: each expert reads its rows in that order.
        flat = experts.reshape(self.tokens, self.k).t().reshape(-1).to(torch.long)
        self.order = torch.argsort(flat, stable=True)
        self.token = self.order % self.tokens
        counts = torch.bincount(flat, minlength=block.num_experts)
        if counts.numel() != block.num_experts:
            raise Error(f"the router chose expert {int(flat.max())}; the block has {block.num_experts} experts")
        self.dispatch: Optional[Exchange] = None
        self.combine: Optional[Exchange] = None
        self.perm: Optional[torch.Tensor] = None
        self.unperm: Optional[torch.Tensor] = None
        if size == 1 or block.tokens == "replicated":
            # Every pair is here: this rank's experts' rows are a slice of the sorted pairs.
            self.expert_rows = counts.view(size, per)[_group_rank(group)].tolist()
            if size > 1:
                moves = _Replicated(counts, block)
                self.dispatch, self.combine = Exchange(moves.own, moves.gather), Exchange(moves.gather, moves.own)
            return
        rows = counts.view(size, per).sum(1).tolist()  # this rank's pairs per expert rank
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=group)
        grid = received.view(size, per)
        recv_rows = grid.sum(1).tolist()
        self.expert_rows = grid.sum(0).tolist()
        local = torch.arange(per, device=flat.device).repeat(size)
        self.perm = torch.argsort(torch.repeat_interleave(local, grid.reshape(-1)), stable=True)
        self.unperm = torch.argsort(self.perm)
        there: Move = partial(all_to_all, out_rows=recv_rows, in_rows=rows, group=group)
        back: Move = partial(all_to_all, out_rows=rows, in_rows=recv_rows, group=group)
        self.dispatch, self.combine = Exchange(there, back), Exchange(back, there)


class Phases:
    """One forward's compute phases of a `MoePhases` block as functions of tensors, each
    returning a tuple: `attention(x) -> (send, weights, *carry)` (the router's layout is made on
    the first call and kept: `layout`), `experts(recv) -> (y,)`, `merge(back, weights, *carry)
    -> (out,)`. Between them go the dispatch (send -> recv) and the combine (y -> back)."""

    def __init__(self, block: MoePhases):
        self.block = block
        self.layout: Optional[Layout] = None

    def attention(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        block = self.block
        routed = block.attention(x)
        if self.layout is None:
            with torch.no_grad():
                self.layout = Layout(routed.experts, block)
        send = routed.tokens.index_select(0, self.layout.token)
        return (send, routed.weights, *routed.carry)

    def experts(self, recv: torch.Tensor) -> Tuple[torch.Tensor]:
        block, layout = self.block, self.layout
        assert layout is not None
        rows = recv if layout.perm is None else recv.index_select(0, layout.perm)
        pieces = []
        for j, chunk in enumerate(rows.split(layout.expert_rows)):
            pieces.append(block.expert(block.local_experts[j], chunk) if chunk.shape[0] else chunk)
        y = torch.cat(pieces) if pieces else rows
        return (y if layout.unperm is None else y.index_select(0, layout.unperm),)

    def merge(self, back: torch.Tensor, weights: torch.Tensor, *carry: torch.Tensor) -> Tuple[torch.Tensor]:
        layout = self.layout
        assert layout is not None
        w = weights.reshape(layout.tokens, layout.k).t().reshape(-1).index_select(0, layout.order)
        zeros = back.new_zeros((layout.tokens,) + tuple(back.shape[1:]))
        routed = zeros.index_add(0, layout.token, back * w.unsqueeze(-1))
        return (self.block.combine(routed, *carry),)


# --------------------------------------------------------------------------------- transformers layers


def _rotary_class(layer: Any) -> Any:
    module = sys.modules.get(type(layer).__module__)
    names = [n for n in dir(module) if n.endswith("RotaryEmbedding")] if module is not None else []
    if len(names) != 1:
        raise Error(f"found no rotary embedding class beside {type(layer).__name__}; pass rotary=")
    return getattr(module, names[0])


class TransformersMoe(MoePhases):
    """A transformers MoE decoder layer (`MixtralDecoderLayer`, `Qwen2MoeDecoderLayer`, or one
    shaped like them: `input_layernorm`, `self_attn`, `post_attention_layernorm`, `mlp.gate`,
    `mlp.experts` with stacked `gate_up_proj`/`down_proj`, optionally `mlp.shared_expert` and
    `mlp.shared_expert_gate`) as phases. `layer` keeps only this rank's experts (`layer.mlp.experts`
    parameters sliced to `local_experts`). The block takes the hidden states [B, T, H] and computes
    the rotary position embeddings of positions 0..T-1 and a causal mask itself, as the model's
    forward would hand them to the layer."""

    def __init__(self, layer: torch.nn.Module, group: Any = None, rotary: Any = None, causal: bool = True,
                 tokens: str = "replicated"):
        mlp = getattr(layer, "mlp", None)
        experts = getattr(mlp, "experts", None)
        missing = [n for n in ("input_layernorm", "self_attn", "post_attention_layernorm") if not hasattr(layer, n)]
        if experts is None or not hasattr(mlp, "gate") or missing or not hasattr(experts, "gate_up_proj"):
            raise Error(
                f"{type(layer).__name__} is not a transformers MoE decoder layer (input_layernorm, "
                f"self_attn, post_attention_layernorm, mlp.gate, mlp.experts.gate_up_proj); "
                f"subclass pwt.MoePhases for other blocks"
            )
        if getattr(mlp, "jitter_noise", 0) and mlp.jitter_noise > 0:
            raise Error(f"{type(layer).__name__} has router jitter noise ({mlp.jitter_noise}), which "
                        f"phased_moe does not reproduce; set router_jitter_noise=0")
        total = experts.gate_up_proj.shape[0]
        super().__init__(total, group, tokens)
        self.layer = layer
        lo, hi = self.local_experts.start, self.local_experts.stop
        if hi - lo != total:
            experts.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.detach()[lo:hi].clone())
            experts.down_proj = torch.nn.Parameter(experts.down_proj.detach()[lo:hi].clone())
            experts.num_experts = hi - lo
        config = layer.self_attn.config
        rotary = rotary if rotary is not None else _rotary_class(layer)(config)
        object.__setattr__(self, "rotary", rotary)  # buffers of float32 frequencies: left as they are
        self.causal = causal
        self.shared = hasattr(mlp, "shared_expert")

    def position(self, x: torch.Tensor) -> Tuple[Tuple[torch.Tensor, torch.Tensor], Optional[torch.Tensor]]:
        """The rotary (cos, sin) of positions 0..T-1 and the additive causal mask (None if not
        causal), as a model's forward gives them to its layers."""
        t = x.shape[1]
        ids = torch.arange(t, device=x.device).unsqueeze(0)
        cos_sin = self.rotary(x, ids)
        mask = None
        if self.causal:
            mask = torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device).triu(1)[None, None]
        return cos_sin, mask

    def attention(self, x: torch.Tensor) -> Routed:
        layer = self.layer
        cos_sin, mask = self.position(x)
        residual = x
        h = layer.input_layernorm(x)
        h, _ = layer.self_attn(hidden_states=h, position_embeddings=cos_sin, attention_mask=mask)
        h = residual + h
        u = layer.post_attention_layernorm(h)
        u = u.view(-1, u.shape[-1])
        mlp = layer.mlp
        shared = mlp.shared_expert(u) if self.shared else None
        _, weights, experts = mlp.gate(u)
        if shared is None:
            return Routed(u, weights, experts, (h,))
        shared = torch.sigmoid(mlp.shared_expert_gate(u)) * shared
        return Routed(u, weights, experts, (h, shared))

    def expert(self, index: int, rows: torch.Tensor) -> torch.Tensor:
        experts = self.layer.mlp.experts
        e = index - self.local_experts.start
        gate, up = F.linear(rows, experts.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(experts.act_fn(gate) * up, experts.down_proj[e])

    def expert_parameters(self) -> Sequence[torch.nn.Parameter]:
        experts = self.layer.mlp.experts
        return (experts.gate_up_proj, experts.down_proj)

    def combine(self, routed: torch.Tensor, *carry: torch.Tensor) -> torch.Tensor:
        h = carry[0]
        if self.shared:
            routed = routed + carry[1]
        return h + routed.reshape(h.shape)


def phased_moe(layer: torch.nn.Module, group: Any = None, *, tokens: str = "replicated", rotary: Any = None,
               causal: bool = True) -> TransformersMoe:
    """A transformers MoE decoder layer (Mixtral's, Qwen2-MoE's) as a `MoePhases` block over the
    expert-parallel `group` (None: one rank, every expert). The layer keeps only this rank's
    E/X experts. `tokens`: "replicated" (every rank of the group is fed the same microbatches;
    one device's bits) or "split" (each its own; `average_expert_parallel_grads` after the step),
    as the module's doc says. `rotary`: the rotary embedding module (default: the
    `...RotaryEmbedding` class of the layer's model, built from its config); `causal`: a causal
    mask. Raises `pipeweave.Error` for another kind of layer, router jitter noise, an unknown
    tokens mode, or E not divisible by the group's size."""
    return TransformersMoe(layer, group, rotary=rotary, causal=causal, tokens=tokens)


def average_expert_parallel_grads(modules: Sequence[torch.nn.Module], group: Any) -> None:
    """After a step over X expert-parallel ranks with split tokens (each rank trained on its own
    data): every gradient becomes that of the mean of the X ranks' losses. The gradients of
    parameters every rank holds (attention, router, norms, shared experts, other layers) are
    summed over `group` (an all-reduce) and divided by X; those of this rank's own experts already
    hold every rank's tokens and are divided by X. With replicated tokens it does nothing: every
    rank trained on the same data, so its gradients are the step's already (one device's).
    Raises `pipeweave.Error` when the modules' blocks mix the two modes."""
    blocks = [block for module in modules for block in module.modules() if isinstance(block, MoePhases)]
    modes = {block.tokens for block in blocks}
    if len(modes) > 1:
        raise Error("the modules' MoE blocks mix tokens='replicated' and tokens='split'; give every block one mode")
    size = _group_size(group)
    if modes == {"replicated"} or size == 1:
        return
    own = {id(p) for block in blocks for p in block.expert_parameters()}
    for module in modules:
        for p in module.parameters():
            if p.grad is None:
                continue
            if id(p) not in own:
                dist.all_reduce(p.grad, group=group)
            p.grad.div_(size)
