"""Official SDK clients of several versions against a real shoal-mcp (issue 16).

Each client (tests/sdk_clients) runs one session: exec, get, a resource read,
subscribe/unsubscribe with an update in between, and a cancel. Python SDK 1.9 (asks for
2025-03-26: no resource_link may reach it) and 2.x (2025-11-25), TypeScript SDK 1.12
(2025-03-26; rejected every result with a resource_link before) and the current 1.x. Each
SDK is installed once into a cache by tests/sdk_clients/install.py (``.ci/run`` runs it
first); the TypeScript ones run where ``node`` is installed. The Python SDK 2.3 and the
TypeScript SDK v2 (``@modelcontextprotocol/client`` 2.4) also run in their 2026-07-28
mode (``*_modern_client.*``: server/discover, no initialize, an approval accepted and one
declined through their elicitation handlers).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sdk_clients import install
from tests.support.approving import approving_kernel
from tests.support.facade import facade_env
from tests.support.polling import wait_until
from tests.support.procfs import kill_pids, pids_with_arg

CLIENTS = Path(__file__).resolve().parent / "sdk_clients"
SESSION_TIMEOUT_S = 120
# (SDK, the revision it negotiates with shoal)
MATRIX = [
    ("py-1.9", "2025-03-26"),
    ("py-2", "2025-11-25"),
    pytest.param(
        "ts-1.12",
        "2025-03-26",
        marks=pytest.mark.skipif(not shutil.which("node"), reason="node is not installed"),
    ),
    pytest.param(
        "ts-1",
        "2025-11-25",
        marks=pytest.mark.skipif(not shutil.which("node"), reason="node is not installed"),
    ),
]


def _client_argv(sdk: str, modern: bool = False) -> list[str]:
    """argv of the session script for ``sdk`` (``modern``: its 2026-07-28 one)."""
    if sdk.startswith("py-"):
        name = "python_modern_client.py" if modern else "python_client.py"
        return [str(install.python_sdk(sdk)), str(CLIENTS / name)]
    name = "ts_modern_client.mjs" if modern else "ts_client.mjs"
    prefix = install.ts_sdk(sdk)
    script = prefix / name  # next to its node_modules, so the import resolves
    shutil.copyfile(CLIENTS / name, script)
    return ["node", str(script)]


@pytest.mark.parametrize(("sdk", "revision"), MATRIX)
def test_an_sdk_client_session(kernel, sdk, revision):
    marker = f"30.{random.randrange(10**6):06d}"
    argv = _client_argv(sdk)
    try:
        done = subprocess.run(
            [*argv, sys.executable, marker],
            env=facade_env(kernel, f"sdk-{sdk}"),
            capture_output=True,
            text=True,
            timeout=SESSION_TIMEOUT_S,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        # The cancelled sleep is gone long before its 30 s.
        wait_until(lambda: not pids_with_arg(marker), timeout=15, what="the cancelled sleep to end")
    finally:
        kill_pids(pids_with_arg(marker))
    if "protocol" in seen:
        assert seen["protocol"] == revision
    modern = revision >= "2025-06-18"
    assert seen["exec_error"] is False
    assert seen["exec_text"][0].startswith("hi\n") and "shoal://out/1" in seen["exec_text"][0]
    assert ("resource_link" in seen["exec_types"]) is modern, seen["exec_types"]
    assert seen["get_text"][0].startswith("hi\n")
    assert seen["read"] == [
        {"uri": "shoal://out/1?format=render", "mimeType": "text/plain", "text": "hi\n"}
    ]
    assert seen["updates"] >= 1
    assert seen["after_cancel"][0].startswith("after-cancel\n")


MODERN_MATRIX = [
    "py-2",
    pytest.param(
        "ts-2", marks=pytest.mark.skipif(not shutil.which("node"), reason="node is not installed")
    ),
]


@pytest.mark.parametrize("sdk", MODERN_MATRIX)
def test_an_sdk_in_2026_07_28_mode_approves_and_declines(sdk):
    """Python SDK 2.3 and TypeScript SDK 2.4 in their auto mode: ``server/discover``
    (no fallback to initialize), then MRTR approvals through their elicitation handlers:
    the approved command ran, the declined one did not."""
    with approving_kernel("shsd") as (kernel, token, _tmp):
        done = subprocess.run(
            [*_client_argv(sdk, modern=True), sys.executable],
            env=facade_env(kernel, f"sdk-modern-{sdk}", SHOAL_TOKEN=token),
            capture_output=True,
            text=True,
            timeout=SESSION_TIMEOUT_S,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if sdk == "py-2":
        assert seen["sdk"].startswith("2.3"), seen["sdk"]
    assert seen["protocol"] == "2026-07-28" and seen["server"] == "shoal"
    assert "shoal_exec" in seen["tools"] and seen["exec_text"][0].startswith("hi\n")
    approved_word, declined_word = (
        ("sdk-approved", "sdk-declined") if sdk == "py-2" else ("ts-approved", "ts-declined")
    )
    assert len(seen["asked"]) == 2 and f"basename /x/{approved_word}" in seen["asked"][0]
    assert seen["approved"]["isError"] is False
    assert seen["approved"]["text"][0].startswith(f"{approved_word}\n")
    assert seen["declined"]["isError"] is True
    assert "denied by the user" in seen["declined"]["text"][0]
    assert declined_word + "\n" not in seen["declined"]["text"][0]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
