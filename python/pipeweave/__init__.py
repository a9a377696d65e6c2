"""pipeweave: compose pipeline-parallel training schedules as passes over one global plan.

    import pipeweave
    plan = pipeweave.plan("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", ranks=4, microbatches=8)
    plan.makespan, plan.bubble_rate, plan.order[0], plan.peak_activations_per_rank
    pipeweave.tune(ranks=8, microbatches=32, memory_limit=4)[0].expression

- `plan(expression, ranks, microbatches, ...)`: a verified, simulated plan with checked programs
  (`pipeweave plan`); its fields are those of `plan --format json`.
- `check(path)`: a schedule file imported and checked (`pipeweave check`).
- `tune(...)`, `frontier(...)`: the fastest schedules that fit (`pipeweave tune [--frontier]`).
- `Profile`: measured layer costs (`pipeweave.torch.profile` measures a PyTorch model).
- `register(PassClass)`: a pass written in Python, used in expressions like the built-ins.
- `Error` (a `ValueError`): bad input, with the CLI's message; `PassBug`: a pass broke a plan.

`pipeweave.torch` (needs PyTorch) turns a plan into a `torch.distributed.pipelining` schedule.
"""

from ._errors import Error, PassBug
from ._plan import Plan, parse_action
from ._profile import Profile
from ._passes import PassPlan, register, unregister
from ._api import Candidate, FrontierPoint, check, frontier, passes, plan, tune
from . import _native

__version__ = _native.__version__

__all__ = [
    "Candidate",
    "Error",
    "FrontierPoint",
    "PassBug",
    "PassPlan",
    "Plan",
    "Profile",
    "check",
    "frontier",
    "parse_action",
    "passes",
    "plan",
    "register",
    "tune",
    "unregister",
]
