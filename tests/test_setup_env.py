"""One variable for "no extension": SHOAL_PURE_PYTHON=1 also skips the build (setup.py).

setup.py runs in a child with ``setuptools.setup`` and Cython's ``cythonize`` replaced by
recorders, so the test sees which extensions a build would compile without compiling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_PROBE = """
import json, runpy, sys, types
import setuptools

seen = {}
setuptools.setup = lambda **kw: seen.update(ext=[e.name for e in kw.get("ext_modules", [])])
cython = types.ModuleType("Cython")
build = types.ModuleType("Cython.Build")
build.cythonize = lambda exts, **kw: list(exts)
cython.Build = build
sys.modules.update({"Cython": cython, "Cython.Build": build})
runpy.run_path("setup.py", run_name="__main__")
print(json.dumps(seen["ext"]))
"""


def extensions_built(value: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_PURE_PYTHON"}
    if value is not None:
        env["SHOAL_PURE_PYTHON"] = value
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("value", [None, "", "0"])
def test_the_extension_is_built_by_default(value: str | None) -> None:
    assert extensions_built(value) == ["shoal_mcp.protocol.framing._frame"]


@pytest.mark.parametrize("value", ["1", "yes"])
def test_shoal_pure_python_skips_the_extension(value: str) -> None:
    assert extensions_built(value) == []
