"""Packaging facts CI relies on: the floors it tests are the floors declared, and what
the sdist must carry for its own tests to run."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _requirements() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    return {re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0].lower(): d for d in deps}


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "min-constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_every_dependency_has_a_floor_and_ci_pins_exactly_that_floor():
    requirements, pins = _requirements(), _constraints()
    assert set(pins) == set(requirements)
    for name, spec in requirements.items():
        floor = re.search(r">=\s*([\w.]+)", spec)
        assert floor, f"{name}: no >= floor in {spec!r}"
        assert pins[name] == floor.group(1), f"{name}: CI pins {pins[name]}, floor {floor.group(1)}"


def test_tree_sitter_floor_can_load_the_bash_grammar_floor():
    """tree-sitter 0.24 refuses tree-sitter-bash 0.25's grammar (ABI 15): the floors
    must be a pair that works (found by installing them; see pyproject.toml)."""
    pins = _constraints()
    major_minor = tuple(int(x) for x in pins["tree-sitter"].split(".")[:2])
    bash = tuple(int(x) for x in pins["tree-sitter-bash"].split(".")[:2])
    assert not (bash >= (0, 25) and major_minor < (0, 25))


def test_the_sdist_carries_what_its_tests_read():
    manifest = (ROOT / "MANIFEST.in").read_text()
    for line in (
        "recursive-include tests/mcp_schemas *.json",
        "recursive-include tests/fuzz_corpus *",
        "include .ci/min-constraints.txt",
    ):
        assert line in manifest
    # and those files are there to ship (in an unpacked sdist too)
    assert list((ROOT / "tests" / "mcp_schemas").glob("*/schema.json"))
    assert any((ROOT / "tests" / "fuzz_corpus").iterdir())
