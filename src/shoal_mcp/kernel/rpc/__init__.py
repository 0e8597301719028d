"""kernel/rpc."""
