"""Predictions of a PyTorch model's step time from its `pipeweave.torch.profile`, checked by
measuring the steps (issue 26's must-show).

    python python/benches/predictions.py --out predictions.json [--rounds 3] [--steps 4] [--no-p4]

The model: Hugging Face `GPT2Block`s (a small `GPT2Config`) between an embedding layer (token
and position embeddings) and a head layer (final LayerNorm and the vocabulary projection; the
loss is the cross entropy), as a plain list of `nn.Module`s, each taking and returning a tensor.

(a) `pwt.profile(layers, x, loss_fn=..., target=...)` is taken once (several profiles merged
    by their per-layer medians), and for each configuration (schedule, microbatches, cut) the
    prediction is `pipeweave.plan(expr, ranks=P, microbatches=M, profile=prof,
    layers_per_stage=cut).makespan`; the measurement is `schedule.step` through `pwt.schedule`,
    one gloo process per rank (`torch.set_num_threads(1)` each), the wall time from the first
    rank's start to the last rank's end (all ranks released by a barrier before each step), the
    median over rounds (configurations interleaved) of the median of each round's steps after a
    warm-up. P = 2 (one core per rank) is the main table; P = 4 with `cores=2` (ranks
    time-sharing the cores) an extra one.
(b) `pipeweave.tune(ranks=2, microbatches=M, profile=prof, top=4, runtime="pytorch")` (the schedules
    PyTorch can run; the same plan under two expressions counted once): every candidate is measured
    in the same interleaved rounds; the first choice should measure within 5% of the best.

Both tables are printed (markdown) and written as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))

# The process groups: shared with tools/pytorch_train.py and python/tests/torch_harness.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))
from torch_pipeline import WorkerGroup, free_port, join_group, pipeline_ends  # noqa: E402

# The model (GPT-2 blocks of a small config) and one microbatch's shape.
VOCAB = 256
EMBD = 192
HEADS = 4
BLOCKS = 8
SEQ = 64
MICROBATCH = 4  # sequences per microbatch
SEED = 1234

# (expression, microbatches, cut): P = 2, one core per rank. The cut is per rank's share of the
# 10 layers (embedding, 8 blocks, head), always given (the same counts go to `pipeweave.plan` and
# to `pwt.split`); [5, 5] is the even cut.
EVEN = [5, 5]
MAIN_CASES = [
    ("gpipe", 4, EVEN),
    ("f1b(gpipe)", 8, EVEN),
    ("f1b(gpipe)", 8, [6, 4]),
    ("f1b(gpipe)", 16, EVEN),
    ("zero_bubble(f1b(gpipe), policy=h1)", 8, EVEN),
    ("zero_bubble(f1b(gpipe), policy=h1)", 4, [4, 6]),
    ("vpp(f1b(gpipe), chunks=2)", 8, EVEN),
    ("vpp(f1b(gpipe), chunks=2)", 16, [6, 4]),
    ("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", 8, EVEN),
    ("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", 4, [6, 4]),
]
# P = 4 on 2 cores (`cores=2`): the ranks time-share the cores.
P4_CASES = [
    ("f1b(gpipe)", 8, [3, 2, 2, 3]),
    ("zero_bubble(f1b(gpipe), policy=h1)", 8, [3, 2, 2, 3]),
    ("vpp(f1b(gpipe), chunks=2)", 8, [4, 2, 2, 2]),
]
TUNE_MICROBATCHES = 8
TUNE_TOP = 4


# ----------------------------------------------------------------------------- the model


def build_layers(torch: Any) -> List[Any]:
    """The model as a list of modules, the same on every process (seeded)."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    nn = torch.nn
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=EMBD, n_layer=BLOCKS, n_head=HEADS,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    config._attn_implementation = "sdpa"

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(VOCAB, EMBD)
            self.wpe = nn.Embedding(SEQ, EMBD)

        def forward(self, ids: Any) -> Any:
            positions = torch.arange(ids.shape[1], device=ids.device)
            return self.wte(ids) + self.wpe(positions)

    class Block(nn.Module):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.block = GPT2Block(config, layer_idx=index)

        def forward(self, x: Any) -> Any:
            out = self.block(x)
            return out[0] if isinstance(out, tuple) else out

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_f = nn.LayerNorm(EMBD)
            self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)

        def forward(self, x: Any) -> Any:
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(SEED)
    layers = [Embed()] + [Block(i) for i in range(BLOCKS)] + [Head()]
    for layer in layers:
        layer.train()
    return layers


