"""What resolving a ``task:N`` ref needs of the running tasks, as an interface.

``values/`` sits below ``exec/`` (the exec service stores and shapes values), so it names
no exec class: these protocols say what it reads of a task, and the exec side's
``TaskManager`` and ``Task`` satisfy them (checked where ``kernel/app.py`` wires them).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol


class LiveRun(Protocol):
    """A task's running command: where its output spools while it runs."""

    @property
    def out_path(self) -> Path: ...

    @property
    def err_path(self) -> Path: ...

    @property
    def pid(self) -> int: ...

    @property
    def cwd(self) -> str: ...


class TaskView(Protocol):
    """One task as a value ref reads it: its stored outcome once finished, else its run."""

    @property
    def id(self) -> int: ...

    @property
    def ref(self) -> str: ...

    @property
    def src(self) -> str: ...

    @property
    def run(self) -> LiveRun: ...

    @property
    def done(self) -> threading.Event: ...

    @property
    def result(self) -> dict[str, Any] | None:
        """What the exec returned once finished (``ref`` names its stored ``out:N``)."""
        ...


class TaskLookup(Protocol):
    """The tasks a caller may name (``TaskManager`` is one)."""

    def get(self, task_id: int, session: str, principal: str) -> TaskView:
        """The task ``task_id`` of ``session`` run by ``principal`` (``UNKNOWN_TASK`` when none)."""
        ...
