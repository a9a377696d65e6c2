"""Workers and the single-device reference of the real-overlap tests (test_torch_overlap.py): a
transformers Mixtral model's decoder layers (random weights, float64, 4 experts, top-2) as
`pwt.phased_moe` blocks, trained by `pwt.schedule` of DualPipeV on P pipeline ranks x X
expert-parallel ranks (one process each, gloo on CPU), with and without `pwt.overlap`, the
tokens replicated over the expert ranks (each fed replica 0's batch) or split (expert rank x fed
replica x's).

    python torch_overlap_harness.py worker --rank R --world N --ranks P --port PORT --cases FILE --results FILE
    python torch_overlap_harness.py measure [--hidden 256 --seq 128 --rounds 7 --steps 2]   # step times
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools"))
from torch_pipeline import GroupFailed, WorkerGroup, free_port, pipeline_mesh, read_jsonl  # noqa: E402

DUALPIPE_V = "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))"
EXPERTS = 4
TOP_K = 2


class Shape:
    """The model's sizes: hidden width, layers per stage, rows and tokens per microbatch."""

    def __init__(self, hidden: int = 16, layers_per_stage: int = 2, rows: int = 2, seq: int = 4,
                 dtype: str = "float64") -> None:
        self.hidden, self.layers_per_stage, self.rows, self.seq, self.dtype = hidden, layers_per_stage, rows, seq, dtype

    def config(self) -> Any:
        from transformers import MixtralConfig

        config = MixtralConfig(hidden_size=self.hidden, intermediate_size=2 * self.hidden, num_attention_heads=2,
                               num_key_value_heads=1, num_hidden_layers=1, num_local_experts=EXPERTS,
                               num_experts_per_tok=TOP_K, max_position_embeddings=max(64, self.seq))
        config._attn_implementation = "eager"
        return config


def make_layer(torch: Any, shape: Shape, index: int) -> Any:
    """Decoder layer `index` of the model: transformers' MixtralDecoderLayer, weights drawn from
    a generator seeded by the index (norms near 1)."""
    from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

    layer = MixtralDecoderLayer(shape.config(), index).to(getattr(torch, shape.dtype))
    generator = torch.Generator().manual_seed(7000 + index)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.3
            p.copy_(noise + (1.0 if "norm" in name else 0.0))
    return layer


def batch(torch: Any, shape: Shape, microbatches: int, replica: int) -> Tuple[Any, Any]:
    """Replica `replica`'s hidden states and targets: [M * rows, seq, hidden] each."""
    generator = torch.Generator().manual_seed(100 * microbatches + replica)
    size = (microbatches * shape.rows, shape.seq, shape.hidden)
    x = torch.randn(size, generator=generator, dtype=torch.float64).to(getattr(torch, shape.dtype))
    y = torch.randn(size, generator=generator, dtype=torch.float64).to(getattr(torch, shape.dtype))
    return x, y


def loss_fn(output: Any, target: Any) -> Any:
    return ((output - target) ** 2).mean()


def layer_index(shape: Shape, stage: int, i: int) -> int:
    return stage * shape.layers_per_stage + i


