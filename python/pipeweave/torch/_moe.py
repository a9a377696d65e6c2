"""Mixture-of-experts blocks described by their phases, for the real overlap of `pwt.overlap`.

    block = pwt.phased_moe(layer, group=ep_group)   # a transformers MixtralDecoderLayer / Qwen2MoeDecoderLayer
    out = block(x)                                   # the layer's forward, experts over the group

A block says once what its phases compute (`MoePhases`): `attention(x)` (everything before the
experts, the router included) returns the tokens the experts read, each token's expert weights and
indices, and what `combine` needs besides the experts' output (`Routed`); `expert(index, rows)`
runs one expert; `combine(routed, *carry)` finishes the block. This module does the rest: the
dispatch (the tokens sorted by expert and sent with `all_to_all_single` to the expert-parallel
rank that holds each expert, `E/X` experts per rank), the experts, and the combine (the rows sent
back and summed per token with their weights). `forward(x)` runs them one after the other, the
all-to-alls as autograd functions (the backward of one is the reverse all-to-all);
`pwt.overlap` runs the same functions phase by phase (`_tape`).

The token counts (E integers) are exchanged synchronously right after the router, before the
dispatch can be issued; the dispatch and combine themselves are asynchronous where overlapped.
"""

from __future__ import annotations

import sys
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._errors import Error

__all__ = ["MoePhases", "Routed", "phased_moe", "average_expert_parallel_grads"]


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
    layer with `phased_moe`). A subclass calls `super().__init__(num_experts, group)` and defines
    `attention(x) -> Routed`, `expert(index, rows) -> rows` (a global expert index this rank
    holds: `local_experts`) and `combine(routed, *carry) -> out`. `group`: the expert-parallel
    process group (X ranks, each holding E/X experts, rank r those from r*E/X); None: this rank
    holds every expert and nothing is sent."""

    def __init__(self, num_experts: int, group: Any = None):
        super().__init__()
        size = _group_size(group)
        if num_experts < 1 or num_experts % size:
            raise Error(f"{num_experts} experts do not divide over {size} expert-parallel ranks")
        self.num_experts = num_experts
        self.group = group  # a process group: neither a submodule nor a buffer
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
        """The block's forward, phase after phase, the all-to-alls waited on at once."""
        phases = self.phase_functions()
        send, weights, *carry = phases.attention(x)
        layout = phases.layout
        recv = _AllToAll.apply(send, layout.recv_rows, layout.send_rows, self.group) if layout.sends else send
        (y,) = phases.experts(recv)
        back = _AllToAll.apply(y, layout.send_rows, layout.recv_rows, self.group) if layout.sends else y
        (out,) = phases.merge(back, weights, *carry)
        return out


# --------------------------------------------------------------------------------- dispatch layout


class Layout:
    """Where each (token, expert) pair goes: `order` sorts the [k*N] pairs (choice-major) by
    expert (stable), `token` is each sorted pair's token; `send_rows`
    and `recv_rows` are the all-to-all's split sizes per expert-parallel rank; on the receiving
    side `perm` sorts the received rows by local expert (then by source rank) and `expert_rows`
    counts them per local expert. Built once per forward: exchanging the counts is a collective."""

    def __init__(self, experts: torch.Tensor, num_experts: int, group: Any):
        size = _group_size(group)
        per = num_experts // size
        self.tokens = experts.shape[0]
        self.k = experts.shape[-1] if experts.dim() > 1 else 1
        # Pairs numbered choice-major (every token's first expert, then every token's second...),
        # as transformers' experts loop visits them: each expert reads its rows in that order.
        flat = experts.reshape(self.tokens, self.k).t().reshape(-1).to(torch.long)
        self.order = torch.argsort(flat, stable=True)
        self.token = self.order % self.tokens
        counts = torch.bincount(flat, minlength=num_experts)
        if counts.numel() != num_experts:
            raise Error(f"the router chose expert {int(flat.max())}; the block has {num_experts} experts")
        self.sends = size > 1
        self.send_rows = counts.view(size, per).sum(1).tolist()
        if self.sends:
            received = torch.empty_like(counts)
            dist.all_to_all_single(received, counts, group=group)
        else:
            received = counts
        grid = received.view(size, per)
        self.recv_rows = grid.sum(1).tolist()
        self.expert_rows = grid.sum(0).tolist()
        local = torch.arange(per, device=flat.device).repeat(size)
        expert_of_row = torch.repeat_interleave(local, grid.reshape(-1))
        self.perm = torch.argsort(expert_of_row, stable=True)
        self.unperm = torch.argsort(self.perm)


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
                self.layout = Layout(routed.experts, block.num_experts, block.group)
        send = routed.tokens.index_select(0, self.layout.token)
        return (send, routed.weights, *routed.carry)

    def experts(self, recv: torch.Tensor) -> Tuple[torch.Tensor]:
        block, layout = self.block, self.layout
        assert layout is not None
        rows = recv.index_select(0, layout.perm)
        pieces = []
        for j, chunk in enumerate(rows.split(layout.expert_rows)):
            pieces.append(block.expert(block.local_experts[j], chunk) if chunk.shape[0] else chunk)
        y = torch.cat(pieces) if pieces else rows
        return (y.index_select(0, layout.unperm),)

    def merge(self, back: torch.Tensor, weights: torch.Tensor, *carry: torch.Tensor) -> Tuple[torch.Tensor]:
        layout = self.layout
        assert layout is not None
        w = weights.reshape(layout.tokens, layout.k).t().reshape(-1).index_select(0, layout.order)
        zeros = back.new_zeros((layout.tokens,) + tuple(back.shape[1:]))
        routed = zeros.index_add(0, layout.token, back * w.unsqueeze(-1))
        return (self.block.combine(routed, *carry),)


