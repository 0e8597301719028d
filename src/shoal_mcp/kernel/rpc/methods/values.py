"""value.get and blob.get."""

from __future__ import annotations

import base64

from ....protocol import uri
from ....protocol.limits import ELIDE_MAX_BYTES_RAW, VALUE_HARD_CAP
from ...values.elision import ELIDE_SCHEMA, ElideOptions
from ...values.service import RAW_PAGE_RESERVE
from ..registry import REF, method, obj

SLICE = {
    "type": ["array", "string"],
    "description": "[a, b] (either may be null) or 'a..b'",
    "items": {"type": ["integer", "null"]},
    "minItems": 2,
    "maxItems": 2,
}
OFFSET = {"type": "integer", "minimum": 0}
# Any page size may be asked for; it is clamped to what encodes under the hard cap.
LENGTH = {"type": "integer", "minimum": 1}


@method(
    "value.get",
    obj(
        {
            "ref": REF,
            "path": {"type": "string", "maxLength": 1024},
            "slice": SLICE,
            "format": {"type": "string", "enum": ["json", "render", "raw"]},
            "elide": ELIDE_SCHEMA,
            "offset": OFFSET,
            "length": LENGTH,
            "with_render": {
                "type": "boolean",
                "description": "json format: also return the render",
            },
        },
        ("ref",),
    ),
)
def value_get(call, params):
    kernel = call.kernel
    elide = ElideOptions.from_params(params.get("elide"))
    sel = kernel.values.select(call.who, params["ref"], params.get("path"), params.get("slice"))
    fmt = params.get("format", "json")
    out = {"ref": sel.ref, "uri": sel.base_uri}
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


@method(
    "blob.get",
    obj(
        {
            "hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            "offset": OFFSET,
            "length": LENGTH,
        },
        ("hash",),
    ),
)
def blob_get(call, params):
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
