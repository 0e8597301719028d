"""The docs describe exactly what the code implements: methods, tools, templates, codes."""

from __future__ import annotations

import re
from pathlib import Path

import shoal_mcp.kernel.rpc.methods  # noqa: F401 - registers every kernel method
from shoal_mcp.facade.resources import TEMPLATES
from shoal_mcp.facade.tools import TOOLS
from shoal_mcp.kernel.rpc.registry import REGISTRY
from shoal_mcp.protocol.errors import ErrorCode

DOCS = Path(__file__).resolve().parent.parent / "docs"
PROTOCOL = (DOCS / "protocol.md").read_text()
ALL_DOCS = "\n".join(p.read_text() for p in DOCS.glob("*.md"))


def _table_names(pattern: str) -> set[str]:
    """Backticked first cells of protocol.md table rows matching ``pattern``."""
    return {
        m.group(1)
        for m in re.finditer(r"^\| `([^`]+)` \|", PROTOCOL, re.M)
        if re.fullmatch(pattern, m.group(1))
    }


def test_every_kernel_method_is_documented_and_vice_versa():
    documented = _table_names(r"[a-z]+(\.[a-z]+)?") - {t.name for t in TOOLS}
    assert documented == set(REGISTRY), (
        f"undocumented: {sorted(set(REGISTRY) - documented)}; documented but absent: {sorted(documented - set(REGISTRY))}"
    )


def test_every_tool_is_documented_and_vice_versa():
    documented = _table_names(r"shoal_[a-z_]+")
    assert documented == {t.name for t in TOOLS}


def test_every_resource_template_is_documented_and_vice_versa():
    documented = _table_names(r"shoal://.*")
    assert documented == {t.template for t in TEMPLATES}


def test_every_error_code_is_documented_and_vice_versa():
    documented = {int(c) for c in _table_names(r"-32\d\d\d")}
    assert documented == {int(c) for c in ErrorCode}
    for code in ErrorCode:
        assert code.name in PROTOCOL, code.name


def test_docs_mention_every_environment_variable_the_code_reads():
    src = Path(__file__).resolve().parent.parent / "src" / "shoal_mcp"
    names = set()
    for path in src.rglob("*.py"):
        names |= set(re.findall(r'"(SHOAL_[A-Z_]+)"', path.read_text()))
    readme = (DOCS.parent / "README.md").read_text()
    missing = sorted(n for n in names if n not in ALL_DOCS and n not in readme)
    assert not missing, f"environment variables not documented: {missing}"
