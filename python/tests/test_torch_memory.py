"""Recompute and offload plans hold what they predict: per rank, the saved-activation peak
`SavedActivationMeter` measures during `step` is within 10% of the plan's prediction
(`peak_activations_per_rank` x the bytes one microbatch's forward saves on the rank's share,
measured from one plain forward per stage), and below the plain plan's measured peak where the plan
predicts less. 1F1B at P in {2, 4}, ZB-H1 and ZB-V at P=4 (the zero-bubble plans declare the share
PyTorch keeps until W, measured; torch_harness.residency_cases). The runs are those of the plain
groups of test_torch_schedule (one launch per P)."""

import pytest

torch = pytest.importorskip("torch")

import torch_harness as H  # noqa: E402

BASES = {
    "f1b(gpipe)": ("expression", "f1b(gpipe)"),
    "zero_bubble(f1b(gpipe), policy=h1)": ("base", "zero_bubble(f1b(gpipe), policy=h1)"),
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))": ("base", "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))"),
}
CASES = [(p, e, m) for p in (2, 4) for tag, e, m, _ in H.residency_cases(torch, p) if tag == "residency"]
ROWS = []


def base_of(expression):
    inner = expression[expression.index("(") + 1 : expression.rindex(", memory=")]
    return BASES[inner]


def figures(report, records):
    """Per rank: (predicted bytes, measured bytes, host peak bytes)."""
    out = []
    for record in sorted(records, key=lambda r: r["rank"]):
        predicted = report["peak_activations_per_rank"][record["rank"]] * record["unit"]
        out.append((predicted, record["peak"], record["host_peak"], record["unit"]))
        assert record["left"] == 0 and record["left_host"] == 0, f"rank {record['rank']}: activations left after step"
    return out


@pytest.mark.parametrize("ranks,expression,microbatches", CASES, ids=[f"P{p}-M{m}-{e}" for p, e, m in CASES])
def test_measured_peak_matches_the_plan(ranks, expression, microbatches):
    results = H.group(torch, ranks, "plain")
    report, records = results[("residency", expression, microbatches)]
    base_report, base_records = results[(*base_of(expression), microbatches)]
    assert (report.get("recomputes_per_rank") or report.get("offloads_per_rank")), "the plan moves nothing"
    mine, base = figures(report, records), figures(base_report, base_records)
    problems = []
    for rank, ((pred, got, host, unit), (bpred, bgot, _, _)) in enumerate(zip(mine, base)):
        ROWS.append((expression, ranks, rank, pred / unit, got / unit, bpred / unit, bgot / unit, host / unit))
        if abs(got - pred) > 0.10 * pred:
            problems.append(f"rank {rank}: measured {got} B, predicted {pred} B")
        host_pred = (report.get("host_peak_per_rank") or [0] * ranks)[rank] * unit
        if abs(host - host_pred) > 0.10 * max(host_pred, unit):
            problems.append(f"rank {rank}: host peak {host} B, predicted {host_pred} B")
        if report["peak_activations_per_rank"][rank] < base_report["peak_activations_per_rank"][rank] and not got < bgot:
            problems.append(f"rank {rank}: measured {got} B, not below the plain plan's {bgot} B")
    assert not problems, f"{expression} P={ranks}: " + "; ".join(problems)


def test_print_memory_table():
    """Prints predicted and measured peaks in units of one microbatch's share (-s to see it)."""
    if not ROWS:
        pytest.skip("no case ran")
    print(f"\n{'plan':<72} {'P':>2} {'rank':>4} {'predicted':>9} {'measured':>8} {'plain pred':>10} {'plain meas':>10} {'host peak':>9}")
    for expression, p, rank, pred, got, bpred, bgot, host in ROWS:
        print(f"{expression:<72} {p:>2} {rank:>4} {pred:>9.3f} {got:>8.3f} {bpred:>10.3f} {bgot:>10.3f} {host:>9.3f}")
