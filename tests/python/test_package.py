"""The package as pip builds and installs it: a wheel with the extension and the CLI, no C
sources, typed; `python -m fastensor` and the `fastensor` command run the CLI."""
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Building the package compiles the library: it needs the -dev headers (a machine that only
# runs what was built elsewhere, like the GPU machine, lacks them).
_MISSING = [h for h in ("liburing.h", "xxhash.h")
            if not any(os.path.exists(os.path.join(d, h))
                       for d in ("/usr/include", "/usr/local/include"))]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason="building the package needs the "
                                f"headers {', '.join(_MISSING)} (-dev packages), not installed")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                        "--no-deps", "-q", "-w", str(out), ROOT], capture_output=True, text=True,
                       env=dict(os.environ, FT_REMAKE="0"))
    if r.returncode != 0:
        pytest.fail(f"pip wheel failed: {r.stderr[-2000:]}")
    (path,) = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".whl")]
    return path


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "fastensor/_C.abi3.so" in names and "fastensor/_bin/fastensor" in names
    assert "fastensor/py.typed" in names and "fastensor/__main__.py" in names
    assert not [n for n in names if n.endswith((".c", ".h"))], "the wheel ships C sources"
    assert "-cp311-abi3-" in os.path.basename(wheel)
    meta = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "fastensor = fastensor.__main__:main" in meta
    lic = [n for n in names if n.endswith("METADATA")]
    assert "Apache-2.0" in zipfile.ZipFile(wheel).read(lic[0]).decode()


def test_installed_wheel_runs(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), wheel], check=True)
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-m", "fastensor", "--help"], capture_output=True,
                       text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0 and "usage: fastensor" in r.stdout
    # the installed tool is executable (pip keeps the mode bits of package data)
    assert os.access(site / "fastensor" / "_bin" / "fastensor", os.X_OK)
    r = subprocess.run([str(site / "bin" / "fastensor"), "--help"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0 and "usage: fastensor" in r.stdout
    r = subprocess.run([sys.executable, "-c", "import fastensor, importlib.metadata as m; "
                        "print(fastensor.__version__, m.version('fastensor'))"],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), check=True)
    ours, dist = r.stdout.split()
    assert ours == dist
    # the extension and the CLI need no library beyond glibc's at run time
    for elf in (site / "fastensor" / "_C.abi3.so", site / "fastensor" / "_bin" / "fastensor"):
        ldd = subprocess.run(["ldd", str(elf)], capture_output=True, text=True).stdout
        libs = {line.split()[0] for line in ldd.splitlines() if "=>" in line}
        extra = {lib for lib in libs if not lib.startswith(("libc.so", "libm.so", "libdl.so",
                                                          "libpthread.so", "linux-vdso"))}
        assert not extra, f"{elf.name} needs {sorted(extra)} at run time"


def _glibc_needed(path):
    """The newest GLIBC_x.y symbol version the ELF file at ``path`` asks for, as (x, y)."""
    import re
    import shutil
    if not shutil.which("objdump"):
        pytest.skip("objdump (binutils) is not installed")
    out = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True,
                         check=True).stdout
    versions = {tuple(int(p) for p in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+)\)",
                                                                       out)}
    assert versions, f"{path}: no GLIBC symbol versions found"
    return max(versions)


def test_wheel_loads_on_glibc_2_28(wheel, tmp_path):
    """The extension (and the library) ask for no glibc symbol newer than 2.28, whatever
    glibc built them (src/base/glibc-compat.h)."""
    so = tmp_path / "_C.abi3.so"
    so.write_bytes(zipfile.ZipFile(wheel).read("fastensor/_C.abi3.so"))
    assert _glibc_needed(so) <= (2, 28), "the extension needs a glibc newer than 2.28"
    lib = os.path.join(ROOT, os.environ.get("BUILD", "build"), "libfastensor.so")
    if os.path.exists(lib):
        assert _glibc_needed(lib) <= (2, 28), "libfastensor.so needs a glibc newer than 2.28"
    cli = tmp_path / "fastensor"
    cli.write_bytes(zipfile.ZipFile(wheel).read("fastensor/_bin/fastensor"))
    assert _glibc_needed(cli) <= (2, 28), "the CLI needs a glibc newer than 2.28"


_START_PROBE = r"""
#include <stdio.h>
#include <stdlib.h>
static int order;
static int seen_argc;
__attribute__((constructor(101))) static void first(int argc, char **argv, char **envp)
{
    order = order * 10 + 1;
    seen_argc = argc;
    (void)argv; (void)envp;
}
__attribute__((constructor(102))) static void second(void) { order = order * 10 + 2; }
__attribute__((destructor)) static void last(void) { printf(" dtor"); fflush(stdout); }
int main(int argc, char **argv)
{
    printf("ctors %d argc %d/%d %s env %s", order, seen_argc, argc, argv[argc - 1],
           getenv("FT_PROBE"));
    return 3;
}
"""


def test_cli_start_runs_constructors_on_the_old_entry(tmp_path):
    """tools/start.c, linked as the CLI is: the program enters glibc through the
    __libc_start_main of glibc 2.28 and older, constructors run once each and in order (with
    argc, argv, envp), main's arguments, environment and exit status pass through, the
    destructors run."""
    import shutil
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        pytest.skip(f"no C compiler ({cc})")
    src = tmp_path / "probe.c"
    src.write_text(_START_PROBE)
    exe = tmp_path / "probe"
    subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-include",
                    os.path.join(ROOT, "src", "base", "glibc-compat.h"), "-I",
                    os.path.join(ROOT, "tools"), "-I", os.path.join(ROOT, "include"),
                    "-Wl,--wrap=__libc_start_main", "-o", str(exe), str(src),
                    os.path.join(ROOT, "tools", "start.c")], check=True)
    if _glibc_needed(exe) > (2, 28):
        pytest.fail("the probe asks for a glibc newer than 2.28")
    r = subprocess.run([str(exe), "a", "last"], capture_output=True, text=True,
                       env=dict(os.environ, FT_PROBE="yes"))
    assert r.returncode == 3
    assert r.stdout == "ctors 12 argc 3/3 last env yes dtor", r.stdout


def test_pkg_config_static_links(tmp_path):
    """`make install`, then a program linked against the static library with nothing but
    what `pkg-config --static` says."""
    import shutil
    if not shutil.which("pkg-config"):
        pytest.skip("pkg-config is not installed (scripts/deps.sh installs it)")
    dest = tmp_path / "root"
    subprocess.run(["make", "-s", "-C", ROOT, "install", f"DESTDIR={dest}", "PREFIX=/usr/local",
                    f"BUILD={os.environ.get('BUILD', 'build')}"], check=True,
                   stdout=subprocess.DEVNULL)
    prog = tmp_path / "p.c"
    prog.write_text('#include <fastensor.h>\n#include <stdio.h>\n'
                    'int main(void) { puts(ft_version()); return 0; }\n')
    env = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=str(dest),
               PKG_CONFIG_PATH=str(dest / "usr/local/lib/pkgconfig"))
    flags = subprocess.run(["pkg-config", "--static", "--cflags", "--libs", "fastensor"],
                           capture_output=True, text=True, env=env, check=True).stdout.split()
    libs = [f for f in flags if f.startswith("-l") and f != "-lfastensor"]
    other = [f for f in flags if not f.startswith("-l")]
    exe = tmp_path / "p"
    subprocess.run(["cc", "-no-pie", "-o", str(exe), str(prog)] + other +
                   ["-Wl,-Bstatic", "-lfastensor", "-Wl,-Bdynamic"] + libs, check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    import fastensor
    assert out.strip() == fastensor.__version__
