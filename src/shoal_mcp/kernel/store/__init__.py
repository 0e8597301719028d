"""kernel/store."""
