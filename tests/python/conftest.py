import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


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
