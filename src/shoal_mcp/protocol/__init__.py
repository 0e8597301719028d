"""protocol."""
