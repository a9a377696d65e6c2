"""`pipeweave.torch.profile` measures a small transformer-ish model (attention + MLP blocks, no
Hugging Face needed) into a profile whose fields are all positive and sane, and `pipeweave.torch
.split` cuts the layers into stage modules whose composition is the original model."""

import json

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import torch_harness as H  # noqa: E402
import pipeweave.torch as pwt  # noqa: E402
from pipeweave._errors import Error  # noqa: E402
from pipeweave.torch._split import spread_shares  # noqa: E402

DIM, HEADS, SEQ, BATCH = 16, 2, 6, 2


class Block(nn.Module):
    """Pre-norm attention and MLP with residuals."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def model():
    torch.manual_seed(0)
    return [nn.Linear(8, DIM), Block(), Block(), Block(), nn.Linear(DIM, 8)]


def mse(out, target):
    return ((out - target) ** 2).mean()


def example():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, SEQ, 8, generator=g), torch.randn(BATCH, SEQ, 8, generator=g)


@pytest.fixture(scope="module")
def measured():
    layers = model()
    x, y = example()
    return layers, pwt.profile(layers, x, loss_fn=mse, target=y, repeats=3)


def document(prof):
    return json.loads(prof.to_json())


def test_profile_fields_are_positive_and_sane(measured):
    layers, prof = measured
    doc = document(prof)
    assert doc["format"] == "pipeweave-profile/2"
    assert doc["model"]["name"] == "Linear+Block"
    assert doc["model"]["seq_len"] == SEQ and doc["model"]["microbatch_size"] == BATCH
    assert doc["model"]["dtype"] == "f32"
    assert doc["threads_per_rank"] == torch.get_num_threads() and doc["repeats"] == 3
    assert doc["calibrated"] is False
    assert [l["name"] for l in doc["layers"]] == [str(i) for i in range(len(layers))]
    assert doc["runtime"] == "pytorch"
    for layer in doc["layers"]:
        assert layer["placement"] == "any"
        for key in ("forward", "backward", "input_grad", "weight_grad"):
            assert 0 < layer[key] < 1.0, (layer["name"], key, layer[key])
        assert layer["activation_bytes"] > 0
        assert layer["weight_grad_bytes"] > 0
    blocks = doc["layers"][1:4]
    # The blocks hold MultiheadAttention's own projection matrix, which pipeweave's split does
    # not know: PyTorch's split, which keeps part of what the forward saved.
    assert not pwt.splittable(layers[1])[0]
    assert all(b["weight_grad_bytes"] <= b["activation_bytes"] for b in blocks)
    # The first layer is a linear layer split by pipeweave: its I keeps its input (what its
    # forward saved) and its output gradient, BATCH x SEQ x DIM floats.
    first = doc["layers"][0]
    assert first["weight_grad_bytes"] == first["activation_bytes"] + BATCH * SEQ * DIM * 4
    # The three blocks are the same work: their activation bytes are equal, and a block saves
    # more than the linear layers around it.
    assert len({b["activation_bytes"] for b in blocks}) == 1
    assert blocks[0]["activation_bytes"] > doc["layers"][0]["activation_bytes"]
    # The tensor between two blocks is BATCH x SEQ x DIM floats.
    assert doc["send"]["bytes"] == BATCH * SEQ * DIM * 4
    assert 0 < doc["send"]["seconds"] < 1.0
    # The model's gradients were left as they were.
    assert all(p.grad is None for l in layers for p in l.parameters())


def test_profile_saves_and_loads(measured, tmp_path):
    _, prof = measured
    path = tmp_path / "profile.json"
    prof.save(str(path))
    again = type(prof).load(str(path))
    assert document(again) == document(prof)


def compose(parts, x):
    for part in parts:
        x = part(x)
    return x


def test_split_composes_to_the_model_even_cut():
    layers = model()
    x, _ = example()
    want = compose(layers, x)
    plan = H.make_plan("vpp(f1b(gpipe), chunks=2)", 2, 4)
    parts = pwt.split(layers, plan)
    assert [len(p) for p in parts] == [1, 1, 1, 2]  # floor(k*5/4)
    assert torch.equal(compose(parts, x), want)


def test_split_follows_the_plans_cut(measured):
    layers, prof = measured
    import pipeweave

    assert isinstance(prof, pipeweave.Profile)

    x, _ = example()
    want = compose(layers, x)
    for expression, ranks in (("f1b(gpipe)", 2), ("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", 2)):
        even = pipeweave.plan(expression, ranks=ranks, microbatches=4, profile=prof)
        plan = pipeweave.plan(expression, ranks=ranks, microbatches=4, profile=prof,
                              layers_per_stage=even.layers_per_stage)
        shares = plan.layers_per_stage
        assert sum(shares) == len(layers)
        parts = pwt.split(layers, plan)
        assert len(parts) == plan.stages
        per_rank = [0] * ranks
        for s, part in enumerate(parts):
            per_rank[plan.stage_to_rank[s]] += len(part)
        assert per_rank == list(shares)
        assert torch.equal(compose(parts, x), want)


def test_split_spreads_shares_as_the_core_does():
    # core/src/ir/blocks.rs: shares_spread_over_a_ranks_positions_earlier_first
    assert spread_shares([0, 1, 1, 0], [3, 2]) == [2, 1, 1, 1]
    assert spread_shares([0, 1, 1, 0], [0, 5]) == [0, 3, 2, 0]
    assert spread_shares([0, 1, 0, 1], [2, 3]) == [1, 2, 1, 1]
    plan = H.make_plan("vpp(f1b(gpipe), chunks=2, layout=v)", 2, 4)
    parts = pwt.split(model(), plan, layers_per_stage=[3, 2])
    assert [len(p) for p in parts] == [2, 1, 1, 1]


def test_split_refuses_counts_that_do_not_sum():
    plan = H.make_plan("f1b(gpipe)", 2, 4)
    with pytest.raises(Error, match="sums to 4; the model has 5 layers"):
        pwt.split(model(), plan, layers_per_stage=[2, 2])
    with pytest.raises(Error, match="has 3 counts; the plan has 2 ranks"):
        pwt.split(model(), plan, layers_per_stage=[2, 2, 1])
    with pytest.raises(Error, match="fewer than the plan's 4 stages"):
        pwt.split(model()[:3], H.make_plan("vpp(f1b(gpipe), chunks=2)", 2, 4))


def test_split_without_a_cut_is_the_cut_the_plan_was_costed_with():
    import os
    import pipeweave

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    prof = pipeweave.Profile.load(os.path.join(root, "tests", "fixtures", "generic_profile_v2.json"))
    layers = len(prof.layers)
    plan = pipeweave.plan("vpp(f1b(gpipe), chunks=2)", ranks=2, microbatches=4, profile=prof)
    assert not plan.cut_given
    counts = pwt.stage_layer_counts(layers, plan)
    assert counts == [(k + 1) * layers // 4 - k * layers // 4 for k in range(4)]
    shares = [sum(c for s, c in enumerate(counts) if plan.stage_to_rank[s] == r) for r in range(2)]
    explicit = pipeweave.plan("vpp(f1b(gpipe), chunks=2)", ranks=2, microbatches=4, profile=prof,
                              layers_per_stage=shares)
    assert explicit.cut_given
    assert pwt.stage_layer_counts(layers, explicit) == counts
    assert explicit.makespan == plan.makespan
