"""The MCP result envelope built from kernel results and errors (docs/protocol.md, Tools)."""

from __future__ import annotations

from shoal_mcp.facade.results import error_result, tool_result
from shoal_mcp.protocol.errors import RpcError
from shoal_mcp.protocol.limits import TEXT_LIMIT


def test_render_then_one_blank_line_then_the_ref():
    result = tool_result({"ref": "out:1", "uri": "shoal://out/1", "render": "hi\n", "value": {}})
    assert result["content"][0]["text"] == "hi\n\n[out:1 · shoal://out/1]"
    assert result["content"][1] == {
        "type": "resource_link",
        "uri": "shoal://out/1",
        "name": "out:1",
        "mimeType": "application/json",  # what reading shoal://out/1 returns
    }
    assert result["isError"] is False and result["structuredContent"]["ref"] == "out:1"
    assert "render" not in result["structuredContent"]  # the text carries it


def test_empty_render_is_just_the_ref():
    result = tool_result({"ref": "out:2", "uri": "shoal://out/2", "render": "", "value": {}})
    assert result["content"][0]["text"] == "[out:2 · shoal://out/2]"


def test_no_render_gives_pretty_json_and_no_link_without_uri():
    result = tool_result({"rows": [], "count": 0})
    assert result["content"][0]["text"].startswith("{\n")
    assert len(result["content"]) == 1


def test_text_is_bounded_with_a_marker_naming_the_uri():
    big = "x\n" * 100_000
    result = tool_result({"ref": "out:3", "uri": "shoal://out/3", "render": big})
    text = result["content"][0]["text"]
    assert len(text.encode()) <= TEXT_LIMIT
    assert text.endswith("fetch via shoal://out/3)")


def test_kernel_error_is_an_is_error_result_with_its_stderr():
    exc = RpcError(
        -32002,
        "command failed with exit status 1",
        {"ref": "out:4", "uri": "shoal://out/4", "status": 1, "stderr_tail": "boom\n"},
    )
    result = error_result(exc)
    assert result["isError"] is True
    assert result["structuredContent"]["error"]["code"] == -32002
    assert "boom" in result["content"][0]["text"]
    assert result["content"][1]["uri"] == "shoal://out/4"


def test_older_revisions_get_the_uri_in_the_text_only():
    from shoal_mcp.facade.versions import REVISIONS

    kernel = {"ref": "out:1", "uri": "shoal://out/1", "render": "hi\n", "value": {}}
    for name in ("2024-11-05", "2025-03-26"):
        result = tool_result(kernel, REVISIONS[name])
        assert result == {
            "content": [{"type": "text", "text": "hi\n\n[out:1 · shoal://out/1]"}],
            "isError": False,
        }
        err = error_result(RpcError(-32002, "failed", {"uri": "shoal://out/2"}), REVISIONS[name])
        assert [c["type"] for c in err["content"]] == ["text"] and "structuredContent" not in err


def test_a_binary_page_is_a_blob_and_its_metadata_is_not_repeated():
    page = {
        "ref": "out:2",
        "uri": "shoal://out/2",
        "path": ".out",
        "raw_base64": "YmluAP/+",
        "offset": 0,
        "length": 6,
        "total": 6,
    }
    result = tool_result(page)
    text, blob, link = result["content"]
    assert text["text"] == "[out:2 · shoal://out/2 · bytes 0..6 of 6]"
    assert blob == {
        "type": "resource",
        "resource": {
            "uri": "shoal://out/2?path=.out&format=raw&offset=0&length=6",
            "mimeType": "application/octet-stream",
            "blob": "YmluAP/+",
        },
    }
    assert link["type"] == "resource_link"
    assert "raw_base64" not in result["structuredContent"]
    assert result["structuredContent"]["total"] == 6


def test_a_text_page_names_its_next_page():
    page = {
        "ref": "out:3",
        "uri": "shoal://out/3",
        "raw": "ab",
        "offset": 0,
        "length": 2,
        "total": 5,
        "next": "shoal://out/3?format=raw&offset=2&length=2",
    }
    result = tool_result(page)
    assert result["content"][0]["text"] == (
        "ab\n\n[out:3 · shoal://out/3 · bytes 0..2 of 5 · "
        "next: shoal://out/3?format=raw&offset=2&length=2]"
    )
    assert "raw" not in result["structuredContent"]
