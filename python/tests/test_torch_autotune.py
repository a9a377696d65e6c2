"""`pipeweave.torch.autotune` measures on the ranks: every rank gets the same choice, the fastest
measured of tune's candidates and PyTorch's classes; tune's candidates carry their predicted and
calibrated steps; the profile comes back calibrated for PyTorch's runtime; the chosen schedule
trains with one device's gradients and losses. Bad arguments are `pipeweave.Error`s."""

import pytest

torch = pytest.importorskip("torch")

import pipeweave  # noqa: E402
import pipeweave.torch as pwt  # noqa: E402
import torch_harness as H  # noqa: E402

RANKS, MICROBATCHES = 2, 4


@pytest.fixture(scope="module")
def records():
    return H.run_autotune(RANKS, MICROBATCHES)


def test_every_rank_gets_the_same_fastest_measured_choice(records):
    assert len(records) == RANKS
    assert len({r["best"] for r in records}) == 1
    trials = records[0]["trials"]
    measured = [t for t in trials if t["measured"] is not None]
    assert {t["kind"] for t in measured} == {"pipeweave", "pytorch"}
    best = min(measured, key=lambda t: t["measured"])
    assert records[0]["best"] == best["name"]
    # The ranks agree on every figure (the step times are gathered).
    assert records[0]["trials"] == records[1]["trials"]
    # Every candidate ran the first round; the later ones ran only those within 10% of the
    # fastest so far (the best among them).
    # The budget (60 s) outlasts both rounds of these small steps, so the trial with the fastest
    # first round always ran the second. The best is the lowest median; on a noisy machine that
    # may be a trial dropped after one round (the finalists' second rounds ran slower).
    fastest_first = min(t["rounds"][0] for t in measured)
    leader = min(measured, key=lambda t: t["rounds"][0])
    assert len(leader["rounds"]) == 2
    for t in measured:
        assert t["measured"] > 0 and len(t["rounds"]) in (1, 2)
        if len(t["rounds"]) == 1:
            assert t["rounds"][0] > 1.1 * fastest_first
        if t["kind"] == "pipeweave":
            assert t["predicted"] > 0 and t["calibrated"] > 0
        else:
            assert t["predicted"] is None and t["name"].startswith("Schedule")


def test_the_profile_comes_back_calibrated_for_pytorchs_runtime(records):
    profile = pipeweave.Profile(records[0]["profile"])
    assert profile.calibrated is True and profile.runtime == "pytorch"
    assert 0.0 <= profile.action_seconds <= 0.004
    assert all(layer["backward"] > 0 for layer in profile.layers)


def test_the_chosen_schedule_trains_as_one_device(records):
    plan_like = {"stages": 2 * RANKS, "ranks": RANKS, "microbatches": MICROBATCHES}
    worst, _ = H.compare(torch, plan_like, records)
    assert worst <= H.TOLERANCE


def test_bad_arguments_are_errors():
    layers = [H.stage_module(torch, 0)]
    x, y = H.MODEL.batch(torch, 1, 2)
    with pytest.raises(pipeweave.Error, match="initialise torch.distributed"):
        pwt.autotune(layers, x, y, loss_fn=H.loss_fn, microbatches=2)
    with pytest.raises(pipeweave.Error, match="batch=\\(x, y\\) and microbatches="):
        pwt.profile(layers, x, loss_fn=H.loss_fn, target=y, microbatches=2)
