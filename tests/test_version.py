"""The package says 0.2 everywhere a person or a client reads a version (issue 31: it
still said 0.1.0): the CLI, the facade, and the kernel's ``ping``."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.kernel import close_client
from tests.test_cli import CLI

VERSION = re.compile(r"\b0\.2\.\d+\b")


def test_cli_facade_and_kernel_say_0_2(kernel):
    cli = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=60)
    facade = subprocess.run(
        [sys.executable, "-m", "shoal_mcp.facade", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert VERSION.search(cli.stdout), cli.stdout
    assert VERSION.search(facade.stdout), facade.stdout
    c = kernel.client("version")
    try:
        assert VERSION.fullmatch(c.call("ping", {}, 10)["kernel"]["version"])
    finally:
        close_client(c)
