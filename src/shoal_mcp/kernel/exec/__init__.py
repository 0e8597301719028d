"""kernel/exec."""
