"""Passes written in Python: a class with `name` and `rewrite(self, plan) -> orders`, registered
beside the built-ins, used in expressions like them, verified by the same driver and blamed by
name when it breaks a plan.

    class LazyW:
        name = "lazy_w"
        requires = {"pacing": ["1f1b"], "whole_backwards": True}
        changes = ("backwards",)

        def __init__(self, memory=None):
            self.memory = memory

        def rewrite(self, plan):          # plan: a PassPlan
            return [...]                  # per rank, actions in Plan.order's notation

    pipeweave.plan("lazy_w(f1b(gpipe), memory=4)", ranks=4, microbatches=8, passes=[LazyW])

`requires` (all optional): `pacing`, the pacings the input may have (`unscheduled`, `fill_drain`,
`1f1b`, `custom`); `layouts`, its layout kinds (`linear`, `interleaved`, `dual`, `custom`);
`whole_backwards`, whether it must still have whole backwards. `changes`: what the pass changes
besides the orders, each following from the orders it returns: `backwards` (split where they
hold I or W), `pacing` (then custom), `residency` (recompute where they hold R, offload where
OFFLOAD). Anything else it changes is a bug the driver reports (`pipeweave.PassBug`).
"""

from __future__ import annotations

import json
import keyword
import traceback
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ._errors import Error
from ._plan import parse_action

_PACINGS = ("unscheduled", "fill_drain", "1f1b", "custom")
_LAYOUTS = ("linear", "interleaved", "dual", "custom")
_CHANGES = ("backwards", "pacing", "residency")

# The passes registered for the process (`register`), by name.
_registered: Dict[str, type] = {}


class PassPlan:
    """The plan a Python pass rewrites: `ranks`, `stages`, `microbatches`, `stage_to_rank`,
    `order` (per rank, actions in PyTorch's notation), `costs` (per stage: `F`, `I`, `W`, `B`,
    `FB`, `R`, `offload`), `comm`, `memory` (per stage: `total`, `weight_grad`), `memory_limit`
    (or None), `facts` (`pacing`, `layout`, `split_backwards`, `recomputed`, `offloaded`) and
    `passes` (the names applied so far)."""

    def __init__(self, data: Dict[str, Any]):
        self._data = data

    def __getattr__(self, name: str) -> Any:
        data = self.__dict__.get("_data")
        if data is not None and name in data:
            return data[name]
        raise AttributeError(f"PassPlan has no field `{name}`")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._data))

    def stages_on(self, rank: int) -> List[int]:
        """The stages `rank` holds, in increasing order."""
        return [s for s, r in enumerate(self._data["stage_to_rank"]) if r == rank]

    def actions(self, rank: int) -> List[Tuple[int, str, int]]:
        """Rank `rank`'s order as `(stage, name, microbatch)` triples."""
        return [parse_action(a) for a in self._data["order"][rank] if not a.startswith("(")]


def _names(what: str, cls: type, values: Any, allowed: Sequence[str]) -> Optional[List[str]]:
    if values is None:
        return None
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise Error(f"pass `{cls.__name__}`: `{what}` is a list of names from {', '.join(allowed)}")
    values = list(values)
    for v in values:
        if v not in allowed:
            raise Error(f"pass `{cls.__name__}`: {what} `{v}` is not one of {', '.join(allowed)}")
    return values


def describe(cls: Any) -> Dict[str, Any]:
    """The registration the native module takes for the pass class `cls` (checked here)."""
    if not isinstance(cls, type):
        raise Error(f"a pass is a class with `name` and `rewrite`, got {type(cls).__name__}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise Error(
            f"pass class `{cls.__name__}`: `name` must be a name of the expression language "
            f"(letters, digits, `_`), got {name!r}"
        )
    if not callable(getattr(cls, "rewrite", None)):
        raise Error(f"pass `{name}`: the class has no `rewrite(self, plan)` method")
    requires = getattr(cls, "requires", None) or {}
    if not isinstance(requires, dict):
        raise Error(f"pass `{name}`: `requires` is a dict (pacing, layouts, whole_backwards)")
    unknown = set(requires) - {"pacing", "layouts", "whole_backwards"}
    if unknown:
        raise Error(
            f"pass `{name}`: `requires` has {', '.join(sorted(unknown))}; "
            f"it takes pacing, layouts, whole_backwards"
        )
    changes = getattr(cls, "changes", ()) or ()
    if isinstance(changes, str):
        changes = (changes,)
    changes = _names("changes", cls, changes, _CHANGES) or []
    whole = requires.get("whole_backwards", False)
    if not isinstance(whole, bool):
        raise Error(f"pass `{name}`: `whole_backwards` is True or False")

    def make(kwargs: Dict[str, Any]) -> Any:
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise TypeError(f"pass `{name}` does not take these arguments: {e}") from None

    def run(instance: Any, plan_json: str) -> List[List[str]]:
        try:
            orders = instance.rewrite(PassPlan(json.loads(plan_json)))
            return [[str(a) for a in order] for order in orders]
        except Exception as e:  # a bug in the pass: the driver blames it by name
            frames = traceback.format_exception(type(e), e, e.__traceback__)
            raise RuntimeError(f"rewrite raised {type(e).__name__}: {e} ({frames[-2].strip()})") from None

    return {
        "name": name,
        "pacing": _names("pacing", cls, requires.get("pacing"), _PACINGS),
        "layouts": _names("layouts", cls, requires.get("layouts"), _LAYOUTS),
        "whole_backwards": whole,
        "changes": changes,
        "make": make,
        "run": run,
    }


def register(cls: type) -> type:
    """Registers the pass class `cls` for the process: every later `plan`, `tune` of this
    process can use it by its `name`. Returns `cls` (usable as a decorator). A name taken by a
    built-in or another registered pass is an `Error`."""
    from . import _native

    registration = describe(cls)
    name = registration["name"]
    if name in _native.builtin_passes():
        raise Error(f"a pass named `{name}` is already registered (a built-in)")
    if name in _registered and _registered[name] is not cls:
        raise Error(f"a pass named `{name}` is already registered")
    _registered[name] = cls
    return cls


def unregister(name: str) -> None:
    """Removes a pass `register` added (an `Error` if there is none of that name)."""
    if name not in _registered:
        raise Error(f"no pass named `{name}` is registered")
    del _registered[name]


def registrations(passes: Sequence[type] = ()) -> List[Dict[str, Any]]:
    """The process's registered passes and `passes` (for one call), as the native module takes
    them."""
    if isinstance(passes, type) or not isinstance(passes, Iterable):
        raise Error("passes= takes a list of pass classes")
    chosen = dict(_registered)
    given = set()
    for cls in passes:
        reg_name = getattr(cls, "name", None)
        if reg_name in given:
            raise Error(f"passes= names two passes `{reg_name}`: a pass has one name")
        given.add(reg_name)
        chosen[reg_name] = cls
    return [describe(cls) for cls in chosen.values()]
