"""The README stays true: every code block in it runs. Python blocks are executed, C blocks
compiled against the library and run, the CLI's commands answer --help, the `make` targets
exist, the layout's paths exist. On a machine without a GPU "cuda" becomes "cpu"."""
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))


def blocks():
    """(language, first line number, text) of every fenced block of the README."""
    out, lang, start, lines = [], None, 0, []
    with open(os.path.join(ROOT, "README.md")) as f:
        for no, line in enumerate(f, 1):
            if line.startswith("```"):
                if lang is None:
                    lang, start, lines = line[3:].strip(), no + 1, []
                else:
                    out.append((lang, start, "".join(lines)))
                    lang = None
            elif lang is not None:
                lines.append(line)
    assert lang is None, "an unclosed code block in the README"
    return out


def of(lang):
    return [(start, text) for l, start, text in blocks() if l == lang]


def on_this_machine(text):
    return text if torch.cuda.is_available() else text.replace('"cuda"', '"cpu"')


def test_every_block_is_known():
    """Each block is one of the kinds this file runs (a new kind needs a test here)."""
    kinds = {lang for lang, _, _ in blocks()}
    assert kinds <= {"python", "c", "sh", ""}, kinds
    assert of("python") and of("c") and of("sh")


@pytest.mark.parametrize("start,text", of("python"))
def test_python_block(start, text, tmp):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), FASTENSOR_PROFILE="off")
    r = subprocess.run([sys.executable, "-c", on_this_machine(text)], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"README line {start}:\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("start,text", of("c"))
def test_c_block(start, text, tmp):
    lib = os.path.join(BUILD, "libfastensor.so")
    if not os.path.exists(lib):
        pytest.skip(f"{lib} is not built (make all)")
    cc = os.environ.get("CC", "cc")
    src, exe = os.path.join(tmp, "snippet.c"), os.path.join(tmp, "snippet")
    os.symlink(os.path.realpath(lib), os.path.join(tmp, "libfastensor.so.0"))  # its soname
    with open(src, "w") as f:
        f.write(on_this_machine(text))
    r = subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I",
                        os.path.join(ROOT, "include"), src, "-o", exe, "-L", BUILD,
                        "-lfastensor", f"-Wl,-rpath,{tmp}"], capture_output=True, text=True)
    assert r.returncode == 0, f"README line {start} does not compile:\n{r.stderr}"
    r = subprocess.run([exe], cwd=tmp, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, FASTENSOR_PROFILE="off"))
    assert r.returncode == 0, f"README line {start} failed:\n{r.stdout}{r.stderr}"


def test_sh_blocks_name_real_targets():
    """The shell block's `make X` lines name targets of the Makefile (CI runs them)."""
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    named = [m for _, text in of("sh") for m in re.findall(r"^make (\S+)", text, re.M)]
    assert named
    for t in named:
        assert t in targets, f"README names `make {t}`, which the Makefile lacks"


def test_cli_block_commands_exist():
    """Every command the CLI block lists answers --help."""
    cli = os.path.join(BUILD, "fastensor")
    if not os.path.exists(cli):
        pytest.skip(f"{cli} is not built (make all)")
    listing = [text for _, text in of("") if text.startswith("fastensor ")]
    assert len(listing) == 1, "the README's CLI listing (a block of `fastensor ...` lines)"
    commands = set()
    for line in listing[0].splitlines():
        m = re.match(r"fastensor (.*?)(\s{2,}|$)", line)
        if m:
            words = [w for w in re.split(r"[ /|]+", m.group(1)) if re.fullmatch(r"[a-z]+", w)]
            commands.update(words[:1] + [w for w in words[1:] if w in ("verify", "profile")])
    assert {"info", "inspect", "verify", "gc", "bench", "tune", "profile", "demo"} <= commands
    for c in sorted(commands):
        r = subprocess.run([cli, c, "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"`fastensor {c} --help` exited {r.returncode}: {r.stderr}"


def test_layout_paths_exist():
    """Every path the layout block names is there."""
    layout = [text for _, text in of("") if text.startswith("include/")]
    assert len(layout) == 1, "the README's layout block"
    for line in layout[0].splitlines():
        path = line.split()[0] if line and not line[0].isspace() else None
        if path:
            assert os.path.exists(os.path.join(ROOT, path)), f"layout names {path}, not there"


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md")) as f:
        assert sum(1 for _ in f) <= 300, "the README is a user's guide: at most ~300 lines"