def reference(torch: Any, shape: Shape, stages: int, microbatches: int, replicas: int
              ) -> Tuple[Dict[str, Any], List[List[float]]]:
    """One device, one thread: every layer with every expert, each replica's microbatches in
    turn; per parameter `stage.i.layer.name` (experts `...#e`) the gradient of the mean over
    replicas and microbatches of the losses, and each replica's losses."""
    from transformers.models.mixtral.modeling_mixtral import MixtralRotaryEmbedding

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layers = [[make_layer(torch, shape, layer_index(shape, s, i)) for i in range(shape.layers_per_stage)]
                  for s in range(stages)]
        rotary = MixtralRotaryEmbedding(shape.config())
        losses: List[List[float]] = []
        for replica in range(replicas):
            x, y = batch(torch, shape, microbatches, replica)
            mine = []
            for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
                t = xm.shape[1]
                position = rotary(xm, torch.arange(t).unsqueeze(0))
                mask = torch.full((t, t), torch.finfo(xm.dtype).min, dtype=xm.dtype).triu(1)[None, None]
                out = xm
                for stage in layers:
                    for layer in stage:
                        out = layer(out, position_embeddings=position, attention_mask=mask)
                loss = loss_fn(out, ym)
                loss.backward()
                mine.append(loss.item())
            losses.append(mine)
        grads: Dict[str, Any] = {}
        for s, stage in enumerate(layers):
            for i, layer in enumerate(stage):
                for name, p in layer.named_parameters():
                    g = p.grad / (microbatches * replicas)
                    key = f"{s}.{i}.layer.{name}"
                    if "experts." in name:
                        for e in range(EXPERTS):
                            grads[f"{key}#{e}"] = g[e]
                    else:
                        grads[key] = g
        return grads, losses
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- the workers


def build(torch: Any, shape: Shape, plan: Any, pp_rank: int, pp_group: Any, ep_group: Any,
          tokens: str, static: bool = False) -> Tuple[Dict[int, Any], List[Any]]:
    """This rank's stage modules (nn.Sequential of phased Mixtral layers, this expert rank's
    experts, `tokens` shared as that says) and PipelineStages (`static`: given a microbatch's
    input and output shapes, so that the runtime runs no shape probe)."""
    from torch.distributed.pipelining import PipelineStage

    import pipeweave.torch as pwt

    modules, stages = {}, []
    for s in plan.stages_on(pp_rank):
        blocks = [pwt.phased_moe(make_layer(torch, shape, layer_index(shape, s, i)), ep_group, tokens=tokens)
                  for i in range(shape.layers_per_stage)]
        modules[s] = torch.nn.Sequential(*blocks)
        shapes = {}
        if static:  # a later stage's input takes a gradient back; every output gives one
            example = torch.zeros(shape.rows, shape.seq, shape.hidden, dtype=getattr(torch, shape.dtype))
            shapes = {"input_args": example.clone().requires_grad_(s > 0), "output_args": example.requires_grad_()}
        stages.append(PipelineStage(modules[s], s, plan.stages, torch.device("cpu"), group=pp_group, **shapes))
    return modules, stages


def gradient_record(modules: Dict[int, Any]) -> Dict[str, List[str]]:
    """Per parameter `stage.name` its gradient as exact hex floats (None where it has none);
    this rank's experts one by one (`...#e`, e global)."""
    grads: Dict[str, Any] = {}
    for s, module in modules.items():
        for i, block in enumerate(module):
            for name, p in block.named_parameters():
                key = f"{s}.{i}.{name}"
                if "experts." in name:
                    for j, e in enumerate(block.local_experts):
                        grads[f"{key}#{e}"] = _hex(p.grad[j] if p.grad is not None else None)
                else:
                    grads[key] = _hex(p.grad)
    return grads


def _hex(grad: Any) -> Any:
    return None if grad is None else [v.hex() for v in grad.flatten().tolist()]


