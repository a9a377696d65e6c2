"""`pipeweave.torch.overlap`: DualPipeV's overlapped F;B pairs run with the forward of one
microbatch and the backward of the other interleaved phase by phase (DeepSeek-V3's order), for
transformers Mixtral layers as `pwt.phased_moe` blocks over 2 expert-parallel ranks, the
exchanges asynchronous.

- One launch of 2 pipeline x 2 expert ranks (4 processes, gloo) runs DualPipeV, a recompute and
  an offload plan of it, each with the runtime's sequential pairs and with `pwt.overlap`, with the
  tokens replicated over the expert ranks (the default) and split (DualPipeV and recompute)
  (torch_overlap_harness).
- Replicated tokens: every loss and every parameter's gradient (each replicated one on both
  expert ranks, each expert's on its holder) equal one device's (`torch.equal`, float64): one
  device runs the same model on the same batch, every expert in one process.
- Split tokens (expert rank x trains on replica x's batch): within 1e-12 relative of one device
  running both replicas' batches in turn, not bit for bit, for a documented reason: an expert
  multiplies the rows of both ranks' tokens in one matrix product (one device, each replica's rows
  in its own), and where a row falls in a blocked product changes the order its sums run in; the
  replicated weights' gradients are summed over the expert ranks by an all-reduce.
- With overlap, gradients and losses are bit-identical to the sequential pairs', in both modes;
  with one expert rank (a launch of 2 processes) overlap is bit-identical to one device.
- The trace of every pair: the forward's dispatch is issued before the backward's experts compute
  and waited on after them (where it sends: split tokens), and so on for DeepSeek's four slots; a
  recomputed pair's phases run again right before their backward.
- One process: a phased Mixtral layer is the transformers layer bit for bit (forward, input and
  every parameter's gradient), a phased Qwen2-MoE layer within 1e-12; what `overlap`,
  `phased_moe` and `average_expert_parallel_grads` refuse.
- A short measurement of the step time, sequential pairs vs overlap (printed with -s); the full
  one: `python torch_overlap_harness.py measure`.
"""

import math
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch_overlap_harness as H  # noqa: E402
import pipeweave  # noqa: E402
import pipeweave.torch as pwt  # noqa: E402
from pipeweave._errors import Error  # noqa: E402

RANKS, EXPERT_RANKS, MICROBATCHES = 2, 2, 4
RECOMPUTE = f"recompute({H.DUALPIPE_V}, memory=2)"
OFFLOAD = f"offload({H.DUALPIPE_V}, memory=2)"
OFFLOAD_COSTS = {"F": 1, "I": 1, "W": 1, "offload": 0.25}
EXPRESSIONS = {"replicated": (H.DUALPIPE_V, RECOMPUTE, OFFLOAD), "split": (H.DUALPIPE_V, RECOMPUTE)}
CASES = [(t, e, o) for t, es in EXPRESSIONS.items() for e in es for o in (False, True)]
TOLERANCE = 1e-12

_RUN = {}


def name(expression):
    return expression[:expression.index("(")]


def group(expert_ranks=EXPERT_RANKS, cases=CASES):
    """Every case of `cases` in one launch of RANKS x `expert_ranks` processes (once per
    session): per (tokens, expression, overlap) the plan and the workers' records."""
    if expert_ranks not in _RUN:
        todo, plans = [], {}
        for i, (tokens, expression, on) in enumerate(cases):
            costs = OFFLOAD_COSTS if expression == OFFLOAD else None
            plans[i] = pipeweave.plan(expression, ranks=RANKS, microbatches=MICROBATCHES, costs=costs)
            todo.append({"id": i, "tokens": tokens, "overlap": on, "trace": on, "meter": expression == OFFLOAD,
                         "report": dict(plans[i].report)})
        records = H.run(todo, RANKS, expert_ranks, timeout=240)
        _RUN[expert_ranks] = {case: (plans[i], [r for r in records if r["case"] == i])
                              for i, case in enumerate(cases)}
    return _RUN[expert_ranks]


def reference(replicas):
    """One device's gradients and per replica losses, `replicas` replicas' batches in turn."""
    key = ("reference", replicas)
    if key not in _RUN:
        _RUN[key] = H.reference(torch, H.Shape(), 2 * RANKS, MICROBATCHES, replicas)
    return _RUN[key]


def by_worker(records):
    return {(r["rank"], r["replica"]): r for r in records}


def losses_of(record):
    return torch.tensor([float.fromhex(v) for v in record["losses"]], dtype=torch.float64)


@pytest.mark.parametrize("expression,on", [(e, o) for t, e, o in CASES if t == "replicated"],
                         ids=[f"{'overlap' if o else 'sequential'}-{name(e)}" for t, e, o in CASES
                              if t == "replicated"])
