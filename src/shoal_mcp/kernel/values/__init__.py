"""kernel/values."""
