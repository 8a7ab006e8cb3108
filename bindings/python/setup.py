"""Builds the flashattn Python package: the SWIG low layer (flashattn.flashattn_swig, generated
from ../flashattn.i through flashattn_swig.i) over an installed libflashattn, and the pure-Python
layer above it.

Where libflashattn is found:
  FLASHATTN_INCLUDE_DIRS (os.pathsep-separated) and FLASHATTN_LIBRARY_DIR, when set;
  otherwise `pkg-config flashattn` (PKG_CONFIG and PKG_CONFIG_PATH are honoured).
The extension records the library folder as its run path, so no LD_LIBRARY_PATH is needed.

SWIG output: FLASHATTN_SWIG_DIR may name a folder holding flashattn_wrap.c and flashattn_swig.py
generated beforehand (for a machine without swig); otherwise swig runs here.
"""
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _pkg_config(*args):
    exe = os.environ.get("PKG_CONFIG", "pkg-config")
    try:
        out = subprocess.run([exe, *args, "flashattn"], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(
            "flashattn: libflashattn not found through pkg-config (%s). Install the library "
            "(cmake --install), point PKG_CONFIG_PATH at its lib/pkgconfig folder, or set "
            "FLASHATTN_INCLUDE_DIRS and FLASHATTN_LIBRARY_DIR." % e
        )
    return shlex.split(out.stdout)


def _library():
    """(include dirs, library dir) of libflashattn."""
    inc = os.environ.get("FLASHATTN_INCLUDE_DIRS")
    lib = os.environ.get("FLASHATTN_LIBRARY_DIR")
    if inc and lib:
        return [d for d in inc.split(os.pathsep) if d], lib
    incs = [f[2:] for f in _pkg_config("--cflags-only-I") if f.startswith("-I")]
    libs = [f[2:] for f in _pkg_config("--libs-only-L") if f.startswith("-L")]
    return incs, (libs[0] if libs else None)


INCLUDE_DIRS, LIBRARY_DIR = _library()


def _version():
    for d in INCLUDE_DIRS:
        h = Path(d, "flashattn", "version.h")
        if h.exists():
            m = re.search(r'#define FLASHATTN_VERSION_STRING "([^"]+)"', h.read_text())
            if m:
                return m.group(1)
    raise SystemExit("flashattn: flashattn/version.h not found in %s" % INCLUDE_DIRS)


_GENERATED = None


def _generated():
    """The folder holding flashattn_wrap.c and flashattn_swig.py."""
    global _GENERATED
    if _GENERATED is None:
        pre = os.environ.get("FLASHATTN_SWIG_DIR")
        if pre:
            _GENERATED = Path(pre).resolve()
        else:
            out = HERE / "build" / "swig"
            out.mkdir(parents=True, exist_ok=True)
            swig = os.environ.get("SWIG", "swig")
            if shutil.which(swig) is None:
                raise SystemExit("flashattn: swig not found; install it or set FLASHATTN_SWIG_DIR")
            cmd = [swig, "-python", "-threads", *("-I" + d for d in INCLUDE_DIRS),
                   "-outdir", str(out), "-o", str(out / "flashattn_wrap.c"),
                   str(HERE / "flashattn_swig.i")]
            subprocess.run(cmd, check=True)
            _GENERATED = out
        for name in ("flashattn_wrap.c", "flashattn_swig.py"):
            if not (_GENERATED / name).exists():
                raise SystemExit("flashattn: %s missing from %s" % (name, _GENERATED))
    return _GENERATED


class BuildPy(build_py):
    def run(self):
        super().run()
        self.copy_file(str(_generated() / "flashattn_swig.py"),
                       os.path.join(self.build_lib, "flashattn", "flashattn_swig.py"))


class BuildExt(build_ext):
    def run(self):
        gen = _generated()
        for ext in self.extensions:
            ext.sources = [str(gen / "flashattn_wrap.c")]
        if self.inplace:
            self.copy_file(str(gen / "flashattn_swig.py"), str(HERE / "flashattn" / "flashattn_swig.py"))
        super().run()


ext = Extension(
    "flashattn._flashattn_swig",
    sources=["flashattn_wrap.c"],  # replaced by BuildExt with the generated file
    include_dirs=INCLUDE_DIRS,
    library_dirs=[LIBRARY_DIR] if LIBRARY_DIR else [],
    runtime_library_dirs=[LIBRARY_DIR] if LIBRARY_DIR else [],
    libraries=["flashattn"],
)

setup(
    version=_version(),
    packages=["flashattn"],
    ext_modules=[ext],
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
)
