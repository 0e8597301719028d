"""kernel/access."""
