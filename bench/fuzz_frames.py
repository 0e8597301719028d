"""Dedicated fuzz run of the frame reader + JSON-RPC layer (issue #9).

    python bench/fuzz_frames.py --executions 1000000            # atheris when installed
    python bench/fuzz_frames.py --engine mutate --executions 1000000 --seed 7

The target is ``tests/support/fuzz_targets.one_input``: both framing backends (compiled and
pure Python) frame the input under a chunking chosen by the input and are compared
with a reference model of the rules in docs/protocol.md, Framing; every frame and
oversize head then goes through ``parse_message`` / ``recover_id`` / ``oversize_reply``
with their invariants.

Engines:
* ``atheris`` — coverage-guided libFuzzer over the instrumented Python layer
  (``shoal_mcp.protocol.jsonrpc``, ``shoal_mcp.protocol.framing._pure`` and the target); the compiled
  module runs uninstrumented but is still checked on every input.
* ``mutate`` — this file's own loop: seeds from ``tests/fuzz_corpus/``, byte-level and
  dictionary mutations, splicing; inputs that reach a new behaviour signature (event
  kinds, message kinds, error codes) join the working corpus. No dependency.

Crashes are written to ``bench/.results/fuzz-crashes/`` (a crash input belongs in
``tests/fuzz_corpus/`` once fixed, so the CI replays it). A summary (executions,
executions/s, crashes) goes to stdout and ``bench/.results/fuzz_frames.json``.
Exit status 1 when a crash was found.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: make the tests package importable
CORPUS = ROOT / "tests" / "fuzz_corpus"
RESULTS = ROOT / "bench" / ".results"
CRASHES = RESULTS / "fuzz-crashes"

DICTIONARY = [
    b"\n",
    b"\r\n",
    b"\r",
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b":",
    b",",
    b"\\",
    b'\\"',
    b"\\u0000",
    b'"id":',
    b'"id":0',
    b'"id":"x"',
    b'"id":1e5',
    b'"id":-1',
    b'"id":null',
    b'"id":true',
    b'"jsonrpc":"2.0"',
    b'"method":"ping"',
    b'"method":"tools/call"',
    b'"params":{',
    b'"params":[',
    b'"result":{}',
    b'"error":{"code":-1,"message":"m"}',
    b'"error":null',
    b"null",
    b"true",
    b"1e308",
    b"-0",
    b"18446744073709551616",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\xe2\x80\xae",
    b"\xf0\x9f\x90\x9f",
]


def load_seeds() -> list[bytes]:
    return [p.read_bytes() for p in sorted(CORPUS.iterdir()) if p.is_file()]


def save_crash(data: bytes, exc: BaseException) -> Path:
    CRASHES.mkdir(parents=True, exist_ok=True)
    path = CRASHES / f"crash-{hashlib.sha1(data).hexdigest()}"
    path.write_bytes(data)
    path.with_suffix(".txt").write_text("".join(traceback.format_exception(exc)))
    return path


# -- the mutation engine --------------------------------------------------------------


def mutate(rng: random.Random, data: bytes, corpus: list[bytes], max_len: int) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 5))):
        op = rng.randrange(9) if rng.random() < 0.1 else rng.randrange(7)  # long runs: rarer
        n = len(buf)
        if op == 0 and n:  # flip a bit
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # set an interesting byte
            buf[rng.randrange(n)] = rng.choice(b'\n\r{}[]":,\\\x00\xff0a')
        elif op == 2:  # insert a dictionary token
            i = rng.randrange(n + 1)
            buf[i:i] = rng.choice(DICTIONARY)
        elif op == 3 and n:  # delete a range
            i = rng.randrange(n)
            del buf[i : i + rng.randrange(1, 16)]
        elif op == 4 and n:  # duplicate a range
            i = rng.randrange(n)
            j = min(n, i + rng.randrange(1, 64))
            k = rng.randrange(n + 1)
            buf[k:k] = buf[i:j]
        elif op == 5:  # splice with another corpus input
            other = rng.choice(corpus)
            if len(other) > 2:
                i = rng.randrange(2, len(other))
                k = rng.randrange(n + 1)
                buf[k:] = other[i:] if rng.random() < 0.5 else other[i:] + buf[k:]
        elif op == 6 and n > 2:  # the header: another max_frame / chunking
            buf[rng.randrange(2)] = rng.randrange(256)
        elif op == 7:  # a long run (oversize lines, head boundaries)
            i = rng.randrange(n + 1)
            buf[i:i] = bytes([rng.choice(b'ax\r\n"')]) * rng.choice((7, 63, 4095, 4096, 4097, 5000))
        elif op == 8 and n:  # truncate
            del buf[rng.randrange(n) :]
    return bytes(buf[:max_len])


def signature(data: bytes) -> tuple:
    """A cheap behaviour fingerprint standing in for coverage."""
    from shoal_mcp.protocol.framing import Oversize
    from shoal_mcp.protocol.jsonrpc import NO_ID, Invalid, parse_message, recover_id
    from tests.support.fuzz_targets import MAX_FRAMES, chunk_cuts, reference_events

    if len(data) < 2:
        return ("short",)
    max_frame = MAX_FRAMES[data[0] % len(MAX_FRAMES)]
    stream = data[2:]
    kinds = []
    for ev in reference_events(stream, max_frame)[:8]:
        if isinstance(ev, Oversize):
            rid = recover_id(ev.head)
            kinds.append(("O", rid is NO_ID, type(rid).__name__))
        else:
            msg = parse_message(ev)
            code = msg.reply["error"]["code"] if isinstance(msg, Invalid) and msg.reply else None
            kinds.append((type(msg).__name__, getattr(msg, "reason", None), code))
    return (data[0] % len(MAX_FRAMES), len(chunk_cuts(len(stream), data[1])) > 1, tuple(kinds))


def run_mutate(executions: int, seed: int, max_len: int, time_limit: float | None) -> dict:
    from tests.support.fuzz_targets import one_input

    rng = random.Random(seed)
    corpus = load_seeds()
    seen = {signature(d) for d in corpus}
    crashes: list[str] = []
    done = 0
    t0 = time.perf_counter()
    last_report = t0
    while done < executions:
        data = mutate(rng, rng.choice(corpus), corpus, max_len)
        try:
            one_input(data)
        except Exception as exc:  # noqa: BLE001 - a crash: record and go on
            path = save_crash(data, exc)
            crashes.append(str(path))
            print(f"CRASH {type(exc).__name__}: {exc} -> {path}", file=sys.stderr)
        done += 1
        if done % 64 == 0:
            sig = signature(data)
            if sig not in seen and len(corpus) < 5000:
                seen.add(sig)
                corpus.append(data)
        now = time.perf_counter()
        if now - last_report > 10:
            last_report = now
            print(
                f"  {done} execs, {done / (now - t0):.0f}/s, corpus {len(corpus)}, crashes {len(crashes)}",
                flush=True,
            )
            if time_limit and now - t0 > time_limit:
                break
    elapsed = time.perf_counter() - t0
    return {
        "engine": "mutate",
        "seed": seed,
        "executions": done,
        "seconds": round(elapsed, 1),
        "execs_per_s": round(done / elapsed),
        "crashes": len(crashes),
        "crash_files": crashes,
        "corpus_size": len(corpus),
    }


# -- atheris --------------------------------------------------------------------------


def run_atheris(executions: int, max_len: int) -> None:
    import atexit

    import atheris

    with atheris.instrument_imports(include=["shoal_mcp", "tests.support.fuzz_targets"]):
        from tests.support import fuzz_targets

    work = RESULTS / "fuzz-corpus-work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(CORPUS, work)
    CRASHES.mkdir(parents=True, exist_ok=True)
    state = {"n": 0, "t0": time.perf_counter()}

    def test_one_input(data: bytes) -> None:
        state["n"] += 1
        fuzz_targets.one_input(data)
        if state["n"] == executions:  # libFuzzer exits without running atexit hooks
            report()

    def report() -> None:
        elapsed = time.perf_counter() - state["t0"]
        summary = {
            "engine": "atheris",
            "executions": state["n"],
            "seconds": round(elapsed, 1),
            "execs_per_s": round(state["n"] / elapsed) if elapsed else 0,
            "crashes": len(list(CRASHES.glob("crash-*"))) - state["crashes_before"],
        }
        write_summary(summary)

    state["crashes_before"] = len(list(CRASHES.glob("crash-*")))
    atexit.register(report)
    atheris.Setup(
        [
            sys.argv[0],
            f"-runs={executions}",
            f"-max_len={max_len}",
            f"-artifact_prefix={CRASHES}/",
            "-print_final_stats=1",
            str(work),
        ],
        test_one_input,
    )
    atheris.Fuzz()


def write_summary(summary: dict) -> None:
    from shoal_mcp.protocol.framing import backends

    summary["backends"] = sorted(backends())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fuzz_frames.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executions", type=int, default=1_000_000)
    ap.add_argument("--engine", choices=["auto", "atheris", "mutate"], default="auto")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument(
        "--time-limit", type=float, default=None, help="mutate engine: stop after this many seconds"
    )
    args = ap.parse_args(argv)
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401
        except ImportError:
            engine = "mutate"
        else:
            engine = "atheris"
    if engine == "atheris":
        run_atheris(args.executions, args.max_len)
        return 0
    summary = run_mutate(args.executions, args.seed, args.max_len, args.time_limit)
    write_summary(summary)
    return 1 if summary["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
