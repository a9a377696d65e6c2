"""Shared helpers of the pipeweave.torch tests: plans (from the installed `pipeweave.plan`), the test
model, a single-device reference, and process groups of workers (one process per rank, gloo on
CPU) that run many cases in one launch and write their gradients, losses and memory figures.

    python torch_harness.py worker --rank R --world N --ranks P --port PORT --cases FILE --results FILE [--fsdp]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, Iterator, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)

WIDTH = 4  # features between stages
HIDDEN = 8  # features inside a stage
ROWS = 2  # rows per microbatch
TOLERANCE = 1e-6


# ----------------------------------------------------------------------------- imports

# The model's reference, the workers' records and the process groups: shared with
# tools/pytorch_train.py and python/benches/predictions.py.
sys.path.insert(0, os.path.join(REPO, "tools"))
from torch_pipeline import EXPRESSIONS, GroupFailed, StageModel, WorkerGroup, free_port  # noqa: E402
from torch_pipeline import gradient_record, loss_fn, loss_record, pipeline_ends, pipeline_mesh  # noqa: E402
from torch_pipeline import join_group, read_jsonl  # noqa: E402


# ----------------------------------------------------------------------------- plans


def make_plan(expression: str, ranks: int, microbatches: int, **kwargs: Any) -> Any:
    """`pipeweave.plan(expression, ranks=, microbatches=, **kwargs)` of the installed package."""
    import pipeweave

    return pipeweave.plan(expression, ranks=ranks, microbatches=microbatches, **kwargs)


def plan_report(expression: str, ranks: int, microbatches: int, **kwargs: Any) -> Dict[str, Any]:
    """The plan's JSON report (as `pipeweave plan --format json` prints it)."""
    return dict(make_plan(expression, ranks, microbatches, **kwargs).report)


# ----------------------------------------------------------------------------- the model


def stage_module(torch: Any, stage: int) -> Any:
    """Stage `stage`'s module in float64, seeded by the stage: Linear, GELU, LayerNorm, Linear,
    Tanh, shaped like a transformer block's MLP (an activation and a norm between two linear
    layers, the norm's weights computed in I by the split backward), so that what the split
    backward keeps from I to W (each linear layer's input and output gradient) is below what the
    forward saves, as in transformer blocks (0.6 to 0.8 of it in python/benches/families.py's)."""
    torch.manual_seed(1000 + stage)
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, WIDTH), nn.Tanh()
    ).double()


MODEL = StageModel(stage_module, WIDTH, ROWS)  # its batches, single-device reference, comparison


def unknown_stage_module(torch: Any, stage: int) -> Any:
    """A stage with a module the split backward does not know (a matrix of its own between two
    linear layers): `pwt.schedule` leaves its I and W to PyTorch's autograd split."""
    torch.manual_seed(2000 + stage)
    nn = torch.nn

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.matrix = nn.Parameter(torch.randn(HIDDEN, HIDDEN) / HIDDEN)

        def forward(self, x: Any) -> Any:
            return x @ self.matrix

    return nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.Tanh(), Mixed(), nn.Linear(HIDDEN, WIDTH)).double()


UNKNOWN = StageModel(unknown_stage_module, WIDTH, ROWS)


def model_of(tag: str) -> StageModel:
    """The model a case of `tag` trains: the one with a module the split does not know for
    `fallback` cases, the transformer-like one otherwise."""
    return UNKNOWN if tag == "fallback" else MODEL


# ----------------------------------------------------------------------------- the workers


def weight_grad_fraction(torch: Any) -> float:
    """Of what a middle stage's forward saves, the share its split backward keeps from I until its
    W (`pwt.weight_grad_bytes`: each linear layer's input and output gradient): the plans'
    `weight_grad`."""
    import pipeweave.torch as pwt

    module = stage_module(torch, 1)
    x = torch.randn(ROWS, WIDTH, dtype=torch.float64, requires_grad=True)
    return pwt.weight_grad_bytes(module, x) / pwt.activation_bytes(module, x)


