"""The kernel's administration: its config file (kernel.toml) and whether its own package
changed on disk since it started."""