def test_replicated_tokens_are_one_device_bit_for_bit(expression, on):
    plan, records = group()[("replicated", expression, on)]
    assert len(records) == RANKS * EXPERT_RANKS
    grads, losses = reference(1)
    worst, same, total = H.compare(torch, grads, records, EXPERT_RANKS)
    assert same == total, f"{total - same} of {total} gradients differ from one device's ({worst:.3g} relative)"
    want = torch.tensor(losses[0], dtype=torch.float64)
    with_losses = [r for r in records if r["losses"] is not None]
    assert len(with_losses) == EXPERT_RANKS
    for record in with_losses:
        assert torch.equal(losses_of(record), want), f"worker {record['rank'], record['replica']}: losses differ"
    if on:
        assert all(r["pairs"] == len(pairs_of(plan, r["rank"])) > 0 for r in records)
    print(f"\nreplicated {expression} overlap={on}: {same}/{total} gradients and every loss equal to one device's")


@pytest.mark.parametrize("expression,on", [(e, o) for t, e, o in CASES if t == "split"],
                         ids=[f"{'overlap' if o else 'sequential'}-{name(e)}" for t, e, o in CASES if t == "split"])
def test_split_tokens_match_one_device_within_tolerance(expression, on):
    _, records = group()[("split", expression, on)]
    assert len(records) == RANKS * EXPERT_RANKS
    grads, losses = reference(EXPERT_RANKS)
    worst, same, total = H.compare(torch, grads, records, EXPERT_RANKS)
    assert worst <= TOLERANCE, f"{expression} overlap={on}: {worst:.3g} relative"
    for record in records:
        if record["losses"] is not None:
            want = torch.tensor(losses[record["replica"]], dtype=torch.float64)
            assert torch.allclose(losses_of(record), want, rtol=TOLERANCE, atol=0)
    print(f"\nsplit {expression} overlap={on}: {same}/{total} gradients bit-identical to one device, "
          f"largest difference {worst:.3g} relative")


def test_the_comparison_sees_one_bit_and_a_missing_gradient():
    _, records = group()[("replicated", H.DUALPIPE_V, True)]
    grads, _ = reference(1)
    changed = [dict(r, grads=dict(r["grads"])) for r in records]
    key = sorted(changed[0]["grads"])[0]
    values = list(changed[0]["grads"][key])
    values[0] = math.nextafter(float.fromhex(values[0]), math.inf).hex()
    changed[0]["grads"][key] = values
    _, same, total = H.compare(torch, grads, changed, EXPERT_RANKS)
    assert same == total - 1
    del changed[0]["grads"][key]
    with pytest.raises(AssertionError, match="not returned by as many ranks"):
        H.compare(torch, grads, changed, EXPERT_RANKS)


def test_with_one_expert_rank_overlap_is_one_device_bit_for_bit():
    runs = group(1, [("replicated", H.DUALPIPE_V, True), ("replicated", RECOMPUTE, True)])
    grads, losses = reference(1)
    for (_, expression, _), (plan, records) in runs.items():
        assert len(records) == RANKS
        worst, same, total = H.compare(torch, grads, records, 1)
        assert same == total, f"{expression}: {total - same} of {total} gradients differ ({worst:.3g} relative)"
        assert [r["losses"] for r in records if r["losses"]] == [[v.hex() for v in losses[0]]]
        assert all(r["pairs"] == len(pairs_of(plan, r["rank"])) for r in records)


@pytest.mark.parametrize("tokens,expression", [(t, e) for t, es in EXPRESSIONS.items() for e in es],
                         ids=[f"{t}-{name(e)}" for t, es in EXPRESSIONS.items() for e in es])
def test_overlap_is_bit_identical_to_sequential_pairs(tokens, expression):
    _, sequential = group()[(tokens, expression, False)]
    _, overlapped = group()[(tokens, expression, True)]
    seq, ovl = by_worker(sequential), by_worker(overlapped)
    assert seq.keys() == ovl.keys()
    for worker, record in ovl.items():
        assert record["grads"] == seq[worker]["grads"], f"worker {worker}: gradients differ"
        assert record["losses"] == seq[worker]["losses"], f"worker {worker}: losses differ"


def pairs_of(plan, rank):
    """The plan's overlapped pairs on `rank`: ((F stage, mb), (B stage, mb))."""
    out = []
    for text in plan.order[rank]:
        if text.startswith("("):
            f, b = text[1:text.index(")")].split(";")
            out.append(tuple((int(a[:a.index(k)]), int(a[a.index(k) + 1:])) for a, k in ((f, "F"), (b, "B"))))
    return out


