import os
import threading
import time

import numpy as np
import pytest

import fastensor


@pytest.mark.parametrize("engine", fastensor.ENGINES)
def test_raw_write_read_any_offset(tmp, engine):
    rng = np.random.default_rng(3)
    data = rng.integers(0, 255, size=(1 << 20) + 3, dtype=np.uint8)
    p = os.path.join(tmp, "raw.bin")
    with fastensor.File(p, "w", engine=engine) as f:
        for off in (0, 1, 4095, (5 << 30) + 7):
            assert f.write(data, off) == data.nbytes
            out = np.zeros_like(data)
            assert f.read_into(out, off) == data.nbytes
            assert np.array_equal(out, data)
        req = f.write_async(data, 123, sync=True)
        assert req.wait() == data.nbytes and req.done()
        out = np.zeros_like(data)
        assert f.read_into_async(out, 123).wait() == data.nbytes
        assert np.array_equal(out, data)
        assert f.read_into(out, f.size() - 10) == 10  # short at end of file


def test_modes_and_errors(tmp):
    p = os.path.join(tmp, "m.bin")
    with pytest.raises(FileNotFoundError):
        fastensor.File(p, "r")
    with fastensor.File(p, "x") as f:
        f.write(np.ones(10, dtype=np.uint8))
    with pytest.raises(FileExistsError):
        fastensor.File(p, "x")
    with pytest.raises(ValueError):
        fastensor.File(p, "rw")
    with pytest.raises(ValueError):
        fastensor.File(p, "r", engine="warp")
    with fastensor.File(p, "r") as f:
        with pytest.raises(OSError) as e:
            f.write(np.ones(10, dtype=np.uint8))
        assert "not open for writing" in str(e.value)
        with pytest.raises(ValueError):
            f.read_into(np.ones(10, dtype=np.uint8)[::2])
    with pytest.raises(IsADirectoryError):
        fastensor.File(tmp, "r")


def test_permission_denied(tmp):
    """Checked in a child that drops root (root bypasses permissions)."""
    p = os.path.join(tmp, "private.bin")
    open(p, "wb").close()
    os.chmod(p, 0)
    os.chmod(tmp, 0o755)
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            if os.geteuid() == 0:
                os.setuid(65534)
            try:
                fastensor.File(p, "r")
                code = 1
            except PermissionError as e:
                code = 0 if e.filename == p else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_gil_released_during_io(tmp):
    """Another Python thread keeps running while a long read is in the C library."""
    n = 256 << 20
    p = os.path.join(tmp, "gil.bin")
    data = np.ones(n, dtype=np.uint8)
    with fastensor.File(p, "w") as f:
        f.write(data)
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(time.perf_counter())

    out = np.empty(n, dtype=np.uint8)
    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    with fastensor.File(p, "r") as f:
        for _ in range(3):
            begin = time.perf_counter()
            f.read_into(out, engine="posix")
            end = time.perf_counter()
    stop.set()
    t.join()
    during = [x for x in ticks if begin < x < end]
    assert len(during) > 100, f"only {len(during)} ticks of the other thread in {end - begin:.3f}s"
