"""Model families from Hugging Face transformers, built from their configs with random weights and
cut into a plain list of layers (each takes and returns one tensor), as a user hands a model to
`pwt.profile`, `pwt.split` and PyTorch's `PipelineStage`s.

    layers = build("llama", torch)          # [embedding, 8 decoder layers, norm + head]
    x, y = batch(torch, microbatches=8)     # token ids and next-token targets

Families: `llama` (LlamaDecoderLayer: RMSNorm, rotary attention, SwiGLU MLP), `gpt2` (GPT2Block:
LayerNorm, learned positions, Conv1D projections, GELU MLP), `qwen2` (Qwen2DecoderLayer: Llama's
layout with biased q/k/v projections). One microbatch is `SEQUENCES` sequences of `TOKENS` tokens;
the loss is the mean cross entropy of every token's next-token prediction.
"""

from __future__ import annotations

from typing import Any, List, Tuple

FAMILIES = ("llama", "gpt2", "qwen2")
LAYERS = 8
WIDTH = 256
HEADS = 4
VOCAB = 512
TOKENS = 32
SEQUENCES = 4  # per microbatch
SEED = 1234


def _modules(torch: Any) -> Any:
    """The wrapper classes, defined once torch is imported."""
    nn = torch.nn

    class Embedding(nn.Module):
        """Token ids to hidden states (and learned positions where the family has them)."""

        def __init__(self, vocab: int, width: int, positions: int = 0) -> None:
            super().__init__()
            self.tokens = nn.Embedding(vocab, width)
            self.positions = nn.Embedding(positions, width) if positions else None

        def forward(self, ids: Any) -> Any:
            out = self.tokens(ids)
            if self.positions is not None:
                out = out + self.positions(torch.arange(ids.shape[-1], device=ids.device))
            return out

    class Rotary(nn.Module):
        """A decoder layer that takes its rotary position embeddings from the sequence length
        (so that it takes and returns one tensor)."""

        def __init__(self, layer: Any, rotary: Any) -> None:
            super().__init__()
            self.layer = layer
            self.rotary = rotary

        def forward(self, hidden: Any) -> Any:
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            cos_sin = self.rotary(hidden, positions)
            out = self.layer(hidden, position_embeddings=cos_sin)
            return out[0] if isinstance(out, tuple) else out

    class Block(nn.Module):
        """A decoder layer whose forward takes the hidden states alone."""

        def __init__(self, layer: Any) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, hidden: Any) -> Any:
            out = self.layer(hidden)
            return out[0] if isinstance(out, tuple) else out

    class Head(nn.Module):
        """The final norm and the vocabulary projection: logits."""

        def __init__(self, norm: Any, width: int, vocab: int, bias: bool = False) -> None:
            super().__init__()
            self.norm = norm
            self.proj = nn.Linear(width, vocab, bias=bias)

        def forward(self, hidden: Any) -> Any:
            return self.proj(self.norm(hidden))

    return Embedding, Rotary, Block, Head


def build(family: str, torch: Any, *, layers: int = LAYERS, dtype: Any = None) -> List[Any]:
    """The model of `family` as a list of `layers + 2` modules, weights seeded by `SEED`."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    torch.manual_seed(SEED)
    Embedding, Rotary, Block, Head = _modules(torch)
    dtype = dtype or torch.float32
    if family == "gpt2":
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        config = GPT2Config(vocab_size=VOCAB, n_positions=TOKENS, n_embd=WIDTH, n_layer=layers,
                            n_head=HEADS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            activation_function="gelu_new", bos_token_id=None, eos_token_id=None)
        config._attn_implementation = "sdpa"
        body = [Block(GPT2Block(config, layer_idx=i)) for i in range(layers)]
        out = [Embedding(VOCAB, WIDTH, TOKENS), *body,
               Head(torch.nn.LayerNorm(WIDTH, eps=config.layer_norm_epsilon), WIDTH, VOCAB)]
    else:
        if family == "llama":
            from transformers import LlamaConfig as Config
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer as Layer
            from transformers.models.llama.modeling_llama import LlamaRMSNorm as Norm
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding as Rope
        else:
            from transformers import Qwen2Config as Config
            from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer as Layer
            from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm as Norm
            from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding as Rope
        config = Config(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=688,
                        num_hidden_layers=layers, num_attention_heads=HEADS,
                        num_key_value_heads=HEADS, max_position_embeddings=TOKENS,
                        attention_dropout=0.0)
        config._attn_implementation = "sdpa"
        rope = Rope(config=config)
        body = [Rotary(Layer(config, layer_idx=i), rope) for i in range(layers)]
        out = [Embedding(VOCAB, WIDTH), *body,
               Head(Norm(WIDTH, eps=config.rms_norm_eps), WIDTH, VOCAB)]
    return [m.to(dtype) for m in out]


def loss_fn(torch: Any) -> Any:
    """The loss on the head's logits: mean cross entropy over every token."""

    def loss(logits: Any, target: Any) -> Any:
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                 target.reshape(-1))

    return loss


def batch(torch: Any, microbatches: int, step: int = 0) -> Tuple[Any, Any]:
    """`microbatches` microbatches of token ids and their next-token targets (seeded by `step`)."""
    generator = torch.Generator().manual_seed(SEED + step)
    ids = torch.randint(0, VOCAB, (microbatches * SEQUENCES, TOKENS + 1), generator=generator)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
