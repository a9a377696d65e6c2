"""Passes written in Python: used in expressions beside the built-ins, verified by the same
driver, blamed by name (`pipeweave.PassBug`) when they break a plan."""

import os
import runpy
import subprocess
import sys

import pytest

import pipeweave

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "lazy_w.py")


def lazy_w():
    return runpy.run_path(EXAMPLE)["LazyWeights"]


def test_the_example_prints_what_the_rust_example_prints():
    ours = subprocess.run([sys.executable, EXAMPLE], capture_output=True, text=True, check=True)
    cargo = subprocess.run(["cargo", "run", "--quiet", "--release", "--example", "custom_pass"],
                           cwd=ROOT, capture_output=True, text=True)
    if cargo.returncode != 0:
        pytest.skip(f"cargo run failed: {cargo.stderr[-300:]}")
    assert ours.stdout == cargo.stdout


def test_python_pass_composes_with_the_builtins():
    LazyWeights = lazy_w()
    options = dict(ranks=4, microbatches=12, costs={"F": 18, "I": 18, "W": 9},
                   activation_memory={"total": 1, "weight_grad": 0.34}, passes=[LazyWeights])
    plan = pipeweave.plan("lazy_w(vpp(f1b(gpipe), chunks=2), memory=6)", **options)
    assert plan.passes == ["gpipe", "f1b", "vpp", "lazy_w"]
    assert plan.makespan == 589.5
    assert any("I" in a for a in plan.order[0])
    with pytest.raises(pipeweave.Error, match="cannot run after `lazy_w`"):
        pipeweave.plan("zero_bubble(lazy_w(f1b(gpipe)))", **options)
    with pytest.raises(pipeweave.Error, match="unknown pass `lazy_w`"):
        pipeweave.plan("lazy_w(f1b(gpipe))", ranks=4, microbatches=8)


def test_register_for_the_process():
    LazyWeights = lazy_w()
    pipeweave.register(LazyWeights)
    try:
        assert "lazy_w" in pipeweave.passes()
        plan = pipeweave.plan("lazy_w(f1b(gpipe), memory=4)", ranks=4, microbatches=8)
        assert plan.passes[-1] == "lazy_w"
        with pytest.raises(pipeweave.Error, match="already registered"):
            class Other(LazyWeights):
                pass
            pipeweave.register(Other)
    finally:
        pipeweave.unregister("lazy_w")
    with pytest.raises(pipeweave.Error, match="already registered"):
        class Shadow:
            name = "f1b"

            def rewrite(self, plan):
                return plan.order
        pipeweave.register(Shadow)


class DropsLastOp:
    name = "drops_last"

    def rewrite(self, plan):
        orders = [list(o) for o in plan.order]
        orders[0] = orders[0][:-1]
        return orders


class SplitsSilently:
    """Splits backwards without declaring it changes them."""
    name = "splits"

    def rewrite(self, plan):
        out = []
        for rank in range(plan.ranks):
            order = []
            for text in plan.order[rank]:
                s, k, m = pipeweave.parse_action(text)
                order += [f"{s}I{m}", f"{s}W{m}"] if k == "B" else [text]
            out.append(order)
        return out


class Raises:
    name = "raises"

    def rewrite(self, plan):
        raise KeyError("no such thing")


class Garbage:
    name = "garbage"

    def rewrite(self, plan):
        return [["not an action"]] * plan.ranks


class TakesNothing:
    name = "takes_nothing"

    def rewrite(self, plan):
        return plan.order


@pytest.mark.parametrize("cls,expected", [
    (DropsLastOp, "pass `drops_last` produced an invalid plan"),
    (SplitsSilently, "pass `splits` failed (a bug in the pass): its orders: invalid problem: the plan claims whole backwards"),
    (Raises, "pass `raises` failed (a bug in the pass): RuntimeError: rewrite raised KeyError"),
    (Garbage, "pass `garbage` failed (a bug in the pass): its orders"),
])
def test_a_pass_that_breaks_a_plan_is_blamed_by_name(cls, expected):
    with pytest.raises(pipeweave.PassBug) as raised:
        pipeweave.plan(f"{cls.name}(f1b(gpipe))", ranks=4, microbatches=8, passes=[cls])
    assert str(raised.value).startswith(expected), str(raised.value)


def test_bad_arguments_and_declarations_are_the_users():
    with pytest.raises(pipeweave.Error) as raised:
        pipeweave.plan("takes_nothing(f1b(gpipe), k=2)", ranks=4, microbatches=8,
                       passes=[TakesNothing])
    assert not isinstance(raised.value, pipeweave.PassBug)
    assert "takes_nothing" in str(raised.value)

    class BadPacing(TakesNothing):
        name = "bad_pacing"
        requires = {"pacing": ["sideways"]}

    with pytest.raises(pipeweave.Error, match="pacing `sideways` is not one of"):
        pipeweave.plan("bad_pacing(f1b(gpipe))", ranks=4, microbatches=8, passes=[BadPacing])

    class Moves(TakesNothing):
        name = "moves"
        changes = ("placement",)

    with pytest.raises(pipeweave.Error, match="`placement` is not one of"):
        pipeweave.plan("moves(f1b(gpipe))", ranks=4, microbatches=8, passes=[Moves])

    class NeedsFillDrain(TakesNothing):
        name = "needs_fill_drain"
        requires = {"pacing": ["fill_drain"]}

    with pytest.raises(pipeweave.Error, match="cannot run after `f1b`"):
        pipeweave.plan("needs_fill_drain(f1b(gpipe))", ranks=4, microbatches=8,
                       passes=[NeedsFillDrain])
    assert pipeweave.plan("needs_fill_drain(gpipe)", ranks=4, microbatches=8,
                          passes=[NeedsFillDrain]).passes == ["gpipe", "needs_fill_drain"]
    with pytest.raises(pipeweave.Error):
        pipeweave.plan("f1b(gpipe)", ranks=4, microbatches=8, passes=[object])