def loss_fn(output: Any, target: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(output.reshape(-1, VOCAB), target.reshape(-1))


def batch(torch: Any, microbatches: int) -> Any:
    g = torch.Generator().manual_seed(SEED + microbatches)
    x = torch.randint(0, VOCAB, (microbatches * MICROBATCH, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (microbatches * MICROBATCH, SEQ), generator=g)
    return x, y


# ----------------------------------------------------------------------------- the profile


def merge_profiles(docs: Sequence[Dict[str, Any]]) -> Any:
    """Several `pwt.profile` documents of the model merged: per layer the median of each time,
    the median send (each profile's own figures are medians of its `repeats` runs)."""
    import pipeweave

    merged = json.loads(json.dumps(docs[0]))
    for i, layer in enumerate(merged["layers"]):
        for key in ("forward", "input_grad", "weight_grad"):
            layer[key] = statistics.median(d["layers"][i][key] for d in docs)
    merged["send"]["seconds"] = statistics.median(d["send"]["seconds"] for d in docs)
    return pipeweave.Profile(merged)


def profile_total(doc: Dict[str, Any]) -> float:
    """F + I + W of all layers, seconds."""
    return sum(l["forward"] + l["input_grad"] + l["weight_grad"] for l in doc["layers"])


# ----------------------------------------------------------------------------- the workers


def worker(args: argparse.Namespace) -> None:
    """One rank: runs every case of the file in `rounds` interleaved rounds, writes per case and
    round each timed step's (start, end) on the shared monotonic clock."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    import pipeweave.torch as pwt
    from pipeweave._plan import Plan

    torch.set_num_threads(1)
    with open(args.cases) as f:
        spec = json.load(f)
    cases = spec["cases"]
    join_group(args.rank, args.world, args.port, timeout=300)
    layers = build_layers(torch)
    params = [p for layer in layers for p in layer.parameters()]
    built: Dict[int, Any] = {}

    def schedule_of(case: Dict[str, Any]) -> Any:
        if case["id"] not in built:
            plan = Plan.from_report(case["report"])
            parts = pwt.split(layers, plan, layers_per_stage=case["cut"])
            mine = plan.stages_on(args.rank)
            stages = [PipelineStage(parts[s], s, plan.stages, torch.device("cpu")) for s in mine]
            for stage in stages:
                timed(stage)
            x, y = batch(torch, plan.microbatches)
            inputs, target = pipeline_ends(mine, plan.stages, x, y)
            built[case["id"]] = (pwt.schedule(plan, stages, loss_fn=loss_fn), inputs, target)
        return built[case["id"]]

    # The compute of each step, per kind (F, I, W, B), timed around the stages' own methods (the
    # schedule's wrappers keep these as the originals).
    busy: Dict[str, float] = {}

    def timed(stage: Any) -> None:
        def wrap(name: str) -> None:
            original = getattr(stage, name)

            def wrapper(*a: Any, **k: Any) -> Any:
                if name == "forward_one_chunk":
                    kind = "F"
                elif name == "backward_weight_one_chunk":
                    kind = "W"
                else:
                    kind = "B" if k.get("full_backward", a[2] if len(a) > 2 else True) else "I"
                t = time.perf_counter()
                try:
                    return original(*a, **k)
                finally:
                    busy[kind] = busy.get(kind, 0.0) + time.perf_counter() - t

            setattr(stage, name, wrapper)

        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            wrap(name)

    def take_profiles(count: int, when: str) -> None:
        """`count` profiles on every rank at once (both cores busy, as in the pipeline)."""
        x, y = batch(torch, 1)
        for _ in range(count):
            dist.barrier()
            doc = pwt.profile(layers, x, loss_fn=loss_fn, target=y, repeats=spec["repeats"]).data
            records.append({"profile": doc, "rank": args.rank, "when": when})

    records: List[Dict[str, Any]] = []
    take_profiles(spec["profiles_before"], "before")
    for rnd in range(spec["rounds"]):
        # Interleaved: every round runs every case; the order turns by one each round.
        order = cases[rnd % len(cases):] + cases[: rnd % len(cases)]
        for case in order:
            schedule, inputs, target = schedule_of(case)
            times = []
            busies = []
            for step in range(spec["warmup"] + spec["steps"]):
                busy.clear()
                for p in params:
                    p.grad = None
                losses: List[Any] = []
                dist.barrier()
                t0 = time.perf_counter()
                schedule.step(*inputs, target=target, losses=losses)
                t1 = time.perf_counter()
                if step >= spec["warmup"]:
                    times.append((t0, t1))
                    busies.append(dict(busy))
            records.append({"case": case["id"], "round": rnd, "rank": args.rank, "times": times,
                            "busy": busies})
        take_profiles(spec["profiles_per_round"], f"round {rnd}")
    with open(args.results, "w") as f:
        json.dump(records, f)
    dist.barrier()
    dist.destroy_process_group()


# Per case id, the measured compute per rank (medians of the steps): filled by `run_group`.
BUSY: Dict[int, Dict[str, Any]] = {}


def run_group(cases: Sequence[Dict[str, Any]], ranks: int, rounds: int, warmup: int, steps: int,
              timeout: float, *, repeats: int = 5, profiles_before: int = 0,
              profiles_per_round: int = 0) -> Any:
    """Runs `cases` on `ranks` worker processes in `rounds` interleaved rounds, every rank
    profiling the model `profiles_before` times first and `profiles_per_round` times after each
    round. Returns (per case id, per round the median step: max end over ranks minus min start
    over ranks, per step; the profile documents taken, with `when` and `rank`)."""
    workdir = tempfile.mkdtemp(prefix="pipeweave-bench-")
    try:
        case_file = os.path.join(workdir, "cases.json")
        with open(case_file, "w") as f:
            json.dump({"cases": list(cases), "rounds": rounds, "warmup": warmup, "steps": steps,
                       "repeats": repeats, "profiles_before": profiles_before,
                       "profiles_per_round": profiles_per_round}, f)
        port = free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        commands, logs, result_files = [], [], []
        for rank in range(ranks):
            result_files.append(os.path.join(workdir, f"results{rank}.json"))
            logs.append(os.path.join(workdir, f"log{rank}.txt"))
            commands.append([sys.executable, os.path.abspath(__file__), "worker", "--rank", str(rank),
                             "--world", str(ranks), "--port", str(port), "--cases", case_file,
                             "--results", result_files[-1]])
        with WorkerGroup(commands, logs, env=env) as workers:
            failure = workers.wait(timeout, poll=0.2)
        if failure:
            raise RuntimeError(failure)
        per: Dict[Any, List[List[float]]] = {}
        busy: Dict[Any, Dict[int, List[Dict[str, float]]]] = {}
        profiles: List[Dict[str, Any]] = []
        for results in result_files:
            with open(results) as f:
                for r in json.load(f):
                    if "profile" in r:
                        profiles.append(r)
                        continue
                    per.setdefault((r["case"], r["round"]), []).append(r["times"])
                    busy.setdefault(r["case"], {}).setdefault(r["rank"], []).extend(r["busy"])
        for case, by_rank in busy.items():
            BUSY[case] = {
                "per_rank": [statistics.median(sum(b.values()) for b in by_rank[k]) for k in sorted(by_rank)],
                "kinds": [{kind: statistics.median(b.get(kind, 0.0) for b in by_rank[k])
                           for kind in sorted({x for b in by_rank[k] for x in b})} for k in sorted(by_rank)],
            }
        out: Dict[int, List[float]] = {}
        for (case, rnd), by_rank in sorted(per.items()):
            spans = [max(t[i][1] for t in by_rank) - min(t[i][0] for t in by_rank)
                     for i in range(len(by_rank[0]))]
            out.setdefault(case, []).append(statistics.median(spans))
        return out, profiles
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ----------------------------------------------------------------------------- the parent


def wait_for_quiet(limit: float) -> None:
    """Waits (up to `limit` seconds) until no `cargo test` runs on the machine."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        busy = subprocess.run(["pgrep", "-f", "cargo test"], capture_output=True, text=True).stdout.strip()
        if not busy:
            return
        print(f"waiting for `cargo test` ({busy.split()[0]}) to finish...", flush=True)
        time.sleep(15)
    print("still busy; measuring anyway", flush=True)


def markdown(rows: Sequence[Dict[str, Any]], columns: Sequence[tuple]) -> str:
    head = "| " + " | ".join(c[0] for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(c[1](r) for c in columns) + " |" for r in rows]
    return "\n".join([head, rule] + body)


def ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def main_bench(args: argparse.Namespace) -> int:
    import torch

    import pipeweave

    started = time.monotonic()
    torch.set_num_threads(1)
    if not args.no_wait:
        wait_for_quiet(args.wait)
    # The profile is taken by the worker group itself, on both ranks at once (two processes on
    # the two cores, as in the pipeline): the first `--profiles` before any step choose tune's
    # candidates; one more per rank after every measured round goes into the profile the
    # predictions use (all merged by per-layer medians), so profile and steps see the same load.
    print(f"profiling ({args.profiles} per rank, 2 ranks at once)...", flush=True)
    _, pre_docs = run_group([], 2, 0, args.warmup, args.steps, timeout=args.timeout,
                            repeats=args.repeats, profiles_before=args.profiles)
    prof = merge_profiles([d["profile"] for d in pre_docs])
    layers = prof.data["layers"]
    print(f"profile: {len(layers)} layers; per layer F/I/W ms:", flush=True)
    for l in layers:
        print(f"  {l['name']}: {l['forward']*1e3:.2f} / {l['input_grad']*1e3:.2f} / {l['weight_grad']*1e3:.2f}")
    print(f"  send {prof.data['send']['bytes']} B: {prof.data['send']['seconds']*1e3:.3f} ms")
    print("  F+I+W totals of the profiles (ms): " + ", ".join(
        f"{profile_total(d['profile'])*1e3:.0f}" for d in pre_docs), flush=True)

    cases: List[Dict[str, Any]] = []

    def add(table: str, expression: str, ranks: int, m: int, cut: Optional[List[int]],
            cores: Optional[int] = None, **extra: Any) -> Dict[str, Any]:
        kwargs: Dict[str, Any] = {"profile": prof}
        if cut is not None:
            kwargs["layers_per_stage"] = cut
        if cores is not None:
            kwargs["cores"] = cores
        plan = pipeweave.plan(expression, ranks=ranks, microbatches=m, **kwargs)
        lps = plan.report.get("layers_per_stage") or cut
        case = {"id": len(cases), "table": table, "expression": expression, "ranks": ranks,
                "microbatches": m, "cut": lps, "cores": cores, "predicted": plan.makespan,
                "report": plan.report, **extra}
        cases.append(case)
        return case

    for expression, m, cut in MAIN_CASES:
        add("main", expression, 2, m, cut)
    # tune's own top 4, as it ranks them; those PyTorch's runtime cannot run (two routes, or a
    # cut that leaves a stage without a layer) are noted, and the measured four are the first
    # four distinct runnable candidates of a longer list.
    from pipeweave.torch import stage_layer_counts

    def unrunnable(plan: Any, cut: Optional[List[int]]) -> str:
        routes = plan.report.get("routes") or []
        if len(routes) > 1 or plan.report.get("tied_stages"):
            return f"{len(routes)} routes: pwt.schedule refuses (DualPipe)"
        try:
            stage_layer_counts(len(layers), plan, cut)
        except pipeweave.Error as e:
            return f"pwt.split refuses: {e}"
        return ""

    raw = pipeweave.tune(ranks=2, microbatches=TUNE_MICROBATCHES, profile=prof, top=TUNE_TOP)
    raw_rows = []
    for rank, c in enumerate(raw):
        plan = pipeweave.plan(c.expression, ranks=2, microbatches=TUNE_MICROBATCHES, profile=prof,
                              layers_per_stage=c.layers_per_stage)
        raw_rows.append({"choice": rank + 1, "expression": c.expression, "cut": c.layers_per_stage,
                         "tune_makespan": c.makespan, "note": unrunnable(plan, c.layers_per_stage)})
    tune_rows = []
    seen = set()
    for c in pipeweave.tune(ranks=2, microbatches=TUNE_MICROBATCHES, profile=prof, top=200,
                            runtime="pytorch"):
        plan = pipeweave.plan(c.expression, ranks=2, microbatches=TUNE_MICROBATCHES, profile=prof,
                              layers_per_stage=c.layers_per_stage)
        if unrunnable(plan, c.layers_per_stage):
            continue
        key = (json.dumps(plan.order), tuple(c.layers_per_stage or ()))
        if key in seen:
            continue  # the same plan under another expression
        seen.add(key)
        case = add("tune", c.expression, 2, TUNE_MICROBATCHES, c.layers_per_stage)
        tune_rows.append({"choice": len(tune_rows) + 1, "expression": c.expression,
                          "cut": c.layers_per_stage, "tune_makespan": c.makespan,
                          "predicted": case["predicted"], "case": case["id"], "measured": None})
        if len(tune_rows) == TUNE_TOP:
            break
    runnable = cases
    p4 = [] if args.no_p4 else [add("p4", e, 4, m, cut, cores=2) for e, m, cut in P4_CASES]

    print(f"measuring {len(runnable)} configurations on 2 ranks, {args.rounds} rounds...", flush=True)
    if not args.no_wait:
        wait_for_quiet(args.wait)
    measured, during = run_group([c for c in runnable if c["ranks"] == 2], 2, args.rounds,
                                 args.warmup, args.steps, timeout=args.timeout,
                                 repeats=args.repeats, profiles_per_round=1)
    if p4:
        print(f"measuring {len(p4)} configurations on 4 ranks (2 cores)...", flush=True)
        more, _ = run_group(p4, 4, args.rounds, args.warmup, args.steps, timeout=args.timeout)
        measured.update(more)
    docs = [d["profile"] for d in pre_docs + during]
    print("F+I+W totals of the profiles between rounds (ms): " + ", ".join(
        f"{profile_total(d['profile'])*1e3:.0f}" for d in during), flush=True)
    final = merge_profiles(docs)
    for case in cases:
        # The prediction from every profile of the run; `predicted_first` from those before it.
        case["predicted_first"] = case["predicted"]
        kwargs: Dict[str, Any] = {"profile": final, "layers_per_stage": case["cut"]}
        if case["cores"] is not None:
            kwargs["cores"] = case["cores"]
        plan = pipeweave.plan(case["expression"], ranks=case["ranks"],
                              microbatches=case["microbatches"], **kwargs)
        case["predicted"] = plan.makespan
        case["report"] = plan.report

    for case in cases:
        rounds = measured.get(case["id"])
        case["measured_rounds"] = rounds
        case["measured"] = statistics.median(rounds) if rounds else None
        case["predicted_busy"] = case["report"].get("busy_per_rank")
        case["measured_busy"] = BUSY.get(case["id"], {}).get("per_rank")
        case["measured_kinds"] = BUSY.get(case["id"], {}).get("kinds")
        if case["measured"]:
            case["error"] = case["predicted"] / case["measured"] - 1.0
            case["error_first"] = case["predicted_first"] / case["measured"] - 1.0

    def table_of(name: str) -> Dict[str, Any]:
        rows = [c for c in cases if c["table"] == name and c.get("measured")]
        errors = [abs(c["error"]) for c in rows]
        return {
            "rows": [{k: c[k] for k in ("expression", "ranks", "microbatches", "cut", "cores",
                                         "predicted", "measured", "measured_rounds", "error",
                                         "predicted_first", "error_first",
                                         "predicted_busy", "measured_busy", "measured_kinds")}
                     for c in rows],
            "median_abs_error": statistics.median(errors) if errors else None,
            "worst_abs_error": max(errors) if errors else None,
            "signed_median_error": statistics.median(c["error"] for c in rows) if rows else None,
            "median_abs_error_first": statistics.median(abs(c["error_first"]) for c in rows) if rows else None,
            "worst_abs_error_first": max(abs(c["error_first"]) for c in rows) if rows else None,
        }

    columns = [
        ("schedule", lambda r: f"`{r['expression']}`"),
        ("M", lambda r: str(r["microbatches"])),
        ("cut", lambda r: str(r["cut"])),
        ("predicted ms", lambda r: ms(r["predicted"])),
        ("measured ms", lambda r: ms(r["measured"])),
        ("rounds ms", lambda r: ", ".join(ms(v) for v in r["measured_rounds"])),
        ("error", lambda r: f"{r['error']*100:+.1f}%"),
        ("pred. first ms", lambda r: ms(r["predicted_first"])),
        ("error first", lambda r: f"{r['error_first']*100:+.1f}%"),
        ("busy/rank pred ms", lambda r: "/".join(ms(v) for v in r["predicted_busy"] or [])),
        ("busy/rank meas ms", lambda r: "/".join(ms(v) for v in r["measured_busy"] or [])),
    ]
    out: Dict[str, Any] = {"model": {"blocks": BLOCKS, "n_embd": EMBD, "heads": HEADS, "seq": SEQ,
                                      "microbatch": MICROBATCH, "vocab": VOCAB},
                           "profile": final.data, "first_profile": prof.data,
                           "profile_totals_before": [profile_total(d["profile"]) for d in pre_docs],
                           "profile_totals_between": [profile_total(d["profile"]) for d in during],
                           "rounds": args.rounds, "warmup": args.warmup,
                           "steps": args.steps}
    for name, title in (("main", "P = 2, one core per rank"), ("p4", "P = 4 on 2 cores (cores=2)")):
        t = table_of(name)
        if not t["rows"]:
            continue
        out[name] = t
        print(f"\n### Predicted vs measured step, {title}\n")
        print(markdown(t["rows"], columns))
        print(f"\nmedian |error| {t['median_abs_error']*100:.1f}%, worst {t['worst_abs_error']*100:.1f}%, "
              f"signed median {t['signed_median_error']*100:+.1f}%; from the first profile alone: "
              f"median {t['median_abs_error_first']*100:.1f}%, worst {t['worst_abs_error_first']*100:.1f}%")

    for row in tune_rows:
        case = next((c for c in cases if c["id"] == row.get("case")), None)
        if case and case.get("measured"):
            row["measured"] = case["measured"]
            row["measured_rounds"] = case["measured_rounds"]
            row["predicted_final"] = case["predicted"]
            row["error_final"] = case["error"]
    timed = [r for r in tune_rows if r["measured"]]
    best = min(timed, key=lambda r: r["measured"]) if timed else None
    first = tune_rows[0] if tune_rows else None
    verdict = None
    if best and first and first["measured"]:
        verdict = first["measured"] / best["measured"] - 1.0
    def choice_columns(makespan: str) -> List[tuple]:
        """The columns of a row of tune's: its rank, expression, cut and makespan (titled `makespan`)."""
        return [
            ("#", lambda r: str(r["choice"])),
            ("expression", lambda r: f"`{r['expression']}`"),
            ("cut", lambda r: str(r["cut"])),
            (makespan, lambda r: ms(r["tune_makespan"])),
        ]

    print(f"\ntune's own top {TUNE_TOP} (before filtering):\n")
    print(markdown(raw_rows, choice_columns("predicted ms") + [
        ("runnable by pwt.schedule", lambda r: r["note"] or "yes"),
    ]))
    out["tune_raw"] = raw_rows
    out["tune"] = {"microbatches": TUNE_MICROBATCHES, "candidates": [
        {k: v for k, v in r.items() if k != "case"} for r in tune_rows],
        "first_over_best": verdict, "first_within_5pct": None if verdict is None else verdict <= 0.05}
    print(f"\n### tune(ranks=2, microbatches={TUNE_MICROBATCHES}, profile=prof, top={TUNE_TOP})\n")
    print(markdown(tune_rows, choice_columns("tune's ms") + [
        ("pred. (all profiles) ms", lambda r: ms(r.get("predicted_final"))),
        ("measured ms", lambda r: ms(r["measured"])),
        ("rounds ms", lambda r: ", ".join(ms(v) for v in r.get("measured_rounds") or [])),
        ("vs best", lambda r: "-" if not r["measured"] or not best else f"{(r['measured']/best['measured']-1)*100:+.1f}%"),
    ]))
    if verdict is not None:
        print(f"\nfirst choice measures {verdict*100:+.1f}% vs the best of the {len(timed)} measured: "
              f"{'within' if verdict <= 0.05 else 'NOT within'} 5%")
    out["seconds"] = time.monotonic() - started
    print(f"\ntotal {out['seconds']:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.out}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode")
    w = sub.add_parser("worker")
    for name in ("rank", "world", "port"):
        w.add_argument(f"--{name}", type=int, required=True)
    w.add_argument("--cases", required=True)
    w.add_argument("--results", required=True)
    parser.add_argument("--out", help="write the tables as JSON here")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per case and round")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per case and round")
    parser.add_argument("--profiles", type=int, default=3, help="profiles merged (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="pwt.profile's repeats")
    parser.add_argument("--no-p4", action="store_true", help="skip the P = 4 on 2 cores table")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a `cargo test`")
    parser.add_argument("--wait", type=float, default=900, help="longest wait for quiet (s)")
    parser.add_argument("--timeout", type=float, default=1800, help="longest run of one group (s)")
    args = parser.parse_args()
    if args.mode == "worker":
        worker(args)
        return 0
    return main_bench(args)


if __name__ == "__main__":
    sys.exit(main())
