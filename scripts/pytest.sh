#!/usr/bin/env bash
# Build the Python extension in place and run the Python tests with Debian's interpreter
# (/usr/bin/python3: the one with python3-numpy, python3-pytest, python3-torch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${FT_PYTHON:-/usr/bin/python3}
cd "$root"
FT_REMAKE=0 $PY setup.py -q build_ext --inplace --force >/dev/null
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
set +e
$PY -m pytest -q -rs "$root/tests/python" "$@"
rc=$?
[ $rc = 5 ] && { echo "pytest collected no tests"; rc=1; }
exit $rc
