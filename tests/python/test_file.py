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
        # synced later by the caller: the same bytes, durable at sync()
        assert f.write(data[::-1].copy(), 9, sync="later") == data.nbytes
        f.sync()
        assert f.read_into(out, 9) == data.nbytes
        assert np.array_equal(out, data[::-1])


@pytest.mark.parametrize("engine", fastensor.ENGINES)
def test_batches(tmp, engine):
    """Many (array, offset) items in one call: shuffled, unaligned, some empty; every byte back."""
    rng = np.random.default_rng(11)
    sizes = [0, 1, 4095, 4096, 4097, 70000] + list(rng.integers(1, 300000, size=40))
    arrays = [rng.integers(0, 255, size=int(n), dtype=np.uint8) for n in sizes]
    offsets, at = [], 7
    for a in arrays:
        offsets.append(at)
        at += a.nbytes + int(rng.integers(0, 5000))
    order = rng.permutation(len(arrays))
    p = os.path.join(tmp, "batch.bin")
    with fastensor.File(p, "w", engine=engine) as f:
        done = f.write_batch([(arrays[i], offsets[i]) for i in order], sync=True)
        assert done == [arrays[i].nbytes for i in order]
        outs = [np.zeros_like(a) for a in arrays]
        assert f.read_batch([(outs[i], offsets[i]) for i in order]) == done
        for a, o in zip(arrays, outs):
            assert np.array_equal(a, o)
        tail = np.zeros(100, dtype=np.uint8)
        assert f.read_batch([(tail, f.size() - 10)]) == [10]
        assert f.read_batch([]) == []
        # One bad item (read-only memory to read into): nothing runs, the error says which.
        before = np.zeros_like(arrays[1])
        with pytest.raises(ValueError):
            f.read_batch([(before, offsets[1]), (np.ones(4, np.uint8)[::2], 0)])
        assert not before.any()
        with pytest.raises(TypeError):
            f.read_batch([before])


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
    with fastensor.File(p, "r+") as f:
        with pytest.raises(ValueError):
            f.write(np.ones(10, dtype=np.uint8), sync="soon")
        back = np.zeros(10, dtype=np.uint8)
        assert f.read_into(back) == 10 and np.all(back == 1)  # nothing was written


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


def test_auto_trace_lines(tmp):
    """FASTENSOR_TRACE: one line per AUTO decision, with the caller's whole call in call=
    (bench/auto-vs-fixed.py sorts AUTO's bytes into its table's rows by it). The trace file is
    opened once per process: a child process of its own."""
    import subprocess
    import sys
    import textwrap
    trace = os.path.join(tmp, "trace.txt")
    code = textwrap.dedent("""
        import os, sys, numpy as np, fastensor
        p = sys.argv[1]
        data = np.random.default_rng(5).integers(0, 255, size=(1 << 20) + 3, dtype=np.uint8)
        with fastensor.File(p, "w", engine="auto") as f:
            f.write(data, 0, sync="later")
            f.sync()
            out = np.zeros_like(data)
            for n in (4096, 65536, 70001):
                for i in range(20):
                    assert f.read_into(out[:n], i * 4096) == n
            assert f.read_into(out, 0) == data.nbytes and np.array_equal(out, data)
            assert f.read_into(out, data.nbytes - 10) == 10   # at the end: the bytes there
        """)
    env = dict(os.environ, FASTENSOR_TRACE=trace, FASTENSOR_PROFILE="off")
    p = subprocess.run([sys.executable, "-c", code, os.path.join(tmp, "t.bin")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [dict(w.split("=", 1) for w in line.split() if "=" in w)
             | {"op": line.split()[0]} for line in open(trace)]
    reads = [ln for ln in lines if ln["op"] == "read"]
    writes = [ln for ln in lines if ln["op"] == "write"]
    assert len(writes) == 1 and writes[0]["call"] == writes[0]["bytes"] == str((1 << 20) + 3)
    calls = [int(ln["call"]) for ln in reads]
    assert calls == [4096] * 20 + [65536] * 20 + [70001] * 20 + [(1 << 20) + 3, 10]
    assert [int(ln["bytes"]) for ln in reads] == calls
    assert all(int(ln["bucket"]) == int(ln["call"]).bit_length() - 1 for ln in reads)
    assert all(ln["arm"].split("/")[0] in fastensor.ENGINES for ln in lines)
