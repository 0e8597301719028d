"""The kernel's owner loop: one thread that owns fd readiness and timers (issue 30)."""
