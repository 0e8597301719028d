"""Tool schemas are derived from the kernel's params schemas, so they cannot drift.

Every tool argument is a kernel param; its constraints (everything but the
description) must be the kernel's, and the kernel must register exactly the schemas
of ``protocol.params``.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

import shoal_mcp.kernel.rpc.methods  # noqa: F401 - registers every kernel method
from shoal_mcp.facade.tools import TOOLS, Tool
from shoal_mcp.kernel.rpc.registry import REGISTRY
from shoal_mcp.kernel.values.elision import ElideOptions
from shoal_mcp.protocol.params import ELIDE, PARAMS
from shoal_mcp.protocol.schema import validate

ANNOTATIONS = {"description", "title", "examples", "default"}
TOOL_IDS = [t.name for t in TOOLS]


def constraints(schema: object) -> object:
    """``schema`` without the keys that only describe (at every depth)."""
    if isinstance(schema, dict):
        return {k: constraints(v) for k, v in schema.items() if k not in ANNOTATIONS}
    if isinstance(schema, list):
        return [constraints(v) for v in schema]
    return schema


@pytest.mark.parametrize("tool", TOOLS, ids=TOOL_IDS)
def test_every_tool_argument_has_the_kernel_params_constraints(tool: Tool):
    assert set(tool.schema["properties"]) == set(tool.args)
    for name, prop in tool.schema["properties"].items():
        method, param = tool.source(name)
        kernel = PARAMS[method]["properties"][param]
        assert constraints(prop) == constraints(kernel), (tool.name, name, method, param)
        assert prop.get("description"), f"{tool.name}.{name} says nothing to the model"


@pytest.mark.parametrize("tool", TOOLS, ids=TOOL_IDS)
def test_tool_schemas_are_closed_and_keep_what_the_kernel_requires(tool: Tool):
    schema = tool.schema
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    required = set(schema.get("required", ()))
    assert required <= set(tool.args)
    supplied = {tool.source(n)[1] for n in tool.args if tool.source(n)[0] == tool.method}
    for param in PARAMS[tool.method].get("required", ()):
        if param in supplied:
            exposed = next(n for n in tool.args if tool.source(n) == (tool.method, param))
            assert exposed in required, (tool.name, param)
        else:
            assert param in tool.fixed or param in tool.defaults, (tool.name, param)


@pytest.mark.parametrize("tool", TOOLS, ids=TOOL_IDS)
def test_fixed_and_default_params_are_valid_kernel_params(tool: Tool):
    kernel = PARAMS[tool.method]
    params = {**tool.defaults, **tool.fixed}
    assert set(params) <= set(kernel["properties"]), tool.name
    assert not set(tool.fixed) & set(tool.args), "an argument the kernel call then overrides"
    minimal = {n: "x" for n in tool.schema.get("required", ())}
    method, sent = tool.to_kernel(minimal)
    assert method == tool.method and sent.items() >= tool.fixed.items()
    for key, value in params.items():
        validate(value, kernel["properties"][key], key)


def test_the_kernel_registers_exactly_the_shared_schemas():
    assert set(REGISTRY) == set(PARAMS)
    for name, spec in REGISTRY.items():
        assert spec.schema is PARAMS[name], name


def test_elide_schema_names_exactly_the_elision_options():
    # page_bytes is no option of its own: it follows a caller's max_bytes
    assert set(ELIDE["properties"]) == {f.name for f in fields(ElideOptions)} - {"page_bytes"}
    defaults = ElideOptions().as_dict()
    validate(defaults, ELIDE, "elide")  # the defaults are themselves allowed values


def test_a_tool_limit_is_the_kernel_limit():
    """The drift issue 12 found: src, timeout_ms, length; now one number each."""
    by_name = {t.name: t.schema["properties"] for t in TOOLS}
    assert (
        by_name["shoal_exec"]["src"]["maxLength"]
        == PARAMS["exec"]["properties"]["src"]["maxLength"]
    )
    assert (
        by_name["shoal_exec"]["timeout_ms"]["maximum"]
        == PARAMS["exec"]["properties"]["timeout_ms"]["maximum"]
        == by_name["shoal_get"]["wait_ms"]["maximum"]
    )
    assert "maximum" not in by_name["shoal_get"]["length"]  # clamped, never refused
    assert "maximum" not in PARAMS["value.get"]["properties"]["length"]
