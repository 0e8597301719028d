"""Apply a sandbox spec, then exec a program: the exec supervisor's core.

    python -I -S sandbox_run.py SPEC_FD [--lc-ctype==VALUE|-] -- ARGV...
    python -I -S sandbox_run.py --probe

``SPEC_FD`` is a readable descriptor holding the spec (``SandboxSpec.to_bytes()``, or
JSON); it is read to EOF and closed.  ``TMPDIR`` is set to the spec's temp dir.  Exit
125 when the sandbox cannot be applied (nothing ran), 126/127 when ARGV cannot be
executed.  ``--lc-ctype`` restores the program's ``LC_CTYPE`` (``=VALUE``) or removes it
(``-``): the interpreter's C-locale coercion set it in this process.  ``--probe``
confines this process with an empty sandbox and prints what
enforced, as JSON.  Standard library only; ``-I -S`` keeps start-up near 10 ms.
"""

import os
import sys

# -I leaves the script's directory off sys.path: put the package root (src/ or
# site-packages) there ourselves.  Only shoal_mcp's trivial __init__ files come with it.
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)

from shoal_mcp.kernel.access import sandbox  # noqa: E402


def _fail(code: int, message: str) -> int:
    os.write(2, f"shoal sandbox: {message}\n".encode(errors="replace"))
    return code


def main(args: list[str]) -> int:
    if args == ["--probe"]:
        import json

        from shoal_mcp.kernel.access import sandbox_probe

        os.write(1, json.dumps(sandbox_probe.probe_self()).encode())
        return 0
    lc_ctype = None
    if len(args) > 1 and args[1].startswith("--lc-ctype="):
        lc_ctype = args.pop(1)[len("--lc-ctype=") :]
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        return _fail(2, "usage: sandbox_run.py SPEC_FD [--lc-ctype==VALUE|-] -- ARGV...")
    fd, argv = int(args[0]), args[2:]
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        os.close(fd)
        spec = sandbox.SandboxSpec.from_bytes(b"".join(chunks))
        sandbox.apply(spec)
    except OSError as e:
        return _fail(125, str(e))
    os.environ.update(spec.environ())
    if lc_ctype == "-":
        os.environ.pop("LC_CTYPE", None)
    elif lc_ctype is not None and lc_ctype.startswith("="):
        os.environ["LC_CTYPE"] = lc_ctype[1:]
    err = _exec(argv)
    return _fail(127 if isinstance(err, FileNotFoundError) else 126, f"{argv[0]}: {err.strerror}")


def _exec(argv: list[str]) -> OSError:
    """``execvp`` without imports: after apply() the interpreter's own stdlib may be
    outside the sandbox (os.execvp imports ``warnings``).  Returns the error to report."""
    name = argv[0]
    path = os.environ.get("PATH", "/usr/bin:/bin").split(":")
    candidates = [name] if "/" in name else [os.path.join(d or ".", name) for d in path]
    first: OSError | None = None  # the first error other than "not there" wins, as in execvp
    last: OSError = FileNotFoundError(2, "No such file or directory")
    for candidate in candidates:
        try:
            os.execv(candidate, argv)
        except (FileNotFoundError, NotADirectoryError) as e:
            last = e
        except OSError as e:
            first = first or e
    return first or last


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
