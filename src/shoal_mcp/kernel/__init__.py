"""The shoal kernel: a per-user daemon that runs commands and keeps their results."""
