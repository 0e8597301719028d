"""kernel/events."""