def worker(args: argparse.Namespace) -> None:
    """One process (pipeline rank x expert rank): every case of its file, one line per case."""
    import torch
    import torch.distributed as dist

    import pipeweave.torch as pwt
    from pipeweave._plan import Plan

    torch.set_num_threads(1)
    with open(args.cases) as f:
        cases = json.load(f)
    shape = Shape()
    mesh, pp_group, pp_rank, replica = pipeline_mesh(args.rank, args.ranks, args.world // args.ranks, args.port,
                                                     timeout=60)
    ep_group = mesh["dp"].get_group()
    out = open(args.results, "w")
    for case in cases:
        plan = Plan.from_report(case["report"])
        modules, stages = build(torch, shape, plan, pp_rank, pp_group, ep_group, case["tokens"])
        schedule = pwt.schedule(plan, stages, loss_fn=loss_fn)
        overlap = pwt.overlap(schedule, trace=case.get("trace", False)) if case["overlap"] else None
        x, y = batch(torch, shape, plan.microbatches, replica if case["tokens"] == "split" else 0)
        mine = plan.stages_on(pp_rank)
        losses: List[Any] = []
        inputs = (x,) if 0 in mine else ()
        target = y if plan.stages - 1 in mine else None
        if case.get("meter"):
            with pwt.SavedActivationMeter() as meter:
                schedule.step(*inputs, target=target, losses=losses)
        else:
            meter = None
            schedule.step(*inputs, target=target, losses=losses)
        pwt.average_expert_parallel_grads(list(modules.values()), ep_group)
        record: Dict[str, Any] = {"case": case["id"], "rank": pp_rank, "replica": replica,
                                  "grads": gradient_record(modules),
                                  "losses": [float(v).hex() for v in losses] if target is not None else None}
        if meter is not None:
            record["host_peak"] = meter.host_peak_bytes
        if overlap is not None:
            record["pairs"] = overlap.pairs
            record["events"] = overlap.events
        out.write(json.dumps(record) + "\n")
        out.flush()
    out.close()
    dist.barrier()
    dist.destroy_process_group()


def measure_worker(args: argparse.Namespace) -> None:
    """One process of the measurement: one DualPipeV schedule, `rounds` rounds of `steps` steps
    with the runtime's sequential pairs and with `pwt.overlap`, in alternating order; the step
    times (barriers around each round's steps) on the first process."""
    import torch
    import torch.distributed as dist

    import pipeweave
    import pipeweave.torch as pwt

    torch.set_num_threads(args.threads)
    shape = Shape(hidden=args.hidden, layers_per_stage=args.layers, rows=args.rows, seq=args.seq, dtype="float32")
    mesh, pp_group, pp_rank, replica = pipeline_mesh(args.rank, args.ranks, args.world // args.ranks, args.port,
                                                     timeout=120)
    ep_group = mesh["dp"].get_group()
    plan = pipeweave.plan(DUALPIPE_V, ranks=args.ranks, microbatches=args.microbatches)
    modules, stages = build(torch, shape, plan, pp_rank, pp_group, ep_group, "replicated")
    schedule = pwt.schedule(plan, stages, loss_fn=loss_fn)
    x, y = batch(torch, shape, plan.microbatches, 0)
    mine = plan.stages_on(pp_rank)
    inputs = (x,) if 0 in mine else ()
    target = y if plan.stages - 1 in mine else None

    def steps(n: int) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            for module in modules.values():
                module.zero_grad(set_to_none=True)
            schedule.step(*inputs, target=target)
        dist.barrier()
        return (time.perf_counter() - start) / n

    times: Dict[str, List[float]] = {"sequential": [], "overlap": []}
    steps(1)  # the first step infers the stages' shapes
    for r in range(args.rounds):
        order = ("sequential", "overlap") if r % 2 == 0 else ("overlap", "sequential")
        for mode in order:
            overlap = pwt.overlap(schedule) if mode == "overlap" else None
            times[mode].append(steps(args.steps))
            if overlap is not None:
                overlap.close()
    if args.rank == 0:
        with open(args.results, "w") as f:
            f.write(json.dumps({"rank": 0, "times": times}) + "\n")
    else:
        open(args.results, "w").close()
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent


