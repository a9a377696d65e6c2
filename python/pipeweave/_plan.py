"""The `Plan` a schedule expression builds: its figures (the fields of `pipeweave plan --format json`
as attributes), its per-rank orders in PyTorch's action notation, and the files it writes."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Set, Tuple

# `<stage><NAME><microbatch>`, e.g. `2F5`, `0OFFLOAD3`; overlapped pairs are `(a;b)OVERLAP_F_B`.
_ACTION = re.compile(r"^(\d+)([A-Z_]+?)(\d+)$")


def parse_action(text: str) -> Tuple[int, str, int]:
    """`"2F5"` -> `(2, "F", 5)`: the stage, the action's name and the microbatch.

    Raises `ValueError` for an overlapped pair or anything that is not one action."""
    match = _ACTION.match(text.strip())
    if match is None:
        raise ValueError(f"`{text}` is not one action of the form <stage><name><microbatch>")
    return int(match.group(1)), match.group(2), int(match.group(3))


def _optional_fields() -> Set[str]:
    """The report's fields that may be absent (`Optional[...]` in the report's definition)."""
    global _OPTIONAL
    if _OPTIONAL is None:
        from . import _native

        _OPTIONAL = {name for name, kind in _native.report_fields("plan") if kind.startswith("Optional[")}
    return _OPTIONAL


_OPTIONAL = None


class Plan:
    """A verified, simulated plan whose per-rank programs passed the communication check.

    Every field of `pipeweave plan --format json` is an attribute of the same name (`makespan`,
    `bubble_rate`, `order`, `stage_to_rank`, `peak_activations_per_rank`, ...); `report` is the
    whole JSON document as a dict. Build one with `pipeweave.plan(...)` or `pipeweave.check(path)`.
    """

    def __init__(self, report: Dict[str, Any], native: Any = None, cut_given: bool = True):
        self._report = report
        self._native = native
        # Whether `layers_per_stage` was asked for: without it a profiled plan spreads the
        # layers evenly over all its stages (what `pipeweave.torch.split` then does too), while
        # the report's `layers_per_stage` gives each rank's share of the even per-rank cut.
        self._cut_given = cut_given

    @property
    def cut_given(self) -> bool:
        """Whether the plan was built with an explicit `layers_per_stage`."""
        return self._cut_given

    @classmethod
    def from_report(cls, report: Dict[str, Any]) -> "Plan":
        """A plan from the JSON document `pipeweave plan --format json` printed (no files can be
        written from it: `to_csv` and the others need a plan built by `pipeweave.plan`)."""
        if isinstance(report, str):
            report = json.loads(report)
        return cls(dict(report), None)

    # ------------------------------------------------------------------ the report's fields
    @property
    def report(self) -> Dict[str, Any]:
        """The whole report, as `pipeweave plan --format json` prints it."""
        return self._report

    def __getattr__(self, name: str) -> Any:
        report = self.__dict__.get("_report")
        if report is not None and name in report:
            return report[name]
        if name in _optional_fields():
            # A field the report leaves out where it does not apply (no offload, no profile).
            return None
        raise AttributeError(
            f"Plan has no field `{name}`; its report has: {', '.join(sorted(report or {}))}"
        )

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._report))

    def __repr__(self) -> str:
        r = self._report
        return (
            f"Plan({r.get('expression')!r}, ranks={r.get('ranks')}, "
            f"microbatches={r.get('microbatches')}, makespan={r.get('makespan')}, "
            f"bubble_rate={r.get('bubble_rate')})"
        )

    def stages_on(self, rank: int) -> List[int]:
        """The stage indices `rank` holds, in increasing order."""
        ranks = self._report["ranks"]
        if not isinstance(rank, int) or not 0 <= rank < ranks:
            from pipeweave import Error

            raise Error(f"rank {rank} is out of range: the plan has {ranks} ranks")
        return [s for s, r in enumerate(self._report["stage_to_rank"]) if r == rank]

    def actions(self, rank: int) -> List[Tuple[int, str, int]]:
        """Rank `rank`'s order as `(stage, name, microbatch)` triples (overlapped pairs split in
        two, forward first)."""
        out = []
        for text in self._report["order"][rank]:
            if text.startswith("("):
                inner = text[1 : text.index(")")]
                out.extend(parse_action(part) for part in inner.split(";"))
            else:
                out.append(parse_action(text))
        return out

    def _pairs_with(self, name: str) -> Set[Tuple[int, int]]:
        return {
            (stage, mb)
            for rank in range(self._report["ranks"])
            for stage, action, mb in self.actions(rank)
            if action == name
        }

    @property
    def recomputed(self) -> Set[Tuple[int, int]]:
        """The (stage, microbatch) pairs whose forward activations the plan drops and recomputes
        (its `R` actions)."""
        return self._pairs_with("R")

    @property
    def offloaded(self) -> Set[Tuple[int, int]]:
        """The (stage, microbatch) pairs whose activations the plan offloads to host memory and
        reloads (its `OFFLOAD` actions)."""
        return self._pairs_with("OFFLOAD")

    # ------------------------------------------------------------------ files and programs
    def _require_native(self, what: str):
        if self._native is None:
            from pipeweave import Error

            raise Error(f"{what} needs a plan built by pipeweave.plan or pipeweave.check")
        return self._native

    def to_csv(self, path: str, lowered: bool = False) -> None:
        """Writes PyTorch's schedule CSV (compute actions; with `lowered`, the checked programs
        with their communication), as `plan --csv [--lowered]`."""
        self._require_native("to_csv").write_csv(str(path), bool(lowered))

    def to_svg(self, path: str) -> None:
        """Writes the SVG timeline, as `plan --svg`."""
        self._require_native("to_svg").write_svg(str(path))

    def to_trace(self, path: str) -> None:
        """Writes the Chrome/Perfetto trace, as `plan --trace`."""
        self._require_native("to_trace").write_trace(str(path))

    def programs(self) -> List[List[Dict[str, Any]]]:
        """Per rank, its checked program's instructions (`programs()[r]` rank r's), as
        `plan --programs` writes them under `programs`; `programs_document()` is that whole
        file."""
        return [rank["instrs"] for rank in self.programs_document()["programs"]]

    def programs_document(self) -> Dict[str, Any]:
        """The file `plan --programs` writes: `programs` (per rank, its rank and `instrs`),
        `forward_only` and `semantics` (the communication semantics it was checked under)."""
        return json.loads(self._require_native("programs").programs_json())
