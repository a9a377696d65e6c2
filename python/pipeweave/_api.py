"""`plan`, `check`, `tune` and `frontier`: the CLI's commands as functions, through the same
library code (the figures of `pipeweave plan --format json` as attributes, the same error lines)."""

from __future__ import annotations

import inspect
import json
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _native
from ._errors import Error
from ._options import key_values, request
from ._passes import registrations
from ._plan import Plan

Number = Union[int, float]


class _NativeFiles:
    """The native plan behind a `Plan`, with `to_csv`'s note turned into a warning."""

    def __init__(self, native: Any):
        self._native = native

    def write_csv(self, path: str, lowered: bool) -> None:
        note = self._native.write_csv(path, lowered)
        if note:
            warnings.warn(note, stacklevel=3)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)


def _plan_of(native: Any, cut_given: bool = True) -> Plan:
    return Plan(json.loads(native.report_json()), _NativeFiles(native), cut_given)


# The keyword arguments that describe the problem, shared by `plan`, `tune` and `frontier` (the
# stub's `_ProblemOptions`): `request` renders them as the CLI's options.
_PROBLEM_OPTIONS = frozenset(inspect.signature(request).parameters) - {"ranks", "microbatches"}


def _problem(function: str, ranks: Any, microbatches: Any, options: Dict[str, Any]) -> Dict[str, Any]:
    """The native request of `function`'s problem; a keyword it does not take is a `TypeError`
    naming it, as Python's own for a missing parameter."""
    for name in options:
        if name not in _PROBLEM_OPTIONS:
            raise TypeError(f"{function}() got an unexpected keyword argument '{name}'")
    return request(ranks, microbatches, **options)


def _records(cls: type, rows: Sequence[Mapping[str, Any]]) -> list:
    """`rows` of a JSON report as `cls` dataclasses, each row's keys that `cls` has no field for
    left out (a newer report may add some)."""
    fields = cls.__dataclass_fields__
    return [cls(**{k: v for k, v in row.items() if k in fields}) for row in rows]


def plan(
    expression: str,
    ranks: int,
    microbatches: int,
    *,
    recv: str = "early",
    passes: Sequence[type] = (),
    **options: Any,
) -> Plan:
    """Builds the schedule `expression`, verifies it after every pass, simulates it, projects
    and checks its per-rank programs: `pipeweave plan EXPRESSION -p RANKS -m MICROBATCHES`.

    Arguments (as the CLI's options of the same names):
      expression: a schedule expression, e.g. `"zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))"`.
      ranks, microbatches: the pipeline's ranks (P) and microbatches (M).
      recv: where receives go in the programs, `"early"` or `"just-in-time"`.
      passes: pass classes written in Python for this call (see `pipeweave.register`).
    The problem's options (`tune` and `frontier` take them too, each optional):
      costs: durations of a rank's share, `{"F": 1, "I": 1, "W": 1, "B": .., "FB": .., "R": ..,
        "offload": .., "comm": 0}` (every key optional).
      activation_memory: one microbatch's activations on a rank's share, `{"total": 1,
        "weight_grad": 0.43}`.
      memory_limit: a per-rank bound in units of `total`, or bytes (`"2GiB"`) with a profile.
      profile: a `pipeweave.Profile` or the path of a profile file (replaces costs and memory).
      layers_per_stage: with a profile, the layers of each rank's share (default: even).
      microbatch_tokens: with a profile, each microbatch's tokens per sequence.
      cores: with a profile, the cores the ranks share.
      ranks_per_link: consecutive ranks sharing one host link for offload transfers (default 1:
        a link per rank); the report then gives `ranks_per_link` and `shared_link_busy`.

    Returns a `Plan`. Raises `pipeweave.Error` with the CLI's message for bad input,
    `pipeweave.PassBug` when a pass broke the plan.
    """
    if not isinstance(expression, str):
        raise Error(f"the expression is text, got {type(expression).__name__}")
    if not isinstance(recv, str):
        raise Error("option --recv: `early` or `just-in-time`")
    args = _problem("plan", ranks, microbatches, options)
    native = _native.compile_plan(expression, args, recv, registrations(passes))
    return _plan_of(native, cut_given=options.get("layers_per_stage") is not None)


