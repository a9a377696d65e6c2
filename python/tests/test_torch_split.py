"""The split backward of `pipeweave.torch` (`_weight_grad`): I runs the whole backward but the
linear layers' weight gradients and keeps what they need, W computes them; the gradients equal a
full backward's bit for bit (float64) on both of its forward paths (the native product with the
weight detached, and the tracked `DeferredLinear` a recompute or a meter needs), for Linear and
transformers' Conv1D, with and without bias; a module it does not know is named and left to
PyTorch's autograd split; what it keeps from I to W is what `weight_grad_bytes` reports."""

import re
import types

import pytest

torch = pytest.importorskip("torch")

import pipeweave.torch as pwt  # noqa: E402
from pipeweave.torch import _weight_grad as WG  # noqa: E402
from pipeweave.torch._memory import LEDGER  # noqa: E402


def conv1d(nf, nx):
    transformers = pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    assert transformers is not None
    return Conv1D(nf, nx)


def model(kind, bias=True):
    torch.manual_seed(7)
    nn = torch.nn
    if kind == "linear":
        layers = [nn.Linear(6, 10, bias=bias), nn.GELU(), nn.LayerNorm(10), nn.Linear(10, 6, bias=bias), nn.Tanh()]
    else:
        layers = [conv1d(10, 6), nn.GELU(), nn.LayerNorm(10), conv1d(6, 10), nn.Tanh()]
    return nn.Sequential(*layers).double()


def grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters()}


def split_run(module, inputs, tracked):
    """Forwards of every input, then each one's I (capturing) and, after all of them, the Ws."""
    holder = types.SimpleNamespace(submod=module, dw_builder=None)
    installed = WG.install(holder)
    installed.stash.tracked = tracked
    outs = [module(x.clone().requires_grad_(True)) for x in inputs]
    installed.stash.tracked = False
    closures = []
    for out in outs:
        installed.stash.backward = installed.stash.capturing = True
        out.sum().backward()
        installed.stash.backward = installed.stash.capturing = False
        closures.append(holder.dw_builder())
    for weight_gradients in closures:
        weight_gradients()
    WG.uninstall(installed)
    return grads(module)


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tracked", [False, True])
@pytest.mark.parametrize("shape", [(3, 6), (2, 5, 6)])
def test_i_then_w_equals_the_full_backward_bit_for_bit(kind, bias, tracked, shape):
    if kind == "conv1d" and not bias:
        pytest.skip("Conv1D always has a bias")
    inputs = [torch.randn(*shape, dtype=torch.float64) for _ in range(3)]
    reference = model(kind, bias)
    for x in inputs:
        reference(x.clone().requires_grad_(True)).sum().backward()
    got = split_run(model(kind, bias), inputs, tracked)
    for name, expected in grads(reference).items():
        assert torch.equal(got[name], expected), name


def test_a_full_backward_of_an_installed_stage_computes_everything_at_once():
    inputs = [torch.randn(4, 6, dtype=torch.float64) for _ in range(2)]
    reference, module = model("linear"), model("linear")
    for x in inputs:
        reference(x.clone().requires_grad_(True)).sum().backward()
    holder = types.SimpleNamespace(submod=module, dw_builder=None)
    installed = WG.install(holder)
    for x in inputs:
        out = module(x.clone().requires_grad_(True))
        installed.stash.backward = True  # a B: the runtime's backward, not capturing
        out.sum().backward()
        installed.stash.backward = False
        holder.dw_builder()()  # what PyTorch's runtime calls after a full backward: nothing left
    WG.uninstall(installed)
    for name, expected in grads(reference).items():
        assert torch.equal(module.get_parameter(name).grad, expected), name


def test_a_backward_outside_the_stages_own_adds_no_weight_gradient():
    # PyTorch's runtime infers the gradients' shapes by asking autograd for the input gradient
    # alone; the deferred layers must add nothing then.
    module = model("linear")
    holder = types.SimpleNamespace(submod=module, dw_builder=None)
    installed = WG.install(holder)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    torch.autograd.grad(module(x).sum(), [x])
    WG.uninstall(installed)
    assert all(p.grad is None for p in module.parameters())


def test_uninstall_puts_the_layers_and_the_builder_back():
    module = model("linear")
    holder = types.SimpleNamespace(submod=module, dw_builder="theirs")
    installed = WG.install(holder)
    assert "forward" in module[0].__dict__ and holder.dw_builder != "theirs"
    WG.uninstall(installed)
    assert "forward" not in module[0].__dict__ and holder.dw_builder == "theirs"


class Scaled(torch.nn.Module):
    """A module with a matrix of its own that is not a linear layer."""

    def __init__(self):
        super().__init__()
        self.matrix = torch.nn.Parameter(torch.randn(6, 6, dtype=torch.float64))

    def forward(self, x):
        return x @ self.matrix


class LoRALinear(torch.nn.Linear):
    """A linear layer that computes otherwise (its own forward)."""

    def forward(self, x):
        return super().forward(x) * 2


def test_splittable_names_what_it_does_not_know():
    assert pwt.splittable(model("linear")) == (True, "")
    embedding = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Linear(6, 6))
    assert pwt.splittable(embedding)[0]
    ok, why = pwt.splittable(torch.nn.Sequential(torch.nn.Linear(6, 6), Scaled()))
    assert not ok and "1.matrix (Scaled)" in why
    ok, why = pwt.splittable(torch.nn.Sequential(LoRALinear(6, 6)))
    assert not ok and "LoRALinear" in why


def test_weight_grad_bytes_is_what_i_keeps_for_w():
    module = model("linear")
    x = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)
    kept = pwt.weight_grad_bytes(module, x)
    # Each linear layer's input and output gradient, the stage's input left out: the first
    # layer's output gradient (8x10), the LayerNorm's output (the second layer's input, 8x10)
    # and the second layer's output gradient (8x6), in float64.
    assert kept == 8 * (10 + 10 + 6) * 8
    assert LEDGER.device_bytes == 0
    assert all(p.grad is None for p in module.parameters())
    # PyTorch's split for a module this does not know: what its input gradient keeps.
    other = torch.nn.Sequential(torch.nn.Linear(6, 6), Scaled()).double()
    assert pwt.weight_grad_bytes(other, x) > 0


import torch_harness as H  # noqa: E402


@pytest.mark.parametrize("ranks,wrap", H.GROUPS, ids=[f"P{p}-{w}" for p, w in H.GROUPS])
def test_the_schedule_says_how_each_stage_is_split(ranks, wrap):
    results = H.group(torch, ranks, wrap)
    for (tag, expression, m), (report, records) in results.items():
        splits = [how for r in records for how in r["split_backward"].values()]
        if tag == "fallback":
            # Every stage holds the module the split does not know: PyTorch's split, named.
            assert splits and all(h.startswith("autograd (") and "Mixed" in h for h in splits), splits
        elif any(re.search(r"\dI\d", a) for o in report["order"] for a in o):
            assert splits and all(h == "pipeweave" for h in splits), (expression, splits)
        else:
            assert not splits, (expression, splits)