def worker(args: argparse.Namespace) -> None:
    """One process of a pipeline group: runs every case of its file, writes one line per case."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    import pipeweave.torch as pwt
    from pipeweave._plan import Plan
    from pipeweave.torch._memory import LEDGER

    torch.set_num_threads(1)
    with open(args.cases) as f:
        cases = json.load(f)
    mesh, pp_group, pp_rank, replica = pipeline_mesh(args.rank, args.ranks, args.world // args.ranks,
                                                     args.port, timeout=60)
    out = open(args.results, "w")
    for case in cases:
        plan = Plan.from_report(case["report"])
        mine = plan.stages_on(pp_rank)
        model = model_of(case["tag"])
        modules = model.stage_modules(torch, mine, mesh if args.fsdp else None)
        stages = [PipelineStage(modules[s], s, plan.stages, torch.device("cpu"), group=pp_group) for s in mine]
        schedule = pwt.schedule(plan, stages, loss_fn=loss_fn)
        x, y = model.batch(torch, plan.ranks, plan.microbatches, replica)
        losses: List[Any] = []
        inputs, target = pipeline_ends(mine, plan.stages, x, y)
        with pwt.SavedActivationMeter() as meter:
            schedule.step(*inputs, target=target, losses=losses)
        record: Dict[str, Any] = {"case": case["id"], "rank": pp_rank, "replica": replica}
        if case.get("memory"):
            # One microbatch's activations of this rank's share, from one plain forward per stage.
            unit = 0
            for s in mine:
                probe = stage_module(torch, s)
                xm = torch.randn(ROWS, WIDTH, dtype=torch.float64, requires_grad=s > 0)
                unit += pwt.activation_bytes(probe, xm)
            record.update(
                peak=meter.peak_bytes - meter.start_bytes, host_peak=meter.host_peak_bytes,
                unit=unit, left=LEDGER.device_bytes - meter.start_bytes, left_host=LEDGER.host_bytes,
            )
        record["split_backward"] = {str(k): v for k, v in schedule.split_backward.items()}
        record["grads"] = gradient_record(modules)
        record["losses"] = loss_record(losses, target)
        out.write(json.dumps(record) + "\n")
        out.flush()
    out.close()
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the suite's cases

OFFLOAD_COSTS = {"F": 1, "I": 1, "W": 1, "offload": 0.25}
GROUPS = [(2, "plain"), (4, "plain"), (2, "fsdp"), (4, "fsdp")]


def residency_cases(torch: Any, ranks: int) -> List[Tuple[str, str, int, Dict[str, Any]]]:
    """(tag, expression, microbatches, plan keywords) of the recompute and offload plans on 1F1B,
    ZB-H1 and ZB-V, with limits that make them recompute or offload, and their plain bases (tag
    `base`). The zero-bubble plans declare the share of activations PyTorch keeps until W
    (`weight_grad`, measured), so their peaks are the runtime's."""
    wg = {"total": 1, "weight_grad": round(weight_grad_fraction(torch), 4)}
    if ranks == 2:
        return [
            ("residency", "recompute(f1b(gpipe), memory=1)", 4, {}),
            ("residency", "offload(f1b(gpipe), memory=1)", 4, {"costs": OFFLOAD_COSTS}),
        ]
    m = 2 * ranks
    h1 = "zero_bubble(f1b(gpipe), policy=h1)"
    zbv = "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))"
    return [
        ("residency", "recompute(f1b(gpipe), memory=1)", m, {}),
        ("residency", "offload(f1b(gpipe), memory=1)", m, {"costs": OFFLOAD_COSTS}),
        ("residency", "recompute(f1b(gpipe), memory=2)", m, {}),
        ("base", h1, m, {"activation_memory": wg}),
        ("residency", f"recompute({h1}, memory=3.5, weight_grads=keep)", m, {"activation_memory": wg}),
        ("residency", f"offload({h1}, memory=3.1)", m, {"activation_memory": wg, "costs": OFFLOAD_COSTS}),
        ("base", zbv, m, {"activation_memory": wg}),
        ("residency", f"recompute({zbv}, memory=3, weight_grads=keep)", m, {"activation_memory": wg}),
        ("residency", f"offload({zbv}, memory=3)", m, {"activation_memory": wg, "costs": OFFLOAD_COSTS}),
    ]


