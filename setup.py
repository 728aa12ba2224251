"""Build fastensor's C extension on the stable ABI (abi3, Python >= 3.11).

The extension links build/libfastensor.a, which `make lib` builds (run here when missing),
so `pip install --no-build-isolation .` works offline from a clean tree.
"""
import os
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("FT_BUILD", os.path.join(ROOT, "build"))
ARCHIVE = os.path.join(BUILD, "libfastensor.a")


class BuildWithLibrary(build_ext):
    def run(self):
        if not os.path.exists(ARCHIVE) or os.environ.get("FT_REMAKE", "1") == "1":
            subprocess.check_call(["make", "-C", ROOT, "--no-print-directory", "lib"])
        super().run()


ext = Extension(
    "fastensor._C",
    sources=["python/fastensor/_ext.c", "python/fastensor/_store.c",
             "python/fastensor/_batch.c"],
    include_dirs=[os.path.join(ROOT, "include")],
    define_macros=[("Py_LIMITED_API", "0x030B0000")],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers"],
    extra_objects=[ARCHIVE],
    # liburing is linked in statically (the GPU machine has no liburing); the library's
    # internal symbols stay out of the extension's dynamic symbol table.
    extra_link_args=["-Wl,-Bstatic", "-luring", "-Wl,-Bdynamic", "-Wl,--exclude-libs,ALL"],
    libraries=["jansson", "xxhash", "pthread"],
    py_limited_api=True,
)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithLibrary},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
