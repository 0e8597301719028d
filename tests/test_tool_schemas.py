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
    """What a tool accepts is the kernel's param schema; what it advertises is that schema
    too, or (for the few multi-typed params) one of its types."""
    assert set(tool.schema["properties"]) == set(tool.args) == set(tool.accepts["properties"])
    for name, prop in tool.accepts["properties"].items():
        method, param = tool.source(name)
        kernel = PARAMS[method]["properties"][param]
        assert constraints(prop) == constraints(kernel), (tool.name, name, method, param)
        advertised = tool.schema["properties"][name]
        if isinstance(kernel.get("type"), str):
            assert constraints(advertised) == constraints(kernel), (tool.name, name)
        assert advertised.get("description"), f"{tool.name}.{name} says nothing to the model"


def _type_problems(schema: object, where: str) -> list[str]:
    """Type arrays anywhere, and properties without one top-level ``type``."""
    problems: list[str] = []
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), list):
            problems.append(f"{where}: type array {schema['type']}")
        for name, prop in (schema.get("properties") or {}).items():
            if not isinstance(prop.get("type"), str):
                problems.append(f"{where}.{name}: no single top-level type")
        for key, value in schema.items():
            problems += _type_problems(value, f"{where}.{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            problems += _type_problems(value, f"{where}[{i}]")
    return problems


@pytest.mark.parametrize("tool", TOOLS, ids=TOOL_IDS)
def test_advertised_schemas_have_one_type_per_property_and_no_type_arrays(tool: Tool):
    """Inspector sends a type-less property as a string; single-type dialects (Gemini-backed
    clients) reject ``["integer", "null"]``."""
    assert _type_problems(tool.schema, tool.name) == []


@pytest.mark.parametrize(
    ("tool_name", "args"),
    [
        ("shoal_pty_send", {"pty_id": "pty:1", "input": "ls\n"}),
        ("shoal_pty_send", {"pty_id": "pty:1", "input": {"key": "Enter"}}),
        ("shoal_pty_send", {"pty_id": "pty:1", "input": [{"text": "ls"}, {"key": "Enter"}]}),
        ("shoal_get", {"ref": "out:1", "slice": [0, None]}),
        ("shoal_get", {"ref": "out:1", "slice": "0..2"}),
        ("shoal_cancel", {"task": 3}),
    ],
)
def test_the_kernels_wider_forms_are_still_accepted(tool_name, args):
    tool = next(t for t in TOOLS if t.name == tool_name)
    validate(args, tool.accepts, "arguments")


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
        by_name["shoal_exec"]["command"]["maxLength"]
        == PARAMS["exec"]["properties"]["src"]["maxLength"]
    )
    assert (
        by_name["shoal_exec"]["timeout_ms"]["maximum"]
        == PARAMS["exec"]["properties"]["timeout_ms"]["maximum"]
        == by_name["shoal_get"]["wait_ms"]["maximum"]
    )
    assert "maximum" not in by_name["shoal_get"]["length"]  # clamped, never refused
    assert "maximum" not in PARAMS["value.get"]["properties"]["length"]


def test_exec_and_plan_call_their_source_command():
    """The ecosystem's name (Claude Code's Bash, Desktop Commander, mcp-shell-server)."""
    for name in ("shoal_exec", "shoal_plan"):
        tool = next(t for t in TOOLS if t.name == name)
        assert "command" in tool.schema["required"] and "src" not in tool.schema["properties"]
        assert tool.to_kernel({"command": "echo hi"})[1]["src"] == "echo hi"
