"""Channel names (docs/protocol.md, Events): which exist, which clients may publish."""

from __future__ import annotations

import re
from typing import Any

from ...protocol.errors import invalid_params

MAX_CHANNEL_LEN = 256
"""Longest accepted channel name, in characters."""
CLIENT_PUBLISH_REFUSED = "only user.* channels are publishable"
_CHANNEL_RE = re.compile(
    r"journal|session\.transcript|approval"
    r"|(?:task|pty)\.(?:0|[1-9][0-9]*)"
    r"|user\.[A-Za-z0-9._:@+=~-]+"
)


# --- channel names ----------------------------------------------------------------------


def validate_channel(name: Any) -> str:
    """Return ``name`` when it is a channel, else raise -32602 (field ``channel``).

    The channels are listed in docs/protocol.md, Events.

    Accepted: ``journal``, ``session.transcript``, ``approval``, ``task.N``, ``pty.N``
    (N a decimal integer without leading zeros) and ``user.<suffix>`` where the suffix is
    1+ characters of ``A-Z a-z 0-9 . _ : @ + = ~ -`` (URI-safe, so ``shoal://events/{channel}``
    needs no escaping). At most ``MAX_CHANNEL_LEN`` characters.
    """
    if not isinstance(name, str):
        raise invalid_params("channel", "must be a string")
    if not name:
        raise invalid_params("channel", "must not be empty")
    if len(name) > MAX_CHANNEL_LEN:
        raise invalid_params("channel", f"longer than {MAX_CHANNEL_LEN} characters")
    if _CHANNEL_RE.fullmatch(name) is None:
        raise invalid_params(
            "channel",
            "unknown channel (journal, session.transcript, approval, task.N, pty.N, user.*)",
        )
    return name


def is_client_publishable(name: Any) -> bool:
    """True only for a valid ``user.*`` channel: the only ones clients may publish to."""
    return (
        isinstance(name, str)
        and name.startswith("user.")
        and len(name) <= MAX_CHANNEL_LEN
        and _CHANNEL_RE.fullmatch(name) is not None
    )


def require_client_publishable(name: Any) -> str:
    """Validate ``name`` for ``events.publish``: -32602 naming ``channel`` unless ``user.*``."""
    validate_channel(name)
    if not is_client_publishable(name):
        raise invalid_params("channel", CLIENT_PUBLISH_REFUSED)
    return name
