"""Helpers for shoal's tests (no tests here); each helper lives in exactly one module.

Live tests drive real processes: a ``shoal-kernel`` on a temporary socket and state dir,
``shoal-mcp`` over pipes, the ``shoal`` CLI. No mocks of the kernel, its database or the
terminal emulator.

- ``kernel``: ``KernelProcess``, ``running_kernel``, ``child_env``, ``close_client``
- ``wire``: raw newline-delimited JSON-RPC: ``jsonrpc_frame``, ``RawConn`` (the kernel
  socket without the client library) and checks on frames (``jsonrpc_problems``, ...)
- ``facade``: ``shoal-mcp`` over raw pipes: ``McpClient`` (``request`` returns the reply,
  ``send`` the id, ``read_reply(id)`` the answer), kept in order (``RawFacade``) or by id
  (``McpPipe``); ``facade_env``
- ``sdk_client``: ``shoal-mcp`` through the official MCP SDK (``McpStdioClient``)
- ``results``: reading shoal results (``structured``, ``wire_text``, ``out_text``, ``call_err``)
- ``procfs``: ``/proc`` readings (children, fds, threads, memory, process groups, argv)
- ``polling``: ``wait_until``
- ``tmp``: ``short_tmp`` (AF_UNIX socket paths must stay short)
- ``other_uid``: ``exchange_as_uid`` (a connection from another uid)
- ``budgets``: ``token_kernel`` (no-grant token principals, small budgets) for the budget
  tests and the soak bench
- ``fixtures``: the pytest plugin ``tests/conftest.py`` registers (``kernel``,
  ``kernel_factory``, ``short_tmp_path``)
- ``framing_vectors``, ``fuzz_targets``: the framing oracles and the fuzz targets
- ``curses_box``: a program the PTY tests run

The mixed-load driver (``FacadeLoad``, ``run_load``) lives in ``bench/loadgen.py``; the
load bench and ``tests/test_reliability_load.py`` both import it from there.

This package imports nothing on its own: ``bench/fuzz_frames.py`` instruments
``tests.support.fuzz_targets`` and must not pull in the rest.
"""
