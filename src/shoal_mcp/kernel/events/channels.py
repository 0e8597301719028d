"""Channel names (docs/protocol.md, Events): which exist, which clients may publish."""

from __future__ import annotations

from typing import Any

from ...protocol import uri
from ...protocol.errors import invalid_params

MAX_CHANNEL_LEN = 256
"""Longest accepted channel name, in characters."""
CLIENT_PUBLISH_REFUSED = "only user.* channels are publishable"


# --- channel names ----------------------------------------------------------------------


def validate_channel(name: Any) -> str:
    """Return ``name`` when it is a channel, else raise -32602 (field ``channel``).

    The channels are listed in docs/protocol.md, Events; their grammar is
    ``protocol.uri.is_channel``. At most ``MAX_CHANNEL_LEN`` characters.
    """
    if not isinstance(name, str):
        raise invalid_params("channel", "must be a string")
    if not name:
        raise invalid_params("channel", "must not be empty")
    if len(name) > MAX_CHANNEL_LEN:
        raise invalid_params("channel", f"longer than {MAX_CHANNEL_LEN} characters")
    if not uri.is_channel(name):
        raise invalid_params(
            "channel",
            "unknown channel (journal, session.transcript, approval, task.N, pty.N, user.*)",
        )
    return name


def is_client_publishable(name: Any) -> bool:
    """True only for a valid ``user.*`` channel: the only ones clients may publish to."""
    return isinstance(name, str) and len(name) <= MAX_CHANNEL_LEN and uri.is_user_channel(name)


def require_client_publishable(name: Any) -> str:
    """Validate ``name`` for ``events.publish``: -32602 naming ``channel`` unless ``user.*``."""
    validate_channel(name)
    if not is_client_publishable(name):
        raise invalid_params("channel", CLIENT_PUBLISH_REFUSED)
    return name