def run(cases: Sequence[Dict[str, Any]], ranks: int, experts: int, timeout: float = 240.0,
        mode: str = "worker", options: Sequence[str] = (), script: str = __file__) -> List[Dict[str, Any]]:
    """Runs `cases` on `ranks` x `experts` worker processes of `script` (this file, or one
    taking the same arguments: `mode`, `--rank`, `--world`, `--ranks`, `--port`, `--cases`,
    `--results`, then `options`); returns their records (raises GroupFailed with the failing
    worker's output)."""
    import shutil
    import tempfile

    workdir = tempfile.mkdtemp(prefix="pipeweave-overlap-test-")
    try:
        case_file = os.path.join(workdir, "cases.json")
        with open(case_file, "w") as f:
            json.dump(list(cases), f)
        world = ranks * experts
        port = free_port()
        results = [os.path.join(workdir, f"results{r}.jsonl") for r in range(world)]
        logs = [os.path.join(workdir, f"log{r}.txt") for r in range(world)]
        commands = [[sys.executable, os.path.abspath(script), mode, "--rank", str(r), "--world", str(world),
                     "--ranks", str(ranks), "--port", str(port), "--cases", case_file, "--results", results[r],
                     *options]
                    for r in range(world)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with WorkerGroup(commands, logs, env=env) as workers:
            failure = workers.wait(timeout)
        if failure:
            raise GroupFailed(failure)
        return read_jsonl(results)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def compare(torch: Any, expected: Dict[str, Any], records: Sequence[Dict[str, Any]],
            expert_ranks: int) -> Tuple[float, int, int]:
    """The largest relative difference (to each parameter's largest gradient) of the records'
    gradients to `expected`, how many of them are equal (`torch.equal`) and how many were
    compared. Every gradient of `expected` must come from every expert rank of the pipeline rank
    holding it (an expert's, `...#e`, from its holder alone) and none be None, else
    AssertionError."""
    worst, same, total = 0.0, 0, 0
    reporters: Dict[str, int] = {}
    for record in records:
        for key, values in record["grads"].items():
            assert key in expected, f"{key}: not a parameter of one device's model"
            assert values is not None, f"{key}: no gradient on worker {record['rank'], record['replica']}"
            want = expected[key]
            got = torch.tensor([float.fromhex(v) for v in values], dtype=want.dtype).view(want.shape)
            scale = max(want.abs().max().item(), 1e-300)
            worst = max(worst, (got - want).abs().max().item() / scale)
            same += torch.equal(got, want)
            total += 1
            reporters[key] = reporters.get(key, 0) + 1
    wrong = {key: reporters.get(key, 0) for key in expected if reporters.get(key, 0) != (1 if "#" in key else expert_ranks)}
    assert not wrong, f"gradients not returned by as many ranks as hold them: {sorted(wrong.items())[:3]}"
    return worst, same, total


MEASURE = {"hidden": 256, "seq": 128, "rows": 2, "layers": 2, "microbatches": 8, "rounds": 7, "steps": 2,
           "threads": 1}


def measure(options: Dict[str, int], timeout: float = 900.0) -> Dict[str, Any]:
    """Step times of DualPipeV on 2 pipeline x 2 expert ranks, sequential pairs vs
    `pwt.overlap`, in alternating rounds: per mode the rounds' seconds per step and their
    median, and overlap's median over sequential's."""
    flags = [f"--{k}={v}" for k, v in options.items()]
    (record,) = [r for r in run([], 2, 2, timeout, mode="measure", options=flags) if r.get("times")]
    times = record["times"]
    medians = {mode: statistics.median(ts) for mode, ts in times.items()}
    return {"options": options, "times": times, "medians": medians,
            "ratio": medians["overlap"] / medians["sequential"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("worker", "measure"):
        w = sub.add_parser(mode)
        for name in ("rank", "world", "ranks", "port"):
            w.add_argument(f"--{name}", type=int, required=mode == "worker")
        w.add_argument("--cases", required=mode == "worker")
        w.add_argument("--results", required=mode == "worker")
        if mode == "measure":
            for name, value in MEASURE.items():
                w.add_argument(f"--{name}", type=int, default=value)
    args = parser.parse_args()
    if args.mode == "worker":
        worker(args)
    elif args.rank is not None:
        measure_worker(args)
    else:
        options = {k: getattr(args, k) for k in MEASURE}
        result = measure(options)
        print(json.dumps(result, indent=1))
        print(f"median step: sequential {result['medians']['sequential'] * 1e3:.1f} ms, "
              f"overlap {result['medians']['overlap'] * 1e3:.1f} ms, ratio {result['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
