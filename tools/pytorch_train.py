#!/usr/bin/env python3
"""Trains a small model through PyTorch's own pipeline runtime with the files `pipeweave plan --csv`
writes, and holds the gradients and losses to a single-device run. Run by .ci/pytorch.

    python3 tools/pytorch_train.py suite  --pipeweave target/release/pipeweave [--quick]
    python3 tools/pytorch_train.py broken --pipeweave target/release/pipeweave

`suite`: for every expression PyTorch's format can express (EXPRESSIONS), at P in {2, 4} ranks and
M in {P, P+1, 2P, 3P} microbatches, in three forms (the compute-only file, which PyTorch lowers
itself, and the lowered file with early and with just-in-time receives), each file is loaded on every
rank by `torch.distributed.pipelining`'s `_PipelineScheduleRuntime._load_csv` (`compute_only` or
`compute_comms`), with PyTorch's default settings (gradients scaled by 1/M at REDUCE_GRAD), and one
`step()` is run over gloo on CPU, one process per rank; the stages plain, then wrapped with FSDP
(`fully_shard`, a data-parallel mesh of one per pipeline rank; at P=2 also two data-parallel
replicas, four processes). The model: one Linear+Tanh per stage in float64, mean squared error.
Every stage's gradients and every microbatch's loss are compared with the same model run on one
device (microbatch by microbatch, gradients accumulated and divided by M; the replicas' averaged):
a case passes within 1e-6 relative, and the table says how many were bit-identical. For the lowered
files it also checks that our UNSHARD/RESHARD/REDUCE_GRAD/WAIT_REDUCE_GRAD sit among the computes
exactly where PyTorch's own lowering of our compute-only file puts them.

`broken`: files broken on purpose (a receive dropped; a send moved behind a receive into a
deadlock) must fail, each within a time bound, with the reason (PyTorch's error, or for a stall the
action every rank is blocked at), and leave no process behind.

Exit status 0 when every case holds, 1 otherwise. Needs torch and numpy (.ci/pytorch makes the venv).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_pipeline import EXPRESSIONS, GroupFailed, StageModel, WorkerGroup, free_port  # noqa: E402
from torch_pipeline import gradient_record, loss_fn, loss_record, pipeline_ends, pipeline_mesh  # noqa: E402
from torch_pipeline import read_jsonl  # noqa: E402

FORMATS = {
    "compute": ([], "compute_only"),
    "lowered early": (["--lowered", "--recv", "early"], "compute_comms"),
    "lowered just-in-time": (["--lowered", "--recv", "just-in-time"], "compute_comms"),
}
WIDTH = 6  # features of every stage
ROWS = 2  # rows per microbatch
TOLERANCE = 1e-6
COMM = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "WAIT_SEND_F", "WAIT_SEND_B"}


# ----------------------------------------------------------------------------- the model


def stage_module(torch, stage):
    torch.manual_seed(1000 + stage)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()).double()


MODEL = StageModel(stage_module, WIDTH, ROWS)


# ----------------------------------------------------------------------------- files


def stages_in(row):
    found = set()
    for cell in row:
        found.update(int(s) for s in re.findall(r"(?:^|[(;])(\d+)[A-Z]", cell.strip()))
    return found


def read_rows(path):
    with open(path) as f:
        return [line.rstrip("\n").split(",") for line in f if line.strip()]


def write_plans(pipeweave, outdir, sizes, expressions):
    cases = []
    for ranks, microbatches in sizes:
        for expression in expressions:
            for form, (flags, _) in FORMATS.items():
                name = f"p{ranks}_m{microbatches}_{len(cases)}.csv"
                path = os.path.join(outdir, name)
                command = [pipeweave, "plan", expression, "-p", str(ranks), "-m", str(microbatches),
                           "--csv", path] + flags
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()}")
                cases.append({"id": len(cases), "expression": expression, "form": form,
                              "ranks": ranks, "microbatches": microbatches, "path": path})
    return cases


def pytorch_lowering(torch, path, microbatches):
    """Per rank, the non-communication actions of PyTorch's own lowering of a compute-only file."""
    from torch.distributed.pipelining import schedules as S
    rows = read_rows(path)
    stages = max(max(stages_in(r)) for r in rows) + 1
    stand_in = types.SimpleNamespace(stage_index=0, num_stages=stages, group_size=len(rows),
                                     group_rank=0, is_first=True, is_last=stages == 1,
                                     submod=torch.nn.Linear(1, 1))
    runtime = S._PipelineScheduleRuntime([stand_in], microbatches)
    runtime._load_csv(path, format="compute_only")
    return [[str(a) for a in runtime.pipeline_order_with_comms[r]
             if a.computation_type.value not in COMM] for r in range(len(rows))]


