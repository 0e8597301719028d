"""What the kernel runs with when nothing says otherwise: its limits, defaults and tuning
knobs (``limits``). The config file that overrides some of them is read by
``admin/config_file.py``; the egress proxy keeps its own knobs in ``net/limits.py``."""
