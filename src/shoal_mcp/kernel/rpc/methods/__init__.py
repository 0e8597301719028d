"""Kernel method handlers, one module per area; importing this registers them all."""

from . import admin, egress, events, exec, plans, pty, session, store, tasks, values  # noqa: F401 - registration
