"""The world of the egress proxy's live tests (issue 27): stand-in hosts on loopback.

A kernel (``--sandbox required``) whose proxy resolves the test names
(:data:`NAMES`) to 127.0.0.1 (``SHOAL_NET_RESOLVE``), a policy allowing some of them to
the default agent, a local HTTP server per stand-in (its files: a directory the test
fills), and a facade attached as the default agent.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.facade import RawFacade, facade_env
from tests.support.kernel import KernelProcess
from tests.support.tmp import short_tmp


def expected_enforced() -> dict | bool:
    """``caps.enforced`` a kernel reports for a sandboxed tree here: the probe's findings,
    with the network the egress proxy's where namespaces work (issue 27)."""
    from shoal_mcp.kernel.access import sandbox_probe

    enforced = sandbox_probe.probe().enforced()
    if isinstance(enforced, dict) and "ns" in enforced:
        return {**enforced, "net": "proxy+netns"}
    return enforced


NAMES = ("allowed.test", "denied.test", "only443.test", "pkg.test", "git.test", "asked.test")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        pass


@contextmanager
def http_server(root: Path) -> Iterator[int]:
    """A threaded HTTP server of ``root`` on 127.0.0.1; yields its port."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class EgressWorld:
    kernel: KernelProcess
    facade: RawFacade
    tmp: Path
    www: Path
    port: int
    proj: Path

    def exec(self, command: str, timeout: float = 120.0) -> dict:
        """``shoal_exec`` as the default agent: its structured result, with ``_text``."""
        reply = self.facade.tool("shoal_exec", {"command": command}, timeout)
        assert "result" in reply, reply
        text = "".join(c.get("text", "") for c in reply["result"]["content"])
        return {**reply["result"]["structuredContent"], "_text": text}

    def human(self):
        return self.kernel.client(f"human-{os.getpid()}")


def policy_text(port: int) -> str:
    allow = [f"allowed.test:{port}", "only443.test:443", f"pkg.test:{port}", f"git.test:{port}"]
    return (
        f'[principal."agent:mcp".net]\nallow = {allow!r}\n'.replace("'", '"')
        + 'deny = ["denied.test"]\n'
    )


@contextmanager
def egress_world(prefix: str = "shnet") -> Iterator[EgressWorld]:
    with short_tmp(prefix) as tmp:
        www = tmp / "www"
        www.mkdir()
        (www / "hello.txt").write_text("hello through the proxy\n")
        proj = tmp / "proj"
        proj.mkdir()
        with http_server(www) as port:
            policy = tmp / "policy.toml"
            policy.write_text(policy_text(port))
            resolve = ",".join(f"{n}=127.0.0.1" for n in NAMES)
            kernel = KernelProcess(
                tmp, "--sandbox", "required", "--policy", str(policy),
                env={"SHOAL_NET_RESOLVE": resolve},
            )  # fmt: skip
            kernel.start()
            facade = RawFacade(facade_env(kernel, session=f"net-{prefix}", agent=True), cwd=proj)
            try:
                facade.initialize()
                yield EgressWorld(kernel, facade, tmp, www, port, proj)
            finally:
                facade.close()
                kernel.stop()
