"""value.get and blob.get."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from ....protocol import uri
from ....protocol.limits import ELIDE_MAX_BYTES_RAW, VALUE_HARD_CAP
from ....protocol.params import BLOB_GET, VALUE_GET
from ...values.elision import ElideOptions
from ...values.service import RAW_PAGE_RESERVE
from ..registry import method

if TYPE_CHECKING:
    from ..server import Call

# Any page size may be asked for; it is clamped to what encodes under the hard cap.


@method("value.get", VALUE_GET)
def value_get(call: Call, params: dict) -> dict:
    kernel = call.kernel
    elide = ElideOptions.from_params(params.get("elide"))
    sel = kernel.values.select(call.who, params["ref"], params.get("path"), params.get("slice"))
    fmt = params.get("format", "json")
    out: dict[str, Any] = {"ref": sel.ref, "uri": sel.base_uri}
    if sel.path:
        from ...values.selectors import format_path

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
