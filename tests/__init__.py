"""shoal's test suite. A package so that ``tests.support`` and ``bench`` import by name."""
