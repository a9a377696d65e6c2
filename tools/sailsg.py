"""Loads sail-sg's `PipelineGraph` from one of their scheduler files (`v_schedule.py`, `zbv.py`,
`zbv_greedy.py`) without their package: its one non-standard import (the scheduler's `graph`
module) is stubbed. Shared by tools/zbv_sailsg.py and tools/controllable_sailsg.py."""

import sys
import types


def load(path, module_name="sailsg_schedule"):
    """sail-sg's PipelineGraph class from `path`."""
    graph = types.ModuleType("graph")
    graph.ScheduledNode = object
    graph.F, graph.B, graph.W, graph.FuncType = "F", "B", "W", object
    parts = "megatron.core.pipeline_parallel.zerobubble.scheduler.graph".split(".")
    for k in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:k]), types.ModuleType(parts[k - 1]))
    sys.modules[".".join(parts)] = graph
    scope = {"__name__": module_name}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), scope)
    return scope["PipelineGraph"]
