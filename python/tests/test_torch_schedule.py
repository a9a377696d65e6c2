"""`pipeweave.torch.schedule` trains as one device does: for every expression PyTorch's runtime can
express, at P in {2, 4} ranks and M in {P, P+1, 2P} microbatches, plain and FSDP-wrapped stages,
and for recompute and offload plans on 1F1B, ZB-H1 and ZB-V, the gradients of every stage and the
loss of every microbatch equal a single-device run in float64 (within 1e-6 relative; the table
printed with -s says how many are bit-identical). One launch of P worker processes per (P, wrap)
runs all of its cases (torch_harness.group)."""

import pytest

torch = pytest.importorskip("torch")

import torch_harness as H  # noqa: E402

CASES = [(p, wrap, tag, e, m) for p, wrap in H.GROUPS for tag, e, m, _ in H.cases_for(torch, p)]
TABLE = {}


@pytest.mark.parametrize("ranks,wrap,tag,expression,microbatches", CASES,
                         ids=[f"P{p}-{w}-M{m}-{t}-{e}" for p, w, t, e, m in CASES])
def test_gradients_and_losses_match_one_device(ranks, wrap, tag, expression, microbatches):
    report, records = H.group(torch, ranks, wrap)[(tag, expression, microbatches)]
    assert len(records) == ranks
    worst, identical = H.compare(torch, report, records, tag=tag)
    row = TABLE.setdefault((expression, ranks, wrap), [0, 0, 0.0])
    row[0] += 1
    row[1] += int(identical)
    row[2] = max(row[2], worst)
    assert worst <= H.TOLERANCE, f"{expression} P={ranks} M={microbatches} {wrap}: {worst:.3g} relative"


def test_print_table():
    """Prints the table of the cases above (run with -s to see it)."""
    if not TABLE:
        pytest.skip("no case ran")
    print(f"\n{'expression':<72} {'P':>2} {'stages':<6} {'cases':>5} {'bit-identical':>13} {'max rel diff':>12}")
    for (expression, ranks, wrap), (n, same, worst) in sorted(TABLE.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        print(f"{expression:<72} {ranks:>2} {wrap:<6} {n:>5} {same:>13} {worst:>12.3g}")
