"""Build fastensor's C extension on the stable ABI (abi3, Python >= 3.11), and ship the CLI.

The extension links build/libfastensor.a, which `make lib` builds (run here when missing),
so `pip install --no-build-isolation .` works offline from a clean tree. The `fastensor`
command-line tool (`make cli`) goes into the package as fastensor/_bin/fastensor; pip
installs a `fastensor` command that runs it, and `python -m fastensor` does the same.
"""
import os
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("FT_BUILD", os.path.join(ROOT, "build"))
ARCHIVE = os.path.join(BUILD, "libfastensor.a")


CLI = os.path.join(BUILD, "fastensor")


class BuildWithLibrary(build_ext):
    def run(self):
        if not os.path.exists(ARCHIVE) or not os.path.exists(CLI) or \
                os.environ.get("FT_REMAKE", "1") == "1":
            subprocess.check_call(["make", "-C", ROOT, "--no-print-directory", "lib", "cli"])
        super().run()
        # the CLI beside the package's modules: in the build tree (a wheel) and in place
        for base in {self.build_lib, os.path.join(ROOT, "python")} if self.inplace else \
                {self.build_lib}:
            bindir = os.path.join(base, "fastensor", "_bin")
            os.makedirs(bindir, exist_ok=True)
            shutil.copy2(CLI, os.path.join(bindir, "fastensor"))


ext = Extension(
    "fastensor._C",
    sources=["python/fastensor/_ext.c", "python/fastensor/_store.c",
             "python/fastensor/_batch.c", "python/fastensor/_codec.c",
             "python/fastensor/_checkpoint.c"],
    include_dirs=[os.path.join(ROOT, "include")],
    define_macros=[("Py_LIMITED_API", "0x030B0000")],
    # loads on glibc >= 2.28 (see src/base/glibc-compat.h)
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers",
                        "-include", os.path.join(ROOT, "src", "base", "glibc-compat.h")],
    extra_objects=[ARCHIVE],
    # liburing and libxxhash are linked in statically (machines without them: the GPU
    # machine has no liburing); JSON is the library's own. The library's internal symbols
    # stay out of the extension's dynamic symbol table.
    extra_link_args=["-Wl,-Bstatic", "-luring", "-lxxhash", "-Wl,-Bdynamic",
                     "-Wl,--exclude-libs,ALL", "-Wl,--push-state,--no-as-needed",
                     "-l:libpthread.so.0", "-l:libdl.so.2", "-Wl,--pop-state"],
    libraries=["pthread", "m"],
    py_limited_api=True,
)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithLibrary},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
