"""Shared pytest fixtures.

The framing-backend fixtures come first and are self-contained: every framing and
truncation test runs against both backends (SPEC §3.5). With
``SHOAL_REQUIRE_COMPILED=1`` a missing compiled module is a loud failure, never a
silent Python-only run. (Other fixtures go below this block.)
"""

from __future__ import annotations

import os

import pytest

from shoal_mcp.protocol.framing import backends as _framing_backends

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


# --- other fixtures below ---------------------------------------------------------------


# --- OS sandbox: tests marked `landlock` may not skip where Landlock exists ----------


def landlock_evidence() -> str | None:
    """Why this machine has Landlock (ABI query, securityfs, or SHOAL_REQUIRE_LANDLOCK=1),
    or None.  Sandbox tests skip only when this is None."""
    from shoal_mcp.kernel.access import landlock

    try:
        return f"Landlock ABI {landlock.abi_version()}"
    except landlock.LandlockUnavailable:
        pass
    if os.path.exists("/sys/kernel/security/landlock"):
        return "/sys/kernel/security/landlock exists"
    try:
        with open("/sys/kernel/security/lsm") as fh:
            if "landlock" in fh.read().split(","):
                return "/sys/kernel/security/lsm lists landlock"
    except OSError:
        pass
    if os.environ.get("SHOAL_REQUIRE_LANDLOCK", "") not in ("", "0"):
        return "SHOAL_REQUIRE_LANDLOCK is set"
    return None


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
