"""value.get and blob.get."""

from __future__ import annotations

import base64
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from ....protocol import uri
from ....protocol.errors import invalid_params
from ....protocol.limits import VALUE_HARD_CAP
from ....protocol.params import BLOB_GET, VALUE_GET
from ....protocol.schema import validate
from ...config.limits import ELIDE_MAX_BYTES_RAW
from ...values.elision import ElideOptions
from ...values.find_reply import is_outputs_ref, refuse_find_params
from ...values.match import MatchSpec
from ...values.resolver import LinesView, json_slot
from ...values.selectors import format_path
from ...values.service import RAW_PAGE_RESERVE
from ..registry import method

if TYPE_CHECKING:
    from ..call import Call

# Any page size may be asked for; it is clamped to what encodes under the hard cap.


def with_uri_query(params: dict) -> dict:
    """``params`` with what a ``shoal://`` ref's query says, where params do not say it.

    A URI taken from a hint is the whole call: its format, offset, length, slice and
    match hold (its path is applied when the ref resolves; an explicit ``path`` param is
    appended to it).
    """
    ref = params["ref"].strip()
    if not ref.startswith(uri.SCHEME):
        return params
    try:
        query = uri.parse_uri(ref).query
    except uri.BadName:
        return params  # resolving the ref answers -32004 for it
    try:
        from_query = uri.value_params(query)
    except uri.BadName as exc:
        raise invalid_params("ref", str(exc)) from None
    if not from_query:
        return params
    merged = {**from_query, **params}
    validate(merged, VALUE_GET)  # a URI query is checked like the params it stands for
    return merged


@method("value.get", VALUE_GET, blocking=True)
def value_get(call: Call, params: dict) -> dict:
    params = with_uri_query(params)
    if is_outputs_ref(params["ref"]):  # find across runs (docs/protocol.md, Find)
        return call.kernel.values.find(call.who, params)
    refuse_find_params(params)
    # A `.json` selection holds a parse slot until its reply is built: the parsed tree
    # lives that long, and the slots bound how many such trees exist at once.
    parses = ".json" in params["ref"] + (params.get("path") or "")
    with json_slot(wait=True) if parses else nullcontext():
        return _value_get(call, params)


def _value_get(call: Call, params: dict) -> dict:
    kernel = call.kernel
    elide = ElideOptions.from_params(params.get("elide"))
    sel = kernel.values.select(call.who, params["ref"], params.get("path"), params.get("slice"))
    if "match" in params:
        return kernel.values.match(sel, MatchSpec.from_param(params["match"]))
    fmt = params.get("format", "json")
    if fmt == "json" and params.get("with_render") and isinstance(sel.node, LinesView):
        fmt = "render"  # shoal_get's default for a line range: a page of text, not a ref
    out: dict[str, Any] = {"ref": sel.ref, "uri": sel.base_uri}
    if sel.path:
        out["path"] = format_path(sel.path)
    if fmt == "render":
        out["render"] = kernel.values.render(sel, elide)
    elif fmt == "raw":
        out.update(kernel.values.raw(sel, params.get("offset", 0), params.get("length"), elide))
    else:
        out["value"] = kernel.values.encode(sel, elide)
        if params.get("with_render"):
            out["render"] = kernel.values.render(sel, elide)
    return out


@method("blob.get", BLOB_GET)
def blob_get(call: Call, params: dict) -> dict:
    kernel = call.kernel
    info = kernel.cas.info(params["hash"])
    kernel.check_blob_access(call.who, info.hash)
    offset = min(params.get("offset", 0), info.size)
    # base64 grows 4/3: the whole reply (hash, next URI included) stays under the hard cap.
    length = min(
        params.get("length", ELIDE_MAX_BYTES_RAW), (VALUE_HARD_CAP - RAW_PAGE_RESERVE) * 3 // 4
    )
    data = kernel.cas.read_range(info.hash, offset, offset + length)
    out = {
        "hash": info.hash,
        "offset": offset,
        "length": len(data),
        "total": info.size,
        "base64": base64.b64encode(data).decode("ascii"),
    }
    if offset + len(data) < info.size:
        out["next"] = uri.val_uri(info.hash, offset + len(data), length)
    return out
