"""``python -m fastensor ...`` and the ``fastensor`` command pip installs: the command-line
tool shipped in the package (fastensor/_bin/fastensor), run with these arguments."""
from __future__ import annotations

import os
import sys


def tool_path() -> str:
    """Where the package's copy of the command-line tool is."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "fastensor")


def main(argv: list[str] | None = None) -> int:
    path = tool_path()
    args = sys.argv[1:] if argv is None else argv
    if not os.access(path, os.X_OK):
        print(f"fastensor: the command-line tool is not in this install ({path}); build it "
              "with `make cli` (or install the package with pip)", file=sys.stderr)
        return 127
    sys.stdout.flush()
    os.execv(path, [path] + list(args))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
