"""What tools/pytorch_train.py, python/tests/torch_harness.py and python/benches/predictions.py
share: the expressions PyTorch's runtime can express, a small float64 model with its single-device
reference, and groups of worker processes (one per rank, gloo on CPU) with what each worker writes.

Not a script: its users put this folder on `sys.path` and import it. Needs only the standard
library to import; torch is passed in or imported where a function needs it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

# Every expression PyTorch's runtime can express.
EXPRESSIONS = [
    "gpipe",
    "f1b(gpipe)",
    "vpp(gpipe, chunks=2)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=4)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
    "zero_bubble(f1b(gpipe), policy=h1)",
    "zero_bubble(f1b(gpipe), policy=h2)",
    "zero_bubble(f1b(gpipe))",
    "zero_bubble(vpp(f1b(gpipe), chunks=2))",
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
    "dual(vpp(f1b(gpipe), chunks=2))",
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
]


# ----------------------------------------------------------------------------- the model


def loss_fn(output: Any, target: Any) -> Any:
    return ((output - target) ** 2).mean()


class StageModel:
    """A pipeline of `stage_module(torch, stage)`s (float64, `width` features between stages),
    trained on batches of `rows` rows per microbatch seeded by (ranks, microbatches, replica)
    with the mean squared error `loss_fn`."""

    def __init__(self, stage_module: Callable[[Any, int], Any], width: int, rows: int) -> None:
        self.stage_module = stage_module
        self.width = width
        self.rows = rows

    def batch(self, torch: Any, ranks: int, microbatches: int, replica: int = 0) -> Tuple[Any, Any]:
        generator = torch.Generator().manual_seed(ranks * 1000 + microbatches * 10 + replica)
        shape = (microbatches * self.rows, self.width)
        x = torch.randn(shape, dtype=torch.float64, generator=generator)
        y = torch.randn(shape, dtype=torch.float64, generator=generator)
        return x, y

    def reference(self, torch: Any, stages: int, ranks: int, microbatches: int,
                  replicas: int = 1) -> Tuple[Dict[str, Any], List[List[float]]]:
        """Per parameter `stage.name` the single-device gradient (replicas averaged, divided by M),
        and per replica the microbatches' losses. Computed with one thread, as the workers compute
        (a reduction split over threads, a norm's weight gradient, may round otherwise)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._reference(torch, stages, ranks, microbatches, replicas)
        finally:
            torch.set_num_threads(threads)

    def _reference(self, torch: Any, stages: int, ranks: int, microbatches: int,
                   replicas: int) -> Tuple[Dict[str, Any], List[List[float]]]:
        grads: Dict[str, Any] = {}
        losses: List[List[float]] = []
        for replica in range(replicas):
            modules = [self.stage_module(torch, s) for s in range(stages)]
            x, y = self.batch(torch, ranks, microbatches, replica)
            mine = []
            for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
                out = xm
                for module in modules:
                    out = module(out)
                loss = loss_fn(out, ym)
                loss.backward()
                mine.append(loss.item())
            losses.append(mine)
            for s, module in enumerate(modules):
                for name, p in module.named_parameters():
                    g = p.grad / microbatches
                    key = f"{s}.{name}"
                    grads[key] = g if key not in grads else grads[key] + g
        return {k: v / replicas for k, v in grads.items()}, losses

    def stage_modules(self, torch: Any, stages: Iterable[int], fsdp_mesh: Any = None) -> Dict[int, Any]:
        """Per stage of `stages` its module; with `fsdp_mesh`, sharded over its `dp` dimension by
        FSDP's `fully_shard`."""
        if fsdp_mesh is not None:
            from torch.distributed.fsdp import fully_shard
        modules = {}
        for s in stages:
            module = self.stage_module(torch, s)
            if fsdp_mesh is not None:
                fully_shard(module, mesh=fsdp_mesh["dp"])
            modules[s] = module
        return modules

    def compare(self, torch: Any, stages: int, ranks: int, microbatches: int,
                records: Sequence[Dict[str, Any]], replicas: int = 1,
                error: Callable[[str], Exception] = AssertionError) -> Tuple[float, bool]:
        """The largest relative difference of the workers' gradients and losses (`records`, as
        `gradient_record` and `loss_record` write them) to one device, and whether all of them are
        bit-identical; raises `error` when a gradient or a loss is missing or of the wrong size."""
        expected_grads, expected_losses = self.reference(torch, stages, ranks, microbatches, replicas)
        got: Dict[str, List[List[float]]] = {}
        losses: Dict[int, List[float]] = {}
        for record in records:
            for key, values in record["grads"].items():
                got.setdefault(key, []).append([float.fromhex(v) for v in values])
            if record["losses"] is not None:
                losses[record["replica"]] = [float.fromhex(v) for v in record["losses"]]
        worst, identical = 0.0, True
        for key, expected in expected_grads.items():
            if key not in got:
                raise error(f"no rank returned the gradient of {key}")
            want = expected.flatten().tolist()
            scale = max(max(abs(v) for v in want), 1e-300)
            for copy in got[key]:
                if len(copy) != len(want):
                    raise error(f"{key}: {len(copy)} values, expected {len(want)}")
                worst = max(worst, max(abs(a - b) for a, b in zip(copy, want)) / scale)
                identical &= copy == want
        for replica in range(replicas):
            have, want = losses.get(replica), expected_losses[replica]
            if have is None or len(have) != len(want):
                raise error(f"replica {replica}: losses {have}, expected {len(want)} of them")
            worst = max(worst, max(abs(a - b) / abs(b) for a, b in zip(have, want)))
            identical &= have == want
        return worst, identical


def pipeline_ends(mine: Iterable[int], stages: int, x: Any, y: Any) -> Tuple[Tuple[Any, ...], Any]:
    """`schedule.step`'s inputs and target on a rank holding stages `mine` of `stages`: `x` on the
    first stage's rank, `y` on the last's (None elsewhere)."""
    mine = set(mine)
    return ((x,) if 0 in mine else ()), (y if stages - 1 in mine else None)


# ----------------------------------------------------------------------------- the workers


def join_group(rank: int, world: int, port: int, timeout: float) -> None:
    """Joins the gloo process group of `world` processes on this machine at `port`."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout))


def pipeline_mesh(rank: int, ranks: int, replicas: int, port: int, timeout: float) -> Tuple[Any, Any, int, int]:
    """Joins the group of `ranks` x `replicas` processes (`join_group`) and returns its CPU mesh
    (`dp` x `pp`), this process's pipeline group, its pipeline rank and its replica."""
    from torch.distributed.device_mesh import init_device_mesh

    join_group(rank, ranks * replicas, port, timeout)
    mesh = init_device_mesh("cpu", (replicas, ranks), mesh_dim_names=("dp", "pp"))
    return mesh, mesh["pp"].get_group(), mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()


def gradient_record(modules: Dict[int, Any]) -> Dict[str, List[str]]:
    """Per parameter `stage.name` of `modules` (per stage) its whole gradient (an FSDP shard's
    gathered), as exact hex floats."""
    grads = {}
    for s, module in modules.items():
        for name, p in module.named_parameters():
            g = p.grad
            if hasattr(g, "full_tensor"):
                g = g.full_tensor()
            grads[f"{s}.{name}"] = [v.hex() for v in g.detach().flatten().tolist()]
    return grads


def loss_record(losses: Sequence[Any], target: Any) -> Optional[List[str]]:
    """The microbatches' losses as exact hex floats on the last stage's rank (`target` given), else None."""
    return [float(l).hex() for l in losses] if target is not None else None


# ----------------------------------------------------------------------------- the parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GroupFailed(Exception):
    pass


def tail(path: str, lines: int = 30) -> str:
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no output)"


