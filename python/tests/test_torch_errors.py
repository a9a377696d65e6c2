"""What `pipeweave.torch.schedule` refuses, with `pipeweave.Error`: DualPipe's two routes (naming
the DualPipeV expression that does the same on one route), recomputes for a weight gradient,
sequence chunks (`seq_split`), and stages that do not match the plan."""

import types

import pytest

pytest.importorskip("torch")

import torch_harness as H  # noqa: E402
import pipeweave.torch as pwt  # noqa: E402
from pipeweave._errors import Error  # noqa: E402


def fake_stage(index, stages, ranks, rank):
    return types.SimpleNamespace(stage_index=index, num_stages=stages, group_size=ranks, group_rank=rank)


@pytest.mark.parametrize("expression", ["dual(f1b(gpipe))", "zero_bubble(dual(f1b(gpipe)))"])
def test_dualpipe_names_dualpipev(expression):
    plan = H.make_plan(expression, 2, 4)
    assert len(plan.routes) > 1
    stages = [fake_stage(s, plan.stages, 2, 0) for s in plan.stages_on(0)]
    with pytest.raises(Error) as info:
        pwt.schedule(plan, stages, loss_fn=H.loss_fn)
    assert "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_the_dualpipev_expression_has_one_route():
    plan = H.make_plan(pwt.DUALPIPE_V, 2, 4)
    assert len(plan.routes) == 1 and not plan.tied_stages


def test_recomputes_for_a_weight_gradient_are_refused():
    plan = H.make_plan("recompute(zero_bubble(f1b(gpipe), policy=h1), memory=1)", 2, 4)
    assert any(a.endswith("RW0") or "RW" in a for a in plan.order[1])
    stages = [fake_stage(s, plan.stages, 2, 1) for s in plan.stages_on(1)]
    with pytest.raises(Error, match="recomputes what [0-9]+ weight-gradient backward\\(s\\) keep"):
        pwt.schedule(plan, stages, loss_fn=H.loss_fn)


def test_sequence_chunks_are_refused():
    plan = H.make_plan("seq_split(f1b(gpipe), chunks=2)", 2, 4)
    assert plan.seq_chunks == 2
    stages = [fake_stage(s, plan.stages, 2, 0) for s in plan.stages_on(0)]
    with pytest.raises(Error, match="keeps no state between the microbatches of a stage"):
        pwt.schedule(plan, stages, loss_fn=H.loss_fn)


def test_stages_must_match_the_plan():
    plan = H.make_plan("vpp(f1b(gpipe), chunks=2)", 2, 4)  # rank 0 holds stages 0 and 2
    with pytest.raises(Error, match="holds stages \\[0, 2\\]"):
        pwt.schedule(plan, [fake_stage(0, 4, 2, 0)], loss_fn=H.loss_fn)
    with pytest.raises(Error, match="pipeline of 3 stages"):
        pwt.schedule(plan, [fake_stage(0, 3, 2, 0), fake_stage(2, 3, 2, 0)], loss_fn=H.loss_fn)
    with pytest.raises(Error, match="group has 4 ranks"):
        pwt.schedule(plan, [fake_stage(0, 4, 4, 0), fake_stage(2, 4, 4, 0)], loss_fn=H.loss_fn)
    with pytest.raises(Error, match="needs this rank's PipelineStage"):
        pwt.schedule(plan, [], loss_fn=H.loss_fn)


def test_lowering_keeps_compute_and_anchors_residency():
    plan = H.make_plan("offload(f1b(gpipe), memory=1)", 2, 4, costs=H.OFFLOAD_COSTS)
    orders, before, after = pwt.lower_plan(plan)
    assert [str(a) for a in orders[0]] == [a for a in plan.order[0] if "LOAD" not in a]
    assert after[0][(0, "F", 0)] == [("OFFLOAD", 0, 0)]
    assert before[0][(0, "B", 0)] == [("RELOAD", 0, 0)]
    plan = H.make_plan("recompute(f1b(gpipe), memory=1)", 2, 4)
    orders, before, _ = pwt.lower_plan(plan)
    assert before[0][(0, "B", 1)] == [("R", 0, 1)]
    assert plan.recomputed == {(0, 0), (0, 1), (0, 2), (0, 3)}