def cases_for(torch: Any, ranks: int) -> List[Tuple[str, str, int, Dict[str, Any]]]:
    """Every case of a group at `ranks`: each expression at M in {P, P+1, 2P}, then the
    residency cases, then two zero-bubble plans of the model whose split is left to PyTorch
    (`fallback`)."""
    cases = []
    for expression in EXPRESSIONS:
        for m in sorted({ranks, ranks + 1, 2 * ranks}):
            cases.append(("expression", expression, m, {}))
    fallback = [("fallback", e, 2 * ranks, {}) for e in
                ("zero_bubble(f1b(gpipe))", "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))")]
    return cases + residency_cases(torch, ranks) + fallback


_GROUPS: Dict[Tuple[int, str], Dict[Tuple[str, str, int], Tuple[Dict[str, Any], List[Dict[str, Any]]]]] = {}
_FAILED: Dict[Tuple[int, str], GroupFailed] = {}


def group(torch: Any, ranks: int, wrap: str) -> Dict[Tuple[str, str, int], Tuple[Dict[str, Any], List[Dict[str, Any]]]]:
    """Runs every case of (ranks, wrap) in one launch (once per test session): per (tag,
    expression, microbatches) the plan's report and the workers' records (with memory figures
    for plain stages). A group that failed fails every later test at once, with its output."""
    key = (ranks, wrap)
    if key in _FAILED:
        raise _FAILED[key]
    if key not in _GROUPS:
        cases = []
        for i, (tag, expression, m, kwargs) in enumerate(cases_for(torch, ranks)):
            cases.append({"id": i, "tag": tag, "expression": expression, "microbatches": m,
                          "memory": wrap == "plain",
                          "report": plan_report(expression, ranks, m, **kwargs)})
        try:
            records = run_group(cases, ranks, fsdp=wrap == "fsdp", timeout=180)
        except GroupFailed as failure:
            _FAILED[key] = failure
            raise
        _GROUPS[key] = {
            (c["tag"], c["expression"], c["microbatches"]): (c["report"], [r for r in records if r["case"] == c["id"]])
            for c in cases
        }
    return _GROUPS[key]


