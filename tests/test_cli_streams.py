"""The CLI's rewrite of the kernel's hints into commands (shoal_mcp.cli.streams), in-process."""

from __future__ import annotations

from shoal_mcp.cli.streams import cli_hints


def test_a_raw_hint_becomes_a_raw_get_at_its_offset():
    text = (
        '… 900 bytes elided … fetch with shoal_get {"ref": "out:3", "path": ".out"} '
        "or read shoal://out/3?path=.out&format=raw&offset=100&length=49152 (raw pages; follow next)"
    )
    assert cli_hints(text) == (
        "… 900 bytes elided … see: shoal get out:3 --path .out --format raw --offset 100 "
        "(raw pages; follow next)"
    )


def test_a_percent_encoded_hint_reads_the_same():
    text = 'shoal_get {"ref": "task:2"} or read shoal://task/2/out?format=%72aw&offset=7 (raw)'
    assert cli_hints(text) == "shoal get task:2 --format raw --offset 7 (raw)"


def test_a_lines_hint_keeps_its_lines_and_drops_the_uri():
    text = (
        'fetch with shoal_get {"ref": "out:1", "path": ".out.lines[10..20]"} '
        "or read shoal://out/1?path=.out.lines[10..20] (pages of up to 64 KiB; to find lines)"
    )
    assert cli_hints(text) == "see: shoal get out:1 --lines 11..20 (to find lines)"


def test_text_that_only_looks_like_a_hint_is_not_read_as_a_raw_page():
    # The command's own output may print anything after a call: a name that is no shoal://
    # URI asks for nothing.
    text = 'shoal_get {"ref": "out:1"} or read shoal://nothing?format=raw&offset=5 tail'
    assert cli_hints(text) == "shoal get out:1 tail"
