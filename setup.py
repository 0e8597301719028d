"""Build the optional compiled framing core (src/_frame.pyx -> shoal_mcp.protocol.framing._frame).

The extension is optional by design: with no C compiler (or no Cython and no shipped
C file) the build prints a warning and the package installs on its pure-Python twin.
``SHOAL_PURE_PYTHON=1`` skips building it, the same variable that selects the twin at
run time (any value but empty or ``0`` counts, as there).
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
PYX = os.path.join("src", "_frame.pyx")
C_FILE = os.path.join("src", "_frame.c")


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: the fallback covers a missing compiler."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any toolchain failure means fallback
            self._warn(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._warn(exc)

    @staticmethod
    def _warn(exc):
        fallback_notice(f"the compiled framing core could not be built: {exc}")


def fallback_notice(why):
    """Said on stderr whenever the package installs without its compiled core. pip shows
    a build's output only with -v; `shoal --version` and `shoal doctor` say it too."""
    bar = "=" * 72
    sys.stderr.write(
        f"\n{bar}\nshoal-mcp: NOTE: installing the pure-Python framing (slower), because\n"
        f"  {why}\n"
        "Everything works; to get the compiled core, install a C compiler and the Python\n"
        "headers (e.g. apt install build-essential python3-dev) and reinstall.\n"
        "`shoal doctor` reports which framing backend is in use.\n"
        f"{bar}\n\n"
    )


def pure_python_requested():
    # Same reading as shoal_mcp.protocol.framing, which this file cannot import.
    return os.environ.get("SHOAL_PURE_PYTHON", "") not in ("", "0")


def extensions():
    if pure_python_requested():
        fallback_notice("SHOAL_PURE_PYTHON is set")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        if os.path.exists(os.path.join(HERE, C_FILE)):
            return [Extension("shoal_mcp.protocol.framing._frame", [C_FILE])]
        fallback_notice(f"neither Cython nor the generated {C_FILE} is available")
        return []
    return cythonize(
        [Extension("shoal_mcp.protocol.framing._frame", [PYX], extra_compile_args=["-O3"])],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
