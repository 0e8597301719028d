"""The pytest plugin of shared fixtures (registered by ``tests/conftest.py``).

- ``kernel``: one live kernel per test module (tests use distinct sessions to stay apart);
- ``kernel_factory``: kernels started on demand in the test's ``tmp_path``, all stopped;
- ``short_tmp_path``: a short directory under /tmp for sockets, removed afterwards.

A module that needs a kernel of its own kind (flags, a fresh one per test) defines its own
``kernel`` fixture, which overrides this one for that module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .kernel import KernelProcess, running_kernel
from .procfs import kill_pids, pids_with_arg, sleep_marker
from .tmp import short_tmp


@pytest.fixture(scope="module")
def kernel() -> Iterator[KernelProcess]:
    """One ready kernel for a whole test module."""
    with running_kernel() as k:
        yield k


@pytest.fixture
def kernel_factory(tmp_path: Path) -> Iterator[Callable[..., KernelProcess]]:
    """``make(*args, start=True, wait=True, sub="")``: a kernel in ``tmp_path`` (or
    ``tmp_path/sub``); the same dir means the same socket and state. All are stopped."""
    started: list[KernelProcess] = []

    def make(*args: str, start: bool = True, wait: bool = True, sub: str = "") -> KernelProcess:
        k = KernelProcess(tmp_path / sub if sub else tmp_path, *args)
        started.append(k)
        if start:
            k.start(wait=wait)
        return k

    yield make
    for k in started:
        try:
            k.stop()
            k.release_pipes()
        except Exception:  # noqa: BLE001 - best effort teardown
            pass


@pytest.fixture
def short_tmp_path() -> Iterator[Path]:
    """A fresh directory directly under /tmp (short enough for a socket), removed after."""
    with short_tmp() as path:
        yield path


@pytest.fixture
def marks() -> Iterator[list[str]]:
    """Three ``sleep_marker`` values for a test's escaping children; whatever a failed
    test left running with them is killed afterwards."""
    made = [sleep_marker() for _ in range(3)]
    yield made
    for m in made:
        kill_pids(pids_with_arg(m))
