"""The session's lifecycle: what ``initialize`` settled, and whose revision a request has.

A handshake-era client names its revision once (``initialize``, negotiated in
``versions``); a 2026-07-28 request names its own in ``_meta``, and the one being served
is kept in a ContextVar (``CURRENT``) by whoever serves it. ``initialize`` and
``server/discover`` answer with the instructions the model reads: what shoal is and who
its commands run as.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from typing import Any

from .. import __version__
from .kernel_link import KernelLink
from .modern import discover_result
from .versions import LATEST, RequestContext, Revision, negotiate

CURRENT: ContextVar[RequestContext | None] = ContextVar("mcp_request", default=None)
"""The context of the request being served on this thread (None outside a request)."""

INSTRUCTIONS = (
    "shoal is a bash shell whose output never floods your context. shoal_exec runs a command and "
    "returns a bounded preview (first and last lines) plus a ref like out:3. Fetch exactly what you "
    "need with shoal_get (path .out.lines[-50..], .err, .out.json.field) instead of re-running "
    "commands with head/tail. cd and export persist. Long jobs: background:true, then shoal_get "
    "task:N with wait_ms."
)
AGENT_INSTRUCTIONS = (
    " Your commands run as the sandboxed agent {principal}: they read what the user can "
    "read except secrets (keys, credentials, histories), write only in the project "
    "({project}), $TMPDIR and ~/.cache, and have no network. A command the sandbox "
    "refused says so in sandbox_denied; to do it, plan it (shoal_plan) and ask the human "
    "with shoal_cap_request."
)
UNCONFINED_INSTRUCTIONS = (
    " Your commands run unconfined, as the local user (shoal-mcp --unconfined: the user "
    "opted out of the sandbox)."
)
TOKEN_INSTRUCTIONS = " Your commands run as the principal of SHOAL_TOKEN, under its policy."


def instructions(link: object) -> str:
    """What ``initialize`` tells the model, including who its commands run as."""
    from ..protocol.discovery import project_root
    from ..protocol.limits import AGENT_PRINCIPAL

    host = getattr(link, "host", None)
    if host is not None:
        return remote_instructions(link, host.label)
    if getattr(link, "token", None):
        return INSTRUCTIONS + TOKEN_INSTRUCTIONS
    if getattr(link, "unconfined", False):
        return INSTRUCTIONS + UNCONFINED_INSTRUCTIONS
    project = project_root(os.getcwd()) or "none: started outside a project"
    return INSTRUCTIONS + AGENT_INSTRUCTIONS.format(principal=AGENT_PRINCIPAL, project=project)


REMOTE_INSTRUCTIONS = (
    "\n\nEvery command runs on the host {host}, reached over ssh: its files, sessions, "
    "tasks and PTYs, not this machine's. Refs and shoal:// URIs in these results belong to "
    "that host's kernel."
)


def remote_instructions(link: object, host: str) -> str:
    """The instructions for a facade on another host's kernel (no local project there)."""
    from ..protocol.limits import AGENT_PRINCIPAL

    if getattr(link, "token", None):
        who = TOKEN_INSTRUCTIONS
    elif getattr(link, "unconfined", False):
        who = UNCONFINED_INSTRUCTIONS
    else:
        directory = getattr(link, "remote_dir", None)
        project = (
            f"{directory} on that host, or the git work tree holding it"
            if directory
            else "none on that host"
        )
        who = AGENT_INSTRUCTIONS.format(principal=AGENT_PRINCIPAL, project=project)
    return INSTRUCTIONS + who + REMOTE_INSTRUCTIONS.format(host=host)


class Lifecycle:
    """The revision, capabilities and name a client gave at ``initialize`` (none before)."""

    def __init__(self, link: KernelLink) -> None:
        self.link = link
        self.revision: Revision | None = None
        self.client_capabilities: dict = {}
        self.client_info: dict = {}

    def rev(self) -> Revision:
        """The revision of the request being served: its own (2026-07-28), else the
        negotiated one (our latest before ``initialize``)."""
        ctx = CURRENT.get()
        return ctx.revision if ctx is not None else self.revision or LATEST

    def context(self) -> RequestContext:
        """The request being served's context (the session's, outside a request)."""
        return CURRENT.get() or self.session_context()

    def session_context(self) -> RequestContext:
        """The context a request that names no revision of its own is served under."""
        return RequestContext(self.revision or LATEST, self.client_capabilities)

    def initialize(self, params: dict) -> dict:
        rev = negotiate(params.get("protocolVersion"))
        self.revision = rev
        caps = params.get("capabilities")
        self.client_capabilities = caps if isinstance(caps, dict) else {}
        info = params.get("clientInfo")
        self.client_info = info if isinstance(info, dict) else {}
        self.link.client_info = self.client_info
        self.link.attach_soon()
        capabilities: dict[str, Any] = {
            "tools": {"listChanged": False},
            "resources": {"subscribe": True, "listChanged": False},
            "logging": {},
        }
        if rev.tasks:
            capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        server_info = {"name": "shoal", "version": __version__}
        if self.link.host is not None:
            server_info["host"] = self.link.host.label  # whose kernel the refs belong to
        if rev.titles:
            server_info["title"] = "shoal shell"
        return {
            "protocolVersion": rev.name,
            "capabilities": capabilities,
            "serverInfo": server_info,
            "instructions": instructions(self.link),
        }

    def discover(self, params: dict) -> dict:
        """``server/discover`` (every revision): what 2026-07-28 clients probe first."""
        return discover_result(instructions(self.link))
