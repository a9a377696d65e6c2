# Type stubs of the public API of `pipeweave` (the package's runtime docstrings explain each
# argument: help(pipeweave.plan)).
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type, TypedDict, Union

from typing_extensions import Unpack

Number = Union[int, float]
PathLike = Union[str, os.PathLike]

__version__: str

class Error(ValueError): ...
class PassBug(Error): ...

def parse_action(text: str) -> Tuple[int, str, int]: ...

class Plan:
    # The report's fields (pipeweave._native.report_fields("plan"); test_stub.py holds them
    # together): Optional where the report may leave a field out (then the attribute is None).
    expression: str
    passes: List[str]
    ranks: int
    stages: int
    microbatches: int
    seq_chunks: int
    stage_to_rank: List[int]
    routes: List[List[Any]]
    tied_stages: List[List[int]]
    order: List[List[str]]
    makespan: float
    max_span: float
    bubble_rate: float
    lower_bound: float
    lower_bound_basis: str
    costs: Optional[str]
    optimality_gap: float
    busy_per_rank: List[float]
    idle_per_rank: List[float]
    peak_activations_per_rank: List[float]
    device_peak_per_rank: Optional[List[float]]
    host_peak_per_rank: Optional[List[float]]
    experts_peak_per_rank: Optional[List[float]]
    link_busy_per_rank: Optional[List[float]]
    ranks_per_link: Optional[int]
    shared_link_busy: Optional[List[float]]
    offloads_per_rank: Optional[List[int]]
    recomputes_per_rank: Optional[List[int]]
    recomputed_ops: Optional[int]
    a2a_hidden: Optional[float]
    a2a_exposed: Optional[float]
    a2a_hidden_fraction: Optional[float]
    a2a_paired_fraction: Optional[float]
    a2a_sequential_makespan: Optional[float]
    memory_limit: Optional[float]
    layers_per_stage: Optional[List[int]]
    bytes_per_unit: Optional[float]
    peak_activation_bytes_per_rank: Optional[List[float]]
    verified: bool
    messages: int
    communication_groups: int
    communication_checked: List[str]
    receive_buffers_per_rank: List[int]
    parameter_actions: List[str]
    @classmethod
    def from_report(cls, report: Union[Dict[str, Any], str]) -> "Plan": ...
    @property
    def report(self) -> Dict[str, Any]: ...
    @property
    def cut_given(self) -> bool: ...
    @property
    def recomputed(self) -> Set[Tuple[int, int]]: ...
    @property
    def offloaded(self) -> Set[Tuple[int, int]]: ...
    def stages_on(self, rank: int) -> List[int]: ...
    def actions(self, rank: int) -> List[Tuple[int, str, int]]: ...
    def to_csv(self, path: PathLike, lowered: bool = ...) -> None: ...
    def to_svg(self, path: PathLike) -> None: ...
    def to_trace(self, path: PathLike) -> None: ...
    def programs(self) -> List[List[Dict[str, Any]]]: ...
    def programs_document(self) -> Dict[str, Any]: ...

class Profile:
    def __init__(self, data: Dict[str, Any]) -> None: ...
    @classmethod
    def from_json(cls, text: str) -> "Profile": ...
    @classmethod
    def load(cls, path: PathLike) -> "Profile": ...
    def save(self, path: PathLike) -> None: ...
    def to_json(self) -> str: ...
    @property
    def data(self) -> Dict[str, Any]: ...
    @property
    def layer_names(self) -> List[str]: ...
    layers: List[Dict[str, Any]]
    send: Dict[str, Any]
    model: Dict[str, Any]
    threads_per_rank: int
    repeats: int

class PassPlan:
    ranks: int
    stages: int
    microbatches: int
    stage_to_rank: List[int]
    order: List[List[str]]
    costs: List[Dict[str, float]]
    comm: float
    memory: List[Dict[str, float]]
    memory_limit: Optional[float]
    facts: Dict[str, Any]
    passes: List[str]
    def stages_on(self, rank: int) -> List[int]: ...
    def actions(self, rank: int) -> List[Tuple[int, str, int]]: ...

class Candidate:
    expression: str
    makespan: float
    bubble_rate: float
    peak_activations: float
    stages: int
    pytorch: bool
    lower_bound: float
    layers_per_stage: Optional[List[int]]
    peak_activation_bytes: Optional[float]

class FrontierPoint:
    memory_limit: float
    expression: str
    makespan: float
    peak_activations: float
    family: str

ProfileArg = Union[PathLike, Profile, None]

class _ProblemOptions(TypedDict, total=False):
    # The keyword arguments `plan`, `tune` and `frontier` share (each optional, None by default).
    costs: Optional[Mapping[str, Number]]
    activation_memory: Optional[Mapping[str, Number]]
    memory_limit: Union[Number, str, None]
    profile: ProfileArg
    layers_per_stage: Optional[Sequence[int]]
    microbatch_tokens: Optional[Sequence[int]]
    cores: Optional[int]
    ranks_per_link: int

def plan(
    expression: str,
    ranks: int,
    microbatches: int,
    *,
    recv: str = ...,
    passes: Sequence[type] = ...,
    **options: Unpack[_ProblemOptions],
) -> Plan: ...
def check(path: PathLike, *, costs: Optional[Mapping[str, Number]] = ..., recv: str = ...) -> Plan: ...
def tune(
    ranks: int,
    microbatches: int,
    *,
    top: int = ...,
    runtime: Optional[str] = ...,
    **options: Unpack[_ProblemOptions],
) -> List[Candidate]: ...
def frontier(
    ranks: int,
    microbatches: int,
    *,
    svg: Optional[PathLike] = ...,
    **options: Unpack[_ProblemOptions],
) -> List[FrontierPoint]: ...
def passes() -> List[str]: ...
def register(cls: Type[Any]) -> Type[Any]: ...
def unregister(name: str) -> None: ...
