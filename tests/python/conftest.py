import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Intel MKL's matrix products may round differently from call to call (by the alignment of
# their operands and the code path chosen at run time) unless asked for reproducible results;
# the offload tests compare trainings bitwise, so only what offload changes may differ. Set
# before torch loads MKL (torch from pip uses it on x86; other BLAS ignore the variable).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")


@pytest.fixture
def tmp(tmp_path_factory):
    """A directory on a real filesystem (not tmpfs), removed afterwards."""
    base = os.environ.get("FT_TEST_DIR")
    if base:
        os.makedirs(base, exist_ok=True)
        import tempfile
        import shutil
        d = tempfile.mkdtemp(prefix="py-", dir=base)
        yield d
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield str(tmp_path_factory.mktemp("ft"))
