"""`pipeweave.plan`, `check`, `tune`, `frontier` and `Profile` against the CLI: the same figures,
the same files, the same error lines."""

import json
import os
import subprocess

import pytest

import pipeweave

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILE = os.path.join(ROOT, "tests", "fixtures", "profile_w192.json")

PLAN_FIELDS = [
    "ranks", "stages", "microbatches", "stage_to_rank", "order", "makespan", "bubble_rate",
    "peak_activations_per_rank", "passes", "report", "lower_bound", "optimality_gap",
]

CASES = [
    ("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", 4, 8, {}, []),
    ("f1b(gpipe)", 8, 32, {"costs": {"F": 1, "I": 1, "W": 0.6, "comm": 0.02}},
     ["--costs", "F=1,I=1,W=0.6,comm=0.02"]),
    ("vpp(f1b(gpipe), chunks=3, group=8)", 4, 16, {}, []),
    ("f1b(gpipe)", 4, 8, {"memory_limit": 4, "activation_memory": {"total": 1, "weight_grad": 0.43}},
     ["--memory-limit", "4", "--activation-memory", "total=1,weight_grad=0.43"]),
    ("offload(f1b(gpipe), memory=2)", 8, 32, {"costs": {"F": 1, "I": 1, "W": 1, "offload": 0.25, "R": 1}},
     ["--costs", "F=1,I=1,W=1,offload=0.25,R=1"]),
    ("recompute(f1b(gpipe), memory=2)", 4, 8, {}, []),
    ("offload(f1b(gpipe), memory=1)", 4, 8, {"ranks_per_link": 2}, ["--ranks-per-link", "2"]),
    ("zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))", 8, 32, {"costs": {"F": 1, "I": 1, "W": 1, "FB": 2.5}},
     ["--costs", "F=1,I=1,W=1,FB=2.5"]),
    ("zero_bubble(f1b(gpipe), policy=auto, memory=16)", 8, 24,
     {"costs": {"F": 18522, "I": 18086, "W": 9337, "comm": 601},
      "activation_memory": {"total": 1, "weight_grad": 0.366}},
     ["--costs", "F=18522,I=18086,W=9337,comm=601", "--activation-memory", "total=1,weight_grad=0.366"]),
    ("seq_split(zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)), chunks=4)", 4, 8, {}, []),
    ("seq_split(f1b(gpipe), chunks=4, split=cost)", 2, 4, {"profile": PROFILE}, ["--profile", PROFILE]),
]


