"""kernel/pty."""
