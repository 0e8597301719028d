"""A method's answer as a JSON-RPC message, whatever the handler did: never a traceback.

One rule for every place that runs a handler (a worker, or the owner loop for an exec):
its result, its ``RpcError`` as an error, anything
else as -32603 naming the method and the exception, logged with its traceback here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...protocol.errors import ErrorCode, RpcError
from ...protocol.jsonrpc import Request, error_response, response
from ...protocol.schema import split_unknown, validate

if TYPE_CHECKING:
    from .call import Call
    from .registry import MethodSpec

log = logging.getLogger(__name__)


def answer_of(method: str, msg_id: Any, produce: Callable[[], Any]) -> dict:
    """The reply to request ``msg_id`` whose result ``produce()`` makes."""
    try:
        return response(msg_id, produce())
    except RpcError as exc:
        return error_response(msg_id, exc.code, exc.message, exc.data)
    except Exception as exc:  # noqa: BLE001 - never a traceback to the client
        log.exception("method %s failed", method)
        return error_response(
            msg_id,
            ErrorCode.INTERNAL,
            f"internal error in {method}: {type(exc).__name__}: {exc}"[:500],
        )


def with_ignored(result: Any, ignored: list[str] | None) -> Any:
    """A result that names the params its call ignored (unknown ones), if any."""
    if ignored and isinstance(result, dict):
        return {**result, "ignored_params": ignored}
    return result


def answer(call: Call, spec: MethodSpec, msg: Request) -> dict:
    """The reply to ``msg``: its params checked against ``spec``'s schema, then the
    handler's result (naming the params it ignored) or its failure."""

    def produce() -> Any:
        params = msg.params if isinstance(msg.params, dict) else None
        if params is None:
            raise RpcError(ErrorCode.INVALID_PARAMS, "invalid params: params must be an object")
        checked, ignored = split_unknown(params, spec.schema)
        validate(checked, spec.schema)
        return with_ignored(spec.func(call, checked), ignored)

    return answer_of(spec.name, msg.id, produce)