def autotune_worker(args: argparse.Namespace) -> None:
    """One rank of an autotune run over the model as a list of layers (the stages' modules in
    order): `pwt.autotune`, then one training step of the chosen schedule; writes what it found
    and the step's gradients and losses."""
    import torch
    import torch.distributed as dist

    import pipeweave.torch as pwt

    torch.set_num_threads(1)
    microbatches = args.microbatches
    ranks = args.ranks
    join_group(args.rank, ranks, args.port, 60)
    # One layer per stage of a 2-chunk layout: every candidate (one stage per rank or two) cuts
    # it into the stages' modules of the model the reference trains.
    layers = [stage_module(torch, s) for s in range(2 * ranks)]
    x, y = MODEL.batch(torch, ranks, microbatches)
    found = pwt.autotune(layers, x, y, loss_fn=loss_fn, microbatches=microbatches, top=2, budget=60,
                         steps=1, rounds=2)
    built = found.build(layers, loss_fn=loss_fn)
    losses: List[Any] = []
    built.step(x, y, losses=losses)
    _, target = built.ends(x, y)
    grads = {}
    for s, layer in enumerate(layers):
        for name, p in layer.named_parameters():
            if p.grad is not None:
                grads[f"{s}.{name}"] = [v.hex() for v in p.grad.detach().flatten().tolist()]
    record = {
        "rank": args.rank,
        "replica": 0,
        "best": found.best.name,
        "trials": [{"name": t.name, "kind": t.kind, "predicted": t.predicted, "calibrated": t.calibrated,
                    "measured": t.measured, "rounds": t.rounds} for t in found.trials],
        "profile": found.profile.data,
        "grads": grads,
        "losses": loss_record(losses, target),
    }
    with open(args.results, "w") as f:
        f.write(json.dumps(record) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def run_autotune(ranks: int, microbatches: int, timeout: float = 240.0) -> List[Dict[str, Any]]:
    """Runs `autotune_worker` on `ranks` processes; returns their records."""
    with scratch_folder("pipeweave-autotune-test-") as workdir:
        port = free_port()
        argvs = [["autotune", "--rank", str(r), "--ranks", str(ranks), "--port", str(port),
                  "--microbatches", str(microbatches)] for r in range(ranks)]
        return run_workers(workdir, argvs, timeout)


# ----------------------------------------------------------------------------- the parent


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[str]:
    """A fresh temporary folder, removed with everything in it on leaving."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    try:
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_workers(workdir: str, argvs: Sequence[List[str]], timeout: float) -> List[Dict[str, Any]]:
    """Runs this file once per entry of `argvs` (a worker mode and its options), each process
    with its own `--results` file and log in `workdir`. Returns every worker's records; raises
    GroupFailed with the failing rank's output when one fails or the group runs past `timeout`
    seconds. Every worker (and its process group) is killed before this returns."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    results = [os.path.join(workdir, f"results{r}.jsonl") for r in range(len(argvs))]
    logs = [os.path.join(workdir, f"log{r}.txt") for r in range(len(argvs))]
    commands = [[sys.executable, os.path.abspath(__file__)] + argv + ["--results", result]
                for argv, result in zip(argvs, results)]
    with WorkerGroup(commands, logs, env=env) as workers:
        failure = workers.wait(timeout)
    if failure:
        raise GroupFailed(failure)
    return read_jsonl(results)


def run_group(cases: Sequence[Dict[str, Any]], ranks: int, *, replicas: int = 1, fsdp: bool = False,
              timeout: float = 150.0) -> List[Dict[str, Any]]:
    """Runs `cases` (each with `id` and the plan's `report`) in one group of ranks x replicas
    worker processes; returns their records as `run_workers` does."""
    with scratch_folder("pipeweave-torch-test-") as workdir:
        case_file = os.path.join(workdir, "cases.json")
        with open(case_file, "w") as f:
            json.dump(list(cases), f)
        world = ranks * replicas
        port = free_port()
        argvs = [["worker", "--rank", str(rank), "--world", str(world), "--ranks", str(ranks),
                  "--port", str(port), "--cases", case_file] + (["--fsdp"] if fsdp else [])
                 for rank in range(world)]
        return run_workers(workdir, argvs, timeout)


def compare(torch: Any, report: Dict[str, Any], records: Sequence[Dict[str, Any]], replicas: int = 1,
            tag: str = "expression") -> Tuple[float, bool]:
    """The largest relative difference of the case's gradients and losses to one device, and
    whether all of them are bit-identical."""
    return model_of(tag).compare(torch, report["stages"], report["ranks"], report["microbatches"], records, replicas)


def worker_parser(sub: Any, mode: str, numbers: Sequence[str], texts: Sequence[str] = ()) -> Any:
    """The command line of a worker mode: the whole numbers `numbers`, the texts `texts` and
    `--results` (every one required)."""
    parser = sub.add_parser(mode)
    for name in numbers:
        parser.add_argument(f"--{name}", type=int, required=True)
    for name in (*texts, "results"):
        parser.add_argument(f"--{name}", required=True)
    return parser


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    worker_mode = worker_parser(sub, "worker", ("rank", "world", "ranks", "port"), ("cases",))
    worker_mode.add_argument("--fsdp", action="store_true")
    worker_parser(sub, "autotune", ("rank", "ranks", "port", "microbatches"))
    args = parser.parse_args()
    if args.mode == "autotune":
        autotune_worker(args)
    else:
        worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
