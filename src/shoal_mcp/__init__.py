"""shoal: a shell for AI agents that cannot flood their context."""

__version__ = "0.2.0"
