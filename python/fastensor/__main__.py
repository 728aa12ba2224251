"""``python -m fastensor ...`` and the ``fastensor`` command pip installs: the command-line
tool shipped in the package (fastensor/_bin/fastensor), run with these arguments."""
from __future__ import annotations

import os
import sys


def tool_path() -> str:
    """Where the package's copy of the command-line tool is."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "fastensor")


def _python_command(args):
    """The commands served here rather than by the C tool: ``convert`` and ``inspect`` /
    ``verify`` of a .fst container. @return an exit status, or None (the tool's)."""
    from . import _fst
    if args[:1] == ["convert"]:
        import argparse
        p = argparse.ArgumentParser(prog="fastensor convert", description="Convert a "
                                    "checkpoint byte-exactly: to a compressed .fst container "
                                    "or from one to safetensors (by DST's extension).")
        p.add_argument("src")
        p.add_argument("dst")
        p.add_argument("--compression", choices=["auto", "always", "none"], default="auto")
        a = p.parse_args(args[1:])
        from . import convert
        try:
            convert(a.src, a.dst, compression=a.compression)
        except (OSError, ValueError) as e:
            print(f"fastensor convert: {e}", file=sys.stderr)
            return 1
        return 0
    paths = [x for x in args[1:] if not x.startswith("-")]
    if args[:1] in (["inspect"], ["verify"]) and paths and _fst.is_container(paths[0]):
        from . import inspect, verify
        try:
            if args[0] == "verify":
                verify(paths[0])
                print(f"{paths[0]}: ok (every block's checksum checked)")
                return 0
            d = inspect(paths[0])
        except (OSError, ValueError) as e:
            print(f"fastensor {args[0]}: {e}", file=sys.stderr)
            return 1
        print(f"{paths[0]}: fastensor container, {len(d['tensors'])} tensors, "
              f"{d['bytes']} bytes stored in {d['stored_bytes']} ({d['ratio']:.3f})")
        for k, v in d["metadata"].items():
            print(f"  metadata {k} = {v}")
        for name, t in d["tensors"].items():
            print(f"  {name}: {t['dtype']} {t['shape']} {t['bytes']} bytes, stored "
                  f"{t['stored_bytes']}{' (coded)' if t['compressed'] else ''}")
        return 0
    return None


def main(argv: list[str] | None = None) -> int:
    path = tool_path()
    args = sys.argv[1:] if argv is None else argv
    rc = _python_command(list(args))
    if rc is not None:
        return rc
    if not os.access(path, os.X_OK):
        print(f"fastensor: the command-line tool is not in this install ({path}); build it "
              "with `make cli` (or install the package with pip)", file=sys.stderr)
        return 127
    sys.stdout.flush()
    os.execv(path, [path] + list(args))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