def cli_json(cli, args):
    done = subprocess.run([cli, *args, "--format", "json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cli_error(cli, args):
    """The CLI's exit status and its one line on stderr (without `error: `)."""
    done = subprocess.run([cli, *args], capture_output=True, text=True)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines[0]
    return done.returncode, lines[0][len("error: "):]


@pytest.mark.parametrize("expression,ranks,microbatches,kwargs,flags", CASES)
def test_report_equals_the_cli_json(cli, expression, ranks, microbatches, kwargs, flags):
    plan = pipeweave.plan(expression, ranks=ranks, microbatches=microbatches, **kwargs)
    expected = cli_json(cli, ["plan", expression, "-p", str(ranks), "-m", str(microbatches), *flags])
    assert plan.report == expected
    for name in PLAN_FIELDS:
        assert hasattr(plan, name), name
    for name, value in expected.items():
        assert getattr(plan, name) == value


def test_a_sequence_split_plan_reports_its_chunks_and_refuses_pytorchs_csv(tmp_path):
    whole = pipeweave.plan("f1b(gpipe)", ranks=4, microbatches=8)
    split = pipeweave.plan("seq_split(f1b(gpipe), chunks=4)", ranks=4, microbatches=8)
    # The orders name the chunks: microbatch m's chunk c is m*4 + c.
    assert (split.seq_chunks, split.microbatches, whole.seq_chunks) == (4, 32, 1)
    assert split.makespan < whole.makespan
    assert max(split.peak_activations_per_rank) < 0.55 * max(whole.peak_activations_per_rank)
    with pytest.raises(pipeweave.Error, match="PyTorch's runtime keeps no state"):
        split.to_csv(tmp_path / "split.csv")


def test_the_plan_reports_a_lower_bound_and_its_gap():
    best = pipeweave.plan("zero_bubble(f1b(gpipe), policy=auto)", ranks=4, microbatches=8)
    assert (best.lower_bound, best.optimality_gap) == (27.0, 0.0)  # 3M + P - 1: proven optimal
    plain = pipeweave.plan("f1b(gpipe)", ranks=4, microbatches=8)
    assert plain.lower_bound == 27.0 and plain.makespan == 33.0
    assert plain.optimality_gap == pytest.approx(33 / 27 - 1)


def test_policy_optimal_proves_its_schedule():
    # Issue 29: the exact search reaches the MILP optimum at P=4, M=8, K=3 (auto's old 32) and
    # proves it; the bound says what it rests on.
    best = pipeweave.plan("zero_bubble(f1b(gpipe), policy=optimal, memory=3, budget=10)",
                          ranks=4, microbatches=8)
    assert (best.makespan, best.lower_bound, best.optimality_gap) == (31.0, 31.0, 0.0)
    assert best.lower_bound_basis == "search"
    auto = pipeweave.plan("zero_bubble(f1b(gpipe), memory=3)", ranks=4, microbatches=8)
    assert auto.makespan == 31.0 and auto.lower_bound_basis == "memory_limit"
    assert auto.lower_bound < 31.0


def test_tune_gives_each_candidate_its_bound():
    found = pipeweave.tune(ranks=16, microbatches=64, top=100)
    assert all(0 < c.lower_bound <= c.makespan + 1e-9 for c in found)
    # 8-chunk interleaving reaches the least bound of the search: a proven gap of 0.
    assert found[0].makespan == min(c.lower_bound for c in found) == 193.875


def test_the_readme_line():
    plan = pipeweave.plan("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", ranks=4, microbatches=8)
    assert plan.makespan == 25.5
    assert plan.stages == 8
    assert plan.stages_on(0) == [0, 7]
    assert plan.stages_on(3) == [3, 4]
    assert [s for r in range(4) for s in plan.stages_on(r)] != []
    assert sorted(s for r in range(4) for s in plan.stages_on(r)) == list(range(8))
    with pytest.raises(pipeweave.Error, match="rank 4 is out of range"):
        plan.stages_on(4)


def test_files_equal_the_cli_files(cli, tmp_path):
    expression, p, m = "zero_bubble(f1b(gpipe), policy=h1)", "4", "8"
    plan = pipeweave.plan(expression, ranks=4, microbatches=8)
    ours = {k: tmp_path / f"py.{k}" for k in ["csv", "lowered.csv", "svg", "trace.json"]}
    plan.to_csv(ours["csv"])
    plan.to_csv(ours["lowered.csv"], lowered=True)
    plan.to_svg(ours["svg"])
    plan.to_trace(ours["trace.json"])
    theirs = {k: tmp_path / f"cli.{k}" for k in ours}
    subprocess.run([cli, "plan", expression, "-p", p, "-m", m, "--csv", theirs["csv"], "--svg",
                    theirs["svg"], "--trace", theirs["trace.json"]], check=True, capture_output=True)
    subprocess.run([cli, "plan", expression, "-p", p, "-m", m, "--csv", theirs["lowered.csv"],
                    "--lowered"], check=True, capture_output=True)
    for k in ours:
        assert ours[k].read_text() == theirs[k].read_text(), k
    programs_file = tmp_path / "programs.json"
    subprocess.run([cli, "plan", expression, "-p", p, "-m", m, "--programs", programs_file],
                   check=True, capture_output=True)
    document = json.loads(programs_file.read_text())
    assert plan.programs_document() == document
    # Per rank, its instructions (PYTHON.md).
    assert plan.programs() == [rank["instrs"] for rank in document["programs"]]
    assert len(plan.programs()) == plan.ranks


def test_csv_of_a_residency_plan_warns_what_it_leaves_out(tmp_path):
    plan = pipeweave.plan("recompute(f1b(gpipe), memory=1)", ranks=2, microbatches=4)
    assert plan.recomputed == {(0, 0), (0, 1), (0, 2), (0, 3)}
    with pytest.warns(UserWarning, match="recompute"):
        plan.to_csv(tmp_path / "r.csv")


def test_check_imports_what_plan_writes(cli, tmp_path):
    plan = pipeweave.plan("vpp(f1b(gpipe), chunks=2)", ranks=4, microbatches=8)
    path = tmp_path / "s.csv"
    plan.to_csv(path, lowered=True)
    checked = pipeweave.check(path)
    assert checked.makespan == plan.makespan
    assert checked.order == plan.order
    assert checked.report == cli_json(cli, ["check", str(path)])
    reference = os.path.join(ROOT, "..", "shared", "reference", "zb-h1_pp4_m8_unit.json")
    if os.path.exists(reference):
        assert pipeweave.check(reference).report == cli_json(cli, ["check", reference])


def test_tune_and_frontier_equal_the_cli(cli, tmp_path):
    candidates = pipeweave.tune(ranks=4, microbatches=8, memory_limit=3, top=3)
    expected = cli_json(cli, ["tune", "-p", "4", "-m", "8", "--memory-limit", "3", "--top", "3"])
    assert [c.expression for c in candidates] == [c["expression"] for c in expected["candidates"]]
    assert [c.makespan for c in candidates] == [c["makespan"] for c in expected["candidates"]]
    best = pipeweave.plan(candidates[0].expression, ranks=4, microbatches=8, memory_limit=3)
    assert best.makespan == candidates[0].makespan
    assert max(best.peak_activations_per_rank) == candidates[0].peak_activations

    svg = tmp_path / "f.svg"
    points = pipeweave.frontier(ranks=4, microbatches=8, svg=svg)
    expected = cli_json(cli, ["tune", "-p", "4", "-m", "8", "--frontier"])
    assert [(p.memory_limit, p.expression, p.makespan, p.peak_activations) for p in points] == [
        (p["memory_limit"], p["expression"], p["makespan"], p["peak_activations"])
        for p in expected["frontier"]
    ]
    assert svg.read_text().startswith("<svg")


@pytest.mark.skipif(not os.path.exists(PROFILE), reason="no profile fixture")
def test_profiles_from_a_path_or_an_object(cli, tmp_path):
    profile = pipeweave.Profile.load(PROFILE)
    saved = tmp_path / "p.json"
    profile.save(saved)
    assert pipeweave.Profile.load(saved) == profile
    by_object = pipeweave.plan("f1b(gpipe)", ranks=2, microbatches=4, profile=profile,
                               memory_limit="64MiB")
    by_path = pipeweave.plan("f1b(gpipe)", ranks=2, microbatches=4, profile=PROFILE,
                             memory_limit="64MiB")
    assert by_object.report == by_path.report
    assert by_path.report == cli_json(cli, ["plan", "f1b(gpipe)", "-p", "2", "-m", "4", "--profile",
                                            PROFILE, "--memory-limit", "64MiB"])
    candidates = pipeweave.tune(ranks=2, microbatches=4, profile=profile, top=2)
    assert candidates[0].layers_per_stage is not None
    again = pipeweave.plan(candidates[0].expression, ranks=2, microbatches=4, profile=profile,
                           layers_per_stage=candidates[0].layers_per_stage)
    assert again.makespan == pytest.approx(candidates[0].makespan)


BAD = [
    (("f1b(gpip)", 4, 8), {}, ["plan", "f1b(gpip)", "-p", "4", "-m", "8"]),
    (("vpp(f1b(gpipe), chunks=x)", 4, 8), {}, ["plan", "vpp(f1b(gpipe), chunks=x)"]),
    (("f1b(gpipe)", 0, 8), {}, ["plan", "f1b(gpipe)", "-p", "0"]),
    (("f1b(gpipe)", 4, 0), {}, ["plan", "f1b(gpipe)", "-m", "0"]),
    (("f1b(gpipe)", 4, 8), {"costs": {"Q": 1}}, ["plan", "f1b(gpipe)", "--costs", "Q=1"]),
    (("f1b(gpipe)", 4, 8), {"costs": {"F": -1}}, ["plan", "f1b(gpipe)", "--costs", "F=-1.0"]),
    (("f1b(gpipe)", 4, 8), {"memory_limit": "2GiB"}, ["plan", "f1b(gpipe)", "--memory-limit", "2GiB"]),
    (("f1b(gpipe)", 4, 8), {"memory_limit": 1}, ["plan", "f1b(gpipe)", "--memory-limit", "1.0"]),
    (("zero_bubble(f1b(gpipe)", 4, 8), {}, ["plan", "zero_bubble(f1b(gpipe)"]),
    (("f1b(vpp(gpipe, chunks=2))", 4, 8), {}, ["plan", "f1b(vpp(gpipe, chunks=2))"]),
    (("f1b(gpipe)", 4, 8), {"ranks_per_link": 0}, ["plan", "f1b(gpipe)", "--ranks-per-link", "0"]),
    # Issue 43: negative and huge counts, limits of 0 and beyond a number, chunks beyond their
    # range, costs whose sums would overflow.
    (("f1b(gpipe)", -4, 8), {}, ["plan", "f1b(gpipe)", "-p", "-4"]),
    (("f1b(gpipe)", -4, 8), {}, ["plan", "f1b(gpipe)", "--ranks=-4"]),
    (("f1b(gpipe)", 4, -1), {}, ["plan", "f1b(gpipe)", "-m", "-1"]),
    (("f1b(gpipe)", 2**70, 8), {}, ["plan", "f1b(gpipe)", "-p", str(2**70)]),
    (("f1b(gpipe)", 4, 8), {"memory_limit": 0}, ["plan", "f1b(gpipe)", "--memory-limit", "0"]),
    (("f1b(gpipe)", 4, 8), {"memory_limit": "1e400"}, ["plan", "f1b(gpipe)", "--memory-limit", "1e400"]),
    (("vpp(f1b(gpipe), chunks=1000000000)", 4, 8), {}, ["plan", "vpp(f1b(gpipe), chunks=1000000000)"]),
    (("f1b(gpipe)", 4, 8), {"costs": {"F": 1e308, "I": 1e308}}, ["plan", "f1b(gpipe)", "--costs", "F=1e308,I=1e308"]),
    (("f1b(gpipe)", 4, 8), {"costs": {"comm": 1e308}}, ["plan", "f1b(gpipe)", "--costs", "comm=1e308"]),
    (("zero_bubble(f1b(gpipe), memory=1e400)", 4, 8), {}, ["plan", "zero_bubble(f1b(gpipe), memory=1e400)"]),
]


@pytest.mark.parametrize("args,kwargs,cli_args", BAD)
def test_bad_input_raises_the_cli_line(cli, args, kwargs, cli_args):
    code, line = cli_error(cli, cli_args)
    assert code == 2
    with pytest.raises(pipeweave.Error) as raised:
        pipeweave.plan(*args, **kwargs)
    assert str(raised.value) == line
    assert isinstance(raised.value, ValueError)
    assert not isinstance(raised.value, pipeweave.PassBug)


def test_a_file_that_is_not_text_raises_the_cli_line(cli, tmp_path):
    path = tmp_path / "binary.csv"
    path.write_bytes(b"0F0,1F0\n\xff\xfe\n")
    code, line = cli_error(cli, ["check", str(path)])
    assert code == 2 and "line 2, column 1" in line, line
    with pytest.raises(pipeweave.Error) as raised:
        pipeweave.check(path)
    assert str(raised.value) == line


def test_check_says_which_costs_it_used(cli, tmp_path):
    path = tmp_path / "f1b.csv"
    pipeweave.plan("f1b(gpipe)", ranks=2, microbatches=4).to_csv(path)
    assert pipeweave.check(path).report["costs"] == "F=1,I=1,W=1,comm=0 (default)"
    assert pipeweave.check(path, costs={"F": 2}).report["costs"] == "F=2"
    assert cli_json(cli, ["check", str(path)])["costs"] == "F=1,I=1,W=1,comm=0 (default)"


def test_python_types_are_checked_before_the_library():
    for kwargs in [dict(ranks="4"), dict(ranks=True), dict(ranks=2.5), dict(costs=[1, 2]),
                   dict(costs={"F": "one"}), dict(memory_limit=[1]), dict(profile=3),
                   dict(layers_per_stage="1,2")]:
        args = dict(ranks=4, microbatches=8)
        args.update(kwargs)
        with pytest.raises(pipeweave.Error):
            pipeweave.plan("f1b(gpipe)", **args)
    with pytest.raises(pipeweave.Error, match="needs a profile"):
        pipeweave.plan("f1b(gpipe)", ranks=2, microbatches=4, layers_per_stage=[1, 1])
    with pytest.raises(pipeweave.Error):
        pipeweave.Profile.from_json("{}")
    with pytest.raises(pipeweave.Error):
        pipeweave.Profile.load("/nonexistent/profile.json")
    with pytest.raises(pipeweave.Error, match="no schedule fits"):
        pipeweave.tune(ranks=4, microbatches=8, memory_limit=0.1)


def test_help_explains_each_argument():
    doc = pipeweave.plan.__doc__
    for argument in ["expression", "ranks", "costs", "activation_memory", "memory_limit", "profile",
                     "layers_per_stage", "passes"]:
        assert argument in doc
    for thing in [pipeweave.tune, pipeweave.frontier, pipeweave.check, pipeweave.Plan,
                  pipeweave.Profile, pipeweave.register]:
        assert thing.__doc__


def test_tune_for_pytorchs_runtime_leaves_dualpipe_out():
    everything = pipeweave.tune(ranks=4, microbatches=8, top=100)
    dual = [c for c in everything if not c.pytorch]
    assert dual and all("dual(f1b" in c.expression for c in dual)
    runnable = pipeweave.tune(ranks=4, microbatches=8, top=100, runtime="pytorch")
    assert runnable == [c for c in everything if c.pytorch]
    assert pipeweave.tune(ranks=4, microbatches=8, top=2, runtime="pytorch") == runnable[:2]
    with pytest.raises(pipeweave.Error, match="runtime="):
        pipeweave.tune(ranks=4, microbatches=8, runtime="jax")
