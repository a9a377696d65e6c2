"""The type stub and the classes agree with the report's one definition: the Rust structs' fields
as `pipeweave._native.report_fields` reads them (names, order and Python types). A field added,
renamed or retyped on one side alone fails here."""

import ast
import dataclasses
import os

import pytest

import pipeweave
from pipeweave import _native

STUB = os.path.join(os.path.dirname(pipeweave.__file__), "__init__.pyi")


def stub_fields(class_name):
    """The annotated attributes of `class_name` in the stub, as (name, annotation text)."""
    with open(STUB) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [
                (item.target.id, ast.unparse(item.annotation))
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            ]
    raise AssertionError(f"the stub has no class {class_name}")


@pytest.mark.parametrize(
    "kind, class_name",
    [("plan", "Plan"), ("candidate", "Candidate"), ("frontier_point", "FrontierPoint")],
)
def test_the_stub_lists_the_reports_fields_with_their_types(kind, class_name):
    assert stub_fields(class_name) == list(_native.report_fields(kind))


@pytest.mark.parametrize(
    "kind, cls", [("candidate", pipeweave.Candidate), ("frontier_point", pipeweave.FrontierPoint)]
)
def test_the_result_classes_have_the_reports_fields(kind, cls):
    # The dataclasses' annotations are the stub's (they are strings: `from __future__ import
    # annotations` is not used there, so compare the names and the required ones).
    names = [f.name for f in dataclasses.fields(cls)]
    assert names == [name for name, _ in _native.report_fields(kind)]


def test_a_plan_has_every_field_and_none_where_the_report_leaves_one_out():
    plan = pipeweave.plan("f1b(gpipe)", ranks=2, microbatches=4)
    for name, kind in _native.report_fields("plan"):
        value = getattr(plan, name)
        if kind.startswith("Optional["):
            assert value is None or name in plan.report
        else:
            assert name in plan.report and value is not None, name
    # Without offload, the host's figures are left out of the report and read as None.
    assert "host_peak_per_rank" not in plan.report and plan.host_peak_per_rank is None
    with pytest.raises(AttributeError, match="no field `makespam`"):
        plan.makespam


def test_an_unknown_report_kind_is_an_error():
    with pytest.raises(pipeweave.Error, match="not a report kind"):
        _native.report_fields("plans")