# The exchanges that send a message (the others take the rank's own rows): (half, exchange).
MESSAGES = {"split": {("F", "dispatch"), ("F", "combine"), ("B", "dispatch"), ("B", "combine")},
            "replicated": {("F", "combine"), ("B", "dispatch")}}


@pytest.mark.parametrize("tokens,expression", [(t, e) for t in EXPRESSIONS for e in (H.DUALPIPE_V, RECOMPUTE)],
                         ids=[f"{t}-{name(e)}" for t in EXPRESSIONS for e in (H.DUALPIPE_V, RECOMPUTE)])
def test_phases_interleave_as_deepseek_v3(tokens, expression):
    plan, records = group()[(tokens, expression, True)]
    last = H.Shape().layers_per_stage - 1
    for record in records:
        pairs = pairs_of(plan, record["rank"])
        assert pairs and record["pairs"] == len(pairs)
        events = [tuple(e) for e in record["events"]]
        for (fs, fm), (bs, bm) in pairs:
            where = {"F": (fs, fm, 0), "B": (bs, bm, last)}

            def at(half, phase, event):
                stage, mb, block = where[half]
                key = (half, stage, mb, f"{phase} {block}", event)
                assert key in events, f"no {key} in rank {record['rank']}'s trace"
                return events.index(key)

            def hides(half, exchange, other, phase):
                """`half`'s `exchange` flies while `other`'s `phase` computes (if it sends)."""
                assert at(half, exchange, "issue") < at(other, phase, "start")
                stage, mb, block = where[half]
                waited = (half, stage, mb, f"{exchange} {block}", "wait") in events
                assert waited == ((half, exchange) in MESSAGES[tokens]), (half, exchange, tokens)
                if waited:
                    assert at(other, phase, "end") < at(half, exchange, "wait")

            hides("B", "combine", "F", "attention")  # slot 1
            hides("F", "dispatch", "B", "experts")  # slot 2
            hides("B", "dispatch", "F", "experts")  # slot 3
            hides("F", "combine", "B", "attention")  # slot 4


def test_offloaded_pairs_offload_what_their_phases_save():
    plan, records = group()[("replicated", OFFLOAD, True)]
    assert plan.offloaded
    for record in records:
        mine = set(plan.stages_on(record["rank"]))
        if any(pair[0] in mine for pair in plan.offloaded):
            assert record["host_peak"] > 0


def test_recomputed_pairs_recompute_phase_by_phase():
    plan, records = group()[("replicated", RECOMPUTE, True)]
    assert plan.recomputed
    for record in records:
        mine = set(plan.stages_on(record["rank"]))
        want = {pair for pair in plan.recomputed if pair[0] in mine}
        got = {(e[1], e[2]) for e in record["events"] if e[0] == "B" and e[4] == "recompute"}
        assert got == want
        phases = {e[3] for e in record["events"] if e[0] == "B" and e[4] == "recompute"}
        assert {"attention 0", "experts 0", "merge 0"} <= phases
        assert not {p for p in phases if p.startswith(("dispatch", "combine"))}


# ----------------------------------------------------------------------------- one process


def _init(module, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.3
                    + (1.0 if "norm" in name else 0.0))


def _qwen_layer():
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeDecoderLayer

    config = Qwen2MoeConfig(hidden_size=16, intermediate_size=32, moe_intermediate_size=32,
                            shared_expert_intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
                            num_hidden_layers=1, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1)
    config._attn_implementation = "eager"
    return Qwen2MoeDecoderLayer(config, 0).double()


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_a_phased_layer_is_the_transformers_layer(kind):
    shape = H.Shape()
    make = (lambda: H.make_layer(torch, shape, 0)) if kind == "mixtral" else _qwen_layer
    original, copy = make(), make()
    _init(original, 3)
    copy.load_state_dict(original.state_dict())
    block = pwt.phased_moe(copy)
    x = torch.randn(3, 5, shape.hidden, dtype=torch.float64)
    position, mask = block.position(x)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1 = original(x1, position_embeddings=position, attention_mask=mask)
    y2 = block(x2)
    assert torch.equal(y1, y2)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    assert torch.equal(x1.grad, x2.grad)
    for (name, p), (_, q) in zip(original.named_parameters(), block.layer.named_parameters()):
        if kind == "mixtral":
            assert torch.equal(p.grad, q.grad), name
        else:  # five consumers of the router's input: their gradients add up in another order
            assert torch.allclose(p.grad, q.grad, rtol=0, atol=TOLERANCE * p.grad.abs().max()), name