def our_non_comm(path):
    def is_comm(cell):
        m = re.match(r"^\d+([A-Z_]+?)\d*$", cell)
        return m is not None and m.group(1) in COMM
    return [[c for c in row if not is_comm(c)] for row in read_rows(path)]


# ----------------------------------------------------------------------------- the workers


def worker(args):
    """One process of a pipeline group: runs every case of its list, writes gradients and losses."""
    import logging
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    torch.set_num_threads(1)
    with open(args.cases) as f:
        cases = json.load(f)
    status = os.open(args.status, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    current = {"case": None}

    def note(text):
        line = (text[:200] + "\n").encode()
        os.pwrite(status, line.ljust(256), 0)

    class Progress(logging.Handler):
        """Notes the action the runtime is about to run (it logs each at debug level)."""
        def emit(self, record):
            if str(record.msg).startswith("_PipelineScheduleRuntime running"):
                step, action = record.args
                note(f"case {current['case']}: action {step} ({action})")

    log = logging.getLogger("torch.distributed.pipelining.schedules")
    log.setLevel(logging.DEBUG)
    log.addHandler(Progress())
    log.propagate = False

    mesh, pp_group, pp_rank, replica = pipeline_mesh(args.rank, args.ranks, args.replicas, args.port,
                                                     args.pg_timeout)
    out = open(args.results, "w")
    for case in cases:
        current["case"] = case["id"]
        note(f"case {case['id']}: setting up")
        rows = read_rows(case["path"])
        mine = sorted(stages_in(rows[pp_rank]))
        stages = max(max(stages_in(r)) for r in rows) + 1
        microbatches = case["microbatches"]
        modules = MODEL.stage_modules(torch, mine, mesh if args.fsdp else None)
        pipeline = [PipelineStage(modules[s], s, stages, torch.device("cpu"), group=pp_group)
                    for s in mine]
        schedule = _PipelineScheduleRuntime(pipeline, microbatches, loss_fn=loss_fn)
        schedule._load_csv(case["path"], format=FORMATS[case["form"]][1])
        x, y = MODEL.batch(torch, case["ranks"], microbatches, replica)
        losses = []
        inputs, target = pipeline_ends(mine, stages, x, y)
        schedule.step(*inputs, target=target, losses=losses)
        record = {"case": case["id"], "replica": replica, "grads": gradient_record(modules),
                  "losses": loss_record(losses, target)}
        out.write(json.dumps(record) + "\n")
        out.flush()
        note(f"case {case['id']}: done")
    out.close()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent


def run_group(cases, ranks, replicas, fsdp, workdir, stall, pg_timeout, deadline):
    """Runs `cases` in one process group of ranks x replicas workers. Returns the results per rank;
    raises GroupFailed with the reason when a worker fails, stalls or the deadline passes. Every
    worker is killed before this returns."""
    tag = f"p{ranks}_d{replicas}_{'fsdp' if fsdp else 'plain'}_{len(os.listdir(workdir))}"
    case_file = os.path.join(workdir, f"{tag}_cases.json")
    with open(case_file, "w") as f:
        json.dump(cases, f)
    port = free_port()
    files = []
    commands = []
    for rank in range(ranks * replicas):
        files.append({k: os.path.join(workdir, f"{tag}_{k}{rank}.txt") for k in ("status", "results", "log")})
        commands.append([sys.executable, os.path.abspath(__file__), "worker", "--rank", str(rank),
                         "--ranks", str(ranks), "--replicas", str(replicas), "--port", str(port),
                         "--cases", case_file, "--status", files[-1]["status"],
                         "--results", files[-1]["results"], "--pg-timeout", str(pg_timeout)]
                        + (["--fsdp"] if fsdp else []))
    progress = {"seen": None, "since": time.monotonic()}

    def stalled():
        now = [status_of(f) for f in files]
        if now != progress["seen"]:
            progress["seen"], progress["since"] = now, time.monotonic()
        elif time.monotonic() - progress["since"] > stall:
            waiting = "; ".join(f"rank {i} at {s or 'start'}" for i, s in enumerate(now))
            return f"no progress for {stall} s: {waiting}"
        return None

    with WorkerGroup(commands, [f["log"] for f in files]) as workers:
        failure = workers.wait(deadline - time.monotonic(), late="the suite ran past its deadline",
                               exited=lambda rank, _: f"rank {rank} failed: {reason_of(files[rank])}",
                               check=stalled)
    if failure:
        raise GroupFailed(failure)
    return read_jsonl(f["results"] for f in files)


def status_of(files):
    try:
        with open(files["status"]) as f:
            return f.read().strip()
    except OSError:
        return None


def reason_of(files):
    """The last line of a worker's error (PyTorch's exception), with the action it was at."""
    with open(files["log"]) as f:
        lines = [l.rstrip() for l in f if l.strip()]
    errors = [l for l in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", l)]
    where = status_of(files) or "start"
    return f"{errors[-1] if errors else (lines[-1] if lines else 'no output')} (at {where})"


def compare(torch, case, results, replicas):
    """The largest relative difference to the single-device run, and whether all is bit-identical."""
    stages = max(max(stages_in(r)) for r in read_rows(case["path"])) + 1
    return MODEL.compare(torch, stages, case["ranks"], case["microbatches"], results, replicas,
                         error=GroupFailed)


def suite(args):
    import torch
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="pipeweave-pytorch-")
    sizes = [(p, m) for p in (2, 4) for m in sorted({p, p + 1, 2 * p, 3 * p})]
    expressions = EXPRESSIONS
    if args.quick:
        sizes, expressions = [(2, 2), (2, 3), (4, 8)], EXPRESSIONS[::3] + EXPRESSIONS[-1:]
    cases = write_plans(args.pipeweave, workdir, sizes, expressions)
    failures = []

    # Our parameter actions sit where PyTorch's lowering of our compute-only file puts them.
    by_plan = {}
    for case in cases:
        by_plan.setdefault((case["expression"], case["ranks"], case["microbatches"]), {})[case["form"]] = case
    placements = 0
    for (expression, ranks, microbatches), forms in by_plan.items():
        theirs = pytorch_lowering(torch, forms["compute"]["path"], microbatches)
        for form in ("lowered early", "lowered just-in-time"):
            ours = our_non_comm(forms[form]["path"])
            placements += 1
            if ours != theirs:
                rank = next(r for r in range(ranks) if ours[r] != theirs[r])
                failures.append(f"{expression} P={ranks} M={microbatches} {form}: rank {rank}'s "
                                f"parameter actions differ from PyTorch's lowering: ours "
                                f"{ours[rank]}, PyTorch's {theirs[rank]}")

    groups = [(p, 1, fsdp) for fsdp in (False, True) for p in (2, 4)] + [(2, 2, True)]
    table = {}
    deadline = time.monotonic() + args.deadline
    for ranks, replicas, fsdp in groups:
        mine = [c for c in cases if c["ranks"] == ranks]
        if replicas > 1 and not args.quick:
            mine = [c for c in mine if c["microbatches"] in (ranks, 2 * ranks)]
        wrap = f"FSDP dp={replicas}" if fsdp else "plain"
        try:
            results = run_group(mine, ranks, replicas, fsdp, workdir, args.stall, args.pg_timeout,
                                deadline)
        except GroupFailed as e:
            failures.append(f"P={ranks} {wrap}: {e}")
            continue
        for case in mine:
            mine_results = [r for r in results if r["case"] == case["id"]]
            key = (case["expression"], case["form"], wrap)
            row = table.setdefault(key, {"cases": 0, "identical": 0, "worst": 0.0})
            try:
                worst, identical = compare(torch, case, mine_results, replicas)
            except GroupFailed as e:
                failures.append(f"{case['expression']} P={ranks} M={case['microbatches']} "
                                f"{case['form']} {wrap}: {e}")
                continue
            row["cases"] += 1
            row["identical"] += int(identical)
            row["worst"] = max(row["worst"], worst)
            if worst > TOLERANCE:
                failures.append(f"{case['expression']} P={ranks} M={case['microbatches']} "
                                f"{case['form']} {wrap}: gradients or losses differ from one device "
                                f"by {worst:.3g} relative")

    print(f"{'expression':<48} {'form':<22} {'stages':<11} {'cases':>5} {'bit-identical':>13} "
          f"{'max rel diff':>12}")
    for (expression, form, wrap), row in table.items():
        print(f"{expression:<48} {form:<22} {wrap:<11} {row['cases']:>5} {row['identical']:>13} "
              f"{row['worst']:>12.3g}")
    total = sum(r["cases"] for r in table.values())
    same = sum(r["identical"] for r in table.values())
    print(f"\n{total} trained cases ({same} bit-identical to one device, tolerance {TOLERANCE} "
          f"relative); {placements} lowered files' parameter actions compared with PyTorch's "
          f"lowering; {time.monotonic() - started:.0f} s")
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


def broken(args):
    """Each broken file must fail within its bound, with its reason, leaving no process behind."""
    workdir = tempfile.mkdtemp(prefix="pipeweave-pytorch-broken-")
    bases = {c["microbatches"]: c for c in write_plans(args.pipeweave, workdir, [(2, 2), (2, 4)],
                                                        ["gpipe"]) if c["form"] == "lowered early"}

    def variant(name, base, edit):
        rows = read_rows(base["path"])
        edit(rows)
        path = os.path.join(workdir, f"{name}.csv")
        with open(path, "w") as f:
            f.write("".join(",".join(r) + "\n" for r in rows))
        return dict(base, path=path, id=name)

    def drop(rows):
        rows[1].remove("1RECV_F2")

    # Rank 0 sends microbatch 1's activation only after its first backward, which waits for a
    # gradient rank 1 computes only after that activation: a cycle (each pair's sends and
    # receives still in one order).
    def swap(rows):
        for cell in ("0WAIT_SEND_F1", "0SEND_F1"):
            rows[0].remove(cell)
            rows[0].insert(rows[0].index("0B0") + 1, cell)

    cases = [
        (variant("receive-dropped", bases[4], drop), "never received",
         ("before receiving input", "no progress")),
        (variant("deadlock", bases[2], swap), "deadlock", ("no progress", "timed out", "Timeout")),
    ]
    failures = []
    for case, static, expected in cases:
        # pipeweave's own check refuses the file first.
        checked = subprocess.run([args.pipeweave, "check", case["path"]], capture_output=True,
                                 text=True)
        if checked.returncode != 2 or static not in checked.stderr:
            failures.append(f"{case['id']}: pipeweave check did not refuse it: {checked.stderr}")
        started = time.monotonic()
        try:
            run_group([case], 2, 1, False, workdir, args.stall, args.pg_timeout,
                      time.monotonic() + 120)
            failures.append(f"{case['id']}: PyTorch ran the broken file without failing")
            continue
        except GroupFailed as e:
            reason = str(e)
        took = time.monotonic() - started
        leftovers = subprocess.run(["pgrep", "-f", f"{os.path.basename(__file__)} worker"],
                                   capture_output=True, text=True).stdout.split()
        print(f"{case['id']}: failed after {took:.1f} s: {reason}")
        print(f"{case['id']}: pipeweave check: {checked.stderr.strip()}")
        if not any(e in reason for e in expected):
            failures.append(f"{case['id']}: the reason does not say what broke: {reason}")
        if took > args.stall + 30:
            failures.append(f"{case['id']}: took {took:.0f} s")
        if leftovers:
            failures.append(f"{case['id']}: processes left behind: {leftovers}")
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("suite", "broken"):
        p = sub.add_parser(mode)
        p.add_argument("--pipeweave", required=True, help="the pipeweave binary")
        p.add_argument("--stall", type=float, default=30, help="seconds without progress = stuck")
        p.add_argument("--pg-timeout", type=float, default=60, help="gloo's timeout, seconds")
        p.add_argument("--deadline", type=float, default=1800, help="seconds for the whole suite")
        p.add_argument("--quick", action="store_true", help="a few sizes and expressions")
    w = sub.add_parser("worker")
    for name in ("rank", "ranks", "replicas", "port"):
        w.add_argument(f"--{name}", type=int, required=True)
    for name in ("cases", "status", "results"):
        w.add_argument(f"--{name}", required=True)
    w.add_argument("--pg-timeout", type=float, required=True)
    w.add_argument("--fsdp", action="store_true")
    args = parser.parse_args()
    if args.mode == "worker":
        worker(args)
        return 0
    return suite(args) if args.mode == "suite" else broken(args)


if __name__ == "__main__":
    sys.exit(main())