def check(
    path: Union[str, os.PathLike],
    *,
    costs: Optional[Mapping[str, Number]] = None,
    recv: str = "early",
) -> Plan:
    """Imports a schedule file as `pipeweave check PATH` does (PyTorch's schedule CSV, compute-only
    or lowered, ours or PyTorch's; or a reference JSON file), verifies it, checks its
    communication and simulates it under `costs`. Returns a `Plan`."""
    if not isinstance(path, (str, os.PathLike)):
        raise Error(f"check takes a file's path, got {type(path).__name__}")
    if not isinstance(recv, str):
        raise Error("option --recv: `early` or `just-in-time`")
    native = _native.check_file(os.fspath(path), key_values("--costs", costs), recv)
    return _plan_of(native)


@dataclass(frozen=True)
class Candidate:
    """One schedule `tune` ranked: give `expression` to `plan` with the same options (and
    `layers_per_stage`) for the same figures."""

    expression: str
    makespan: float
    bubble_rate: float
    peak_activations: float
    stages: int
    pytorch: bool = True
    # A lower bound on every schedule of this candidate's placement within the memory limit
    # (`tune --format json`'s `lower_bound`): the least over the candidates is the search's limit.
    lower_bound: float = 0.0
    layers_per_stage: Optional[List[int]] = None
    peak_activation_bytes: Optional[float] = None


@dataclass(frozen=True)
class FrontierPoint:
    """A point of the memory/time frontier: the fastest schedule found within `memory_limit`."""

    memory_limit: float
    expression: str
    makespan: float
    peak_activations: float
    family: str = ""


def tune(
    ranks: int,
    microbatches: int,
    *,
    top: int = 5,
    runtime: Optional[str] = None,
    **options: Any,
) -> List[Candidate]:
    """Searches the schedules (and with a profile, the cuts) for the fastest that fit
    `memory_limit`: `pipeweave tune`. Arguments as `plan`'s; `top`: how many to return;
    `runtime="pytorch"`: only the schedules PyTorch's pipelining runtime can run
    (`pipeweave.torch.schedule`: one route, so no DualPipe). Returns `Candidate`s, fastest
    first (`Candidate.pytorch` says whether PyTorch can run it)."""
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise Error(f"option --top: `{top!r}` must be a whole number >= 1")
    if runtime not in (None, "pytorch"):
        raise Error(f"runtime= is None or \"pytorch\", got {runtime!r}")
    args = _problem("tune", ranks, microbatches, options)
    # Filtered before the best `top` are kept: ask for all of them.
    report = json.loads(_native.tune_json(args, top if runtime is None else 2**31))
    found = _records(Candidate, report["candidates"])
    if runtime == "pytorch":
        found = [c for c in found if c.pytorch]
        if not found:
            raise Error(f"no schedule PyTorch's runtime can run fits ({report['evaluated']} tried)")
    return found[:top]


def frontier(
    ranks: int,
    microbatches: int,
    *,
    svg: Union[str, os.PathLike, None] = None,
    **options: Any,
) -> List[FrontierPoint]:
    """The memory/time frontier (`pipeweave tune --frontier`): for each memory limit up to
    `memory_limit`, the fastest schedule found. Arguments as `plan`'s; `svg`: also draw it to
    that file. Returns `FrontierPoint`s, least memory first."""
    args = _problem("frontier", ranks, microbatches, options)
    if svg is not None and not isinstance(svg, (str, os.PathLike)):
        raise Error(f"svg= takes a file's path, got {type(svg).__name__}")
    found = json.loads(_native.frontier_json(args, None if svg is None else os.fspath(svg)))
    return _records(FrontierPoint, found["frontier"])


def passes() -> List[str]:
    """The pass names expressions can use: the built-ins and those `register` added."""
    from ._passes import _registered

    return sorted(set(_native.builtin_passes()) | set(_registered))
