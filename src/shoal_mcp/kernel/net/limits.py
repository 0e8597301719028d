"""The egress proxy's knobs, in one place (kernel-only: no client sees them).

Budgets are per principal: one agent that opens many connections or stalls its reads
cannot starve another's.
"""

from __future__ import annotations

BRIDGE_PORT = 3128
"""The loopback port a sandboxed tree reaches the proxy on, inside its own network
namespace (HTTP CONNECT, plain HTTP and SOCKS5 on the same port)."""
BRIDGE_HOST = "127.0.0.1"
MAX_HEAD_BYTES = 16 * 1024
"""An HTTP request head (request line and headers) or a SOCKS5 greeting larger than this
is refused (431 / the SOCKS connection closed)."""
MAX_CONNECTIONS_PER_PRINCIPAL = 64
"""Open proxied connections per principal; one more is refused (HTTP 429 / SOCKS 0x01)."""
RELAY_CHUNK_BYTES = 1 << 20
"""Bytes spliced at once per direction: the pipe each relayed direction holds."""
MAX_RELAYS = 256
"""Connections relayed at once, all principals together (six descriptors each: two
sockets, two pipes); one more is refused (HTTP 429 / SOCKS 0x01), as past the
per-principal bound."""
HEAD_TIMEOUT_S = 30.0
"""A client that sends no complete request head within this long is closed."""
CONNECT_TIMEOUT_S = 10.0
"""Connecting to the destination (each resolved address in turn) gives up after this."""
CLOSE_WAIT_S = 5.0
"""Kernel exit: how long the proxy waits for its connections to be dropped."""
RESOLVE_ENV = "SHOAL_NET_RESOLVE"
"""Test and development aid: ``host=addr,host2=addr2`` names the proxy resolves to these
addresses instead of asking DNS (and treats as named by the policy: a stand-in on
loopback is reachable).  docs/configuration.md."""
DEFAULT_PORTS = (80, 443)
"""Ports a ``net.allow`` entry without ``:port`` covers."""
REFUSALS_KEPT = 256
"""Recent refusals kept in memory per principal, for the exec reply's ``sandbox_denied``."""