def _fake_schedule(modules):
    plan = pipeweave.plan(pwt.DUALPIPE_V, ranks=2, microbatches=4)
    orders, _, _ = pwt.lower_plan(plan)
    stages = [types.SimpleNamespace(stage_index=s, submod=modules[s]) for s in plan.stages_on(0)]

    class Schedule(types.SimpleNamespace):
        def _step_microbatches(self, *args, **kwargs):  # pragma: no cover - never stepped
            raise AssertionError

    return Schedule(_stages=stages, pipeline_order=orders, rank=0, _split_stages=set(), split_backward={},
                    _comp_type_to_function_map={}, register_custom_function=lambda *a: None)


def test_overlap_refuses_stages_without_phases():
    plain = {s: torch.nn.Sequential(torch.nn.Linear(4, 4)) for s in range(4)}
    with pytest.raises(Error, match="stage 0 runs in overlapped F;B pairs but its module has no MoE block"):
        pwt.overlap(_fake_schedule(plain))
    hidden = {s: torch.nn.Sequential(torch.nn.ModuleList([pwt.phased_moe(H.make_layer(torch, H.Shape(), s))]))
              for s in range(4)}
    with pytest.raises(Error, match="nested inside other modules"):
        pwt.overlap(_fake_schedule(hidden))
    phased = {s: torch.nn.Sequential(pwt.phased_moe(H.make_layer(torch, H.Shape(), s))) for s in range(4)}
    schedule = _fake_schedule(phased)
    first = pwt.overlap(schedule)
    assert sorted(first.programs) == [0, 3]
    with pytest.raises(Error, match="runs with pwt.overlap already"):
        pwt.overlap(schedule)
    first.close()
    pwt.overlap(schedule).close()


def test_phased_moe_refuses_what_it_cannot_run(monkeypatch):
    with pytest.raises(Error, match="is not a transformers MoE decoder layer"):
        pwt.phased_moe(torch.nn.Linear(4, 4))
    import pipeweave.torch._moe as moe

    three = H.Shape()
    layer = H.make_layer(torch, three, 0)
    layer.mlp.experts.gate_up_proj = torch.nn.Parameter(layer.mlp.experts.gate_up_proj[:3].clone())
    monkeypatch.setattr(moe, "_group_size", lambda group: 2)
    monkeypatch.setattr(moe, "_group_rank", lambda group: 0)
    with pytest.raises(Error, match="^3 experts do not divide over 2 expert-parallel ranks$"):
        pwt.phased_moe(layer, group=object())
    with pytest.raises(Error, match="^unknown tokens mode 'shared'; MoE blocks take tokens='replicated' or "
                                    "tokens='split'$"):
        pwt.phased_moe(H.make_layer(torch, three, 0), tokens="shared")


def test_replicated_blocks_refuse_expert_ranks_that_routed_differently(monkeypatch):
    import pipeweave.torch._moe as moe

    monkeypatch.setattr(moe, "_group_size", lambda group: 2)
    monkeypatch.setattr(moe, "_group_rank", lambda group: 0)
    mine, theirs = torch.tensor([2, 2, 2, 2]), torch.tensor([1, 2, 3, 2])
    done = types.SimpleNamespace(wait=lambda: None)
    monkeypatch.setattr(moe, "all_to_all", lambda x, async_op, **rows: (torch.cat([mine, theirs]), done, x))
    moves = moe._Replicated(mine, pwt.phased_moe(H.make_layer(torch, H.Shape(), 0), group=object()))
    with pytest.raises(Error, match=r"^expert rank 1 routed \[1, 2, 3, 2\] tokens per expert, expert rank 0 "
                                    r"\[2, 2, 2, 2\]: tokens='replicated' needs every expert rank"):
        moves.gather(torch.zeros(4, 16), False)


def test_average_expert_parallel_grads_refuses_mixed_token_modes():
    shape = H.Shape()
    mixed = torch.nn.Sequential(pwt.phased_moe(H.make_layer(torch, shape, 0), tokens="split"),
                                pwt.phased_moe(H.make_layer(torch, shape, 1)))
    with pytest.raises(Error, match="mix tokens='replicated' and tokens='split'"):
        pwt.average_expert_parallel_grads([mixed], None)


def test_measure_step_time():
    """A short measurement (the full one: `python torch_overlap_harness.py measure`)."""
    options = dict(H.MEASURE, hidden=64, seq=16, rounds=3, steps=1)
    result = H.measure(options, timeout=300)
    assert len(result["times"]["overlap"]) == len(result["times"]["sequential"]) == 3
    print(f"\nstep time, 2 pipeline x 2 expert ranks on CPU (gloo), medians of 3 alternating rounds: "
          f"sequential pairs {result['medians']['sequential'] * 1e3:.1f} ms, overlap "
          f"{result['medians']['overlap'] * 1e3:.1f} ms, ratio {result['ratio']:.3f}")
