"""Shared pytest fixtures.

The live-process fixtures (``kernel``, ``kernel_factory``, ``short_tmp_path``) come from
the plugin ``tests/support/fixtures.py``; helpers are imported from ``tests.support``.

The framing-backend fixtures here are self-contained: every framing and truncation test
runs against both backends (docs/protocol.md, Framing). With ``SHOAL_REQUIRE_COMPILED=1`` a missing
compiled module is a loud failure, never a silent Python-only run.
"""

from __future__ import annotations

import os

import pytest

from shoal_mcp.protocol.framing import backends as _framing_backends
from tests.support.landlock import landlock_evidence

pytest_plugins = ("tests.support.fixtures",)

# Kernels started by tests read no kernel.toml of the developer's (~/.config/shoal): a
# test of the config file names its own (tests/test_cli_human.py).
os.environ["SHOAL_KERNEL_CONFIG"] = ""

FRAMING_BACKENDS = _framing_backends()
FRAMING_BACKEND_IDS = ("python", "cython")
_REQUIRE_COMPILED = os.environ.get("SHOAL_REQUIRE_COMPILED", "") not in ("", "0")


def _framing_module(name: str):
    module = FRAMING_BACKENDS.get(name)
    if module is None:
        message = (
            "the compiled framing core shoal_mcp.protocol.framing._frame is not built "
            "(pip install -e . with a C compiler, or python setup.py build_ext --inplace)"
        )
        if _REQUIRE_COMPILED:
            pytest.fail(f"SHOAL_REQUIRE_COMPILED=1 but {message}", pytrace=False)
        pytest.skip(message)
    return module


@pytest.fixture(scope="session", params=FRAMING_BACKEND_IDS)
def framing_backend(request):
    """One framing backend module (``_pure`` or ``_frame``), ids "python"/"cython"."""
    return _framing_module(request.param)


@pytest.fixture(scope="session")
def both_framing_backends():
    """(python, cython) backend modules, for differential tests."""
    return _framing_module("python"), _framing_module("cython")


# --- OS sandbox: tests marked `landlock` may not skip where Landlock exists ----------


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped `landlock` test is a failure where Landlock exists: CI must not pass
    with the sandbox tests silently skipped on a kernel that could run them."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("landlock") is not None:
        evidence = landlock_evidence()
        if evidence:
            report.outcome = "failed"
            report.longrepr = f"sandbox test skipped although {evidence}: {report.longrepr}"
