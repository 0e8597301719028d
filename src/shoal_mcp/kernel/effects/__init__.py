"""kernel/effects."""
