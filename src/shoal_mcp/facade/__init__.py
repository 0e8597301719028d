"""``shoal-mcp``: the MCP stdio facade. It evaluates nothing; the kernel does."""