def read_jsonl(paths: Iterable[str]) -> List[Dict[str, Any]]:
    """The records of every file of `paths`, one JSON document per line, in order."""
    records: List[Dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            records.extend(json.loads(line) for line in f)
    return records


class WorkerGroup:
    """Worker processes, one per command, each in its own session with its output in its log file.
    Use as a context manager: leaving it kills every worker still running (its whole process
    group) and closes the logs."""

    def __init__(self, commands: Sequence[Sequence[str]], logs: Sequence[str],
                 env: Optional[Dict[str, str]] = None) -> None:
        self.logs = list(logs)
        self.procs: List[subprocess.Popen] = []
        self._files: List[Any] = []
        try:
            for command, path in zip(commands, self.logs):
                log = open(path, "w")
                self._files.append(log)
                self.procs.append(subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                                                   env=env, start_new_session=True))
        except BaseException:
            self.kill()
            raise

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()
        for log in self._files:
            log.close()

    def wait(self, timeout: float, *, poll: float = 0.05, late: Optional[str] = None,
             exited: Optional[Callable[[int, int], str]] = None,
             check: Optional[Callable[[], Optional[str]]] = None) -> Optional[str]:
        """Polls every `poll` seconds until all workers exited with 0 (returns None) or one
        exited otherwise (returns `exited(rank, code)`, by default the code and the end of its
        log), `check()` returns why to stop, or `timeout` seconds pass (returns `late`, by default
        the end of every log)."""
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in self.procs]
            if all(c == 0 for c in codes):
                return None
            bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                if exited is not None:
                    return exited(bad[0], codes[bad[0]])
                return f"rank {bad[0]} exited with {codes[bad[0]]}:\n{tail(self.logs[bad[0]])}"
            reason = check() if check is not None else None
            if reason:
                return reason
            if time.monotonic() > deadline:
                if late is not None:
                    return late
                return f"the group ran past {timeout} s:\n" + "\n".join(tail(log, 5) for log in self.logs)
            time.sleep(poll)
