"""A mixture of experts' all-to-alls through Python: `costs={"a2a": T}` gives the plan's
report the hidden and exposed all-to-all time (issue 46); without them the fields are None."""

import pipeweave
import pytest


def test_dual_pairs_hide_most_of_the_all_to_alls_and_beat_their_halves_in_turn():
    costs = {"F": 1, "I": 1, "W": 1, "a2a": 0.5}
    dual = pipeweave.plan("zero_bubble(dual(f1b(gpipe)))", ranks=8, microbatches=32, costs=costs)
    f1b = pipeweave.plan("f1b(gpipe)", ranks=8, microbatches=32, costs=costs)
    assert dual.a2a_hidden + dual.a2a_exposed == pytest.approx(256.0)
    assert dual.a2a_hidden_fraction > 0.7 > f1b.a2a_hidden_fraction
    assert dual.a2a_paired_fraction > 0.6 and f1b.a2a_paired_fraction == 0.0
    assert dual.makespan < dual.a2a_sequential_makespan


def test_plans_without_all_to_alls_have_none_and_bad_shares_are_refused():
    plain = pipeweave.plan("f1b(gpipe)", ranks=4, microbatches=8)
    assert plain.a2a_hidden is None and plain.a2a_sequential_makespan is None
    with pytest.raises(pipeweave.Error, match="experts = 2 must be a share"):
        pipeweave.plan("f1b(gpipe)", ranks=4, microbatches=8, costs={"experts": 2})
    dense = {"a2a": 0.5, "experts": 0}
    with pytest.raises(pipeweave.Error, match="experts = 0 says the model has no experts"):
        pipeweave.plan("f1b(gpipe)", ranks=4, microbatches=8, costs=dense)