# --------------------------------------------------------------------------------- all-to-all


def all_to_all(x: torch.Tensor, out_rows: Sequence[int], in_rows: Sequence[int], group: Any,
               async_op: bool = False) -> Tuple[torch.Tensor, Any, torch.Tensor]:
    """`x`'s rows sent with `all_to_all_single` (`in_rows` to each rank, `out_rows` from each);
    returns the receive buffer, the work handle (None when waited on already) and the buffer
    sent (to keep until the work completes)."""
    x = x.detach().contiguous()
    out = x.new_empty((sum(out_rows),) + tuple(x.shape[1:]))
    work = dist.all_to_all_single(out, x, list(out_rows), list(in_rows), group=group, async_op=async_op)
    return out, work, x


class _AllToAll(torch.autograd.Function):
    """An all-to-all whose backward is the reverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_rows: List[int], in_rows: List[int], group: Any) -> torch.Tensor:
        ctx.rows = (out_rows, in_rows)
        ctx.group = group
        return all_to_all(x, out_rows, in_rows, group)[0]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        out_rows, in_rows = ctx.rows
        return all_to_all(grad, in_rows, out_rows, ctx.group)[0], None, None, None


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

    def __init__(self, layer: torch.nn.Module, group: Any = None, rotary: Any = None, causal: bool = True):
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
        super().__init__(total, group)
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


def phased_moe(layer: torch.nn.Module, group: Any = None, *, rotary: Any = None,
               causal: bool = True) -> TransformersMoe:
    """A transformers MoE decoder layer (Mixtral's, Qwen2-MoE's) as a `MoePhases` block over the
    expert-parallel `group` (None: one rank, every expert). The layer keeps only this rank's
    E/X experts. `rotary`: the rotary embedding module (default: the `...RotaryEmbedding` class of
    the layer's model, built from its config); `causal`: a causal mask. Raises `pipeweave.Error`
    for another kind of layer, router jitter noise, or E not divisible by the group's size."""
    return TransformersMoe(layer, group, rotary=rotary, causal=causal)


def average_expert_parallel_grads(modules: Sequence[torch.nn.Module], group: Any) -> None:
    """After a step over X expert-parallel ranks that each trained on their own data: every
    gradient becomes that of the mean of the X ranks' losses. The gradients of parameters every
    rank holds (attention, router, norms, shared experts, other layers) are summed over `group`
    (an all-reduce) and divided by X; those of this rank's own experts already hold every rank's
    tokens and are divided by X."""
    size = _group_size(group)
    own = {id(p) for module in modules for block in module.modules() if isinstance(block, MoePhases)
           for p in block.expert_parameters()}
    for module in modules:
        for p in module.parameters():
            if p.grad is None:
                continue
            if id(p) not in own and size > 1:
                dist.all_reduce(p.grad, group=group)
            if size > 1:
                p.grad.div_(size)
