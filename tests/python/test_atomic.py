"""Checkpoints that are never torn, seen from Python: loads bound to the file whose header they
parsed while another thread replaces it, a save replacing the other form of its name, gc of
dead saves' leftovers, warnings for failures after the commit, clear errors for FIFOs and
truncated files."""
import os
import threading
import warnings

import numpy as np
import pytest

import fastensor
import fastensor.numpy as ftn

REPLACEMENTS = int(os.environ.get("FT_REPLACEMENTS", "300"))


def version(v, n=6, size=64 << 10):
    """Version ``v``: its own bytes and its own layout (tensor sizes differ by version, so one
    version's header applied to another's bytes yields tensors of neither)."""
    rng = np.random.default_rng(1000 + v)
    return {f"t{i}": rng.integers(0, 255, size + 4096 * i + 12288 * v * (i % 2), dtype=np.uint8)
            for i in range(n)}


def which(loaded, versions):
    """The version every tensor of ``loaded`` comes from, or None for a mix."""
    for v, want in versions.items():
        if loaded.keys() == want.keys() and all(np.array_equal(loaded[k], want[k]) for k in want):
            return v
    return None


@pytest.mark.parametrize("mmap", [True, False], ids=["mapped", "read"])
def test_loads_never_mix_a_replaced_file(tmp, mmap):
    path = os.path.join(tmp, "m.safetensors")
    versions = {v: version(v) for v in (0, 1)}
    ftn.save_file(versions[0], path)
    ftn.load_file(path)  # cached, so the mapped path is taken
    done = threading.Event()
    errors = []

    def writer():
        try:
            for i in range(REPLACEMENTS):
                ftn.save_file(versions[(i + 1) % 2], path)
        except Exception as e:  # reported below
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=writer)
    t.start()
    loads = mixed = 0
    while not done.is_set() or loads < 50:
        got = ftn.load_file(path, mmap=mmap)
        loads += 1
        if which(got, versions) is None:
            mixed += 1
    t.join()
    assert not errors
    print(f"{loads} loads against {REPLACEMENTS} replacements: {mixed} mixed")
    assert mixed == 0


def test_a_save_replaces_the_other_form(tmp):
    path = os.path.join(tmp, "model.safetensors")
    a, b = version(0), version(1)
    ftn.save_file(a, path, shard_size=100 << 10)
    assert os.path.exists(path + ".index.json")
    ftn.save_file(b, path)
    assert sorted(os.listdir(tmp)) == ["model.safetensors"]
    assert which(ftn.load_file(tmp), {1: b}) == 1
    ftn.save_file(a, path, shard_size=100 << 10)
    names = sorted(os.listdir(tmp))
    assert "model.safetensors" not in names and "model.safetensors.index.json" in names
    assert all(n.startswith("model-0000") for n in names if n != "model.safetensors.index.json")
    assert which(ftn.load_file(tmp), {0: a}) == 0


def test_gc_removes_dead_saves_only(tmp):
    path = os.path.join(tmp, "model.safetensors")
    ftn.save_file(version(0), path, shard_size=100 << 10)
    before = sorted(os.listdir(tmp))
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    junk = [f"model.safetensors.fastensor-tmp-{pid}-0",
            "model-00003-of-00007.deadbeef.safetensors"]
    for j in junk:
        open(os.path.join(tmp, j), "wb").close()
    removed = fastensor.gc(tmp)
    assert sorted(os.path.basename(r) for r in removed) == sorted(junk)
    assert sorted(os.listdir(tmp)) == before
    with pytest.raises(NotADirectoryError):
        fastensor.gc(path + ".index.json")


def test_fifo_is_refused(tmp):
    p = os.path.join(tmp, "fifo.safetensors")
    os.mkfifo(p)
    with pytest.raises(ValueError, match="not a regular file"):
        ftn.load_file(p)


def test_truncation_is_named(tmp):
    p = os.path.join(tmp, "t.safetensors")
    ftn.save_file(version(0, n=2), p)
    size = os.path.getsize(p)
    os.truncate(p, size - 1000)
    with pytest.raises(ValueError, match="truncated.*1000 missing"):
        ftn.load_file(p)


def test_warning_after_commit_is_a_warning_not_an_error(tmp, monkeypatch):
    # A directory whose fsync fails cannot be made here without faults; the C tests inject
    # it. What Python adds is the translation: FT_SAVE_WARNING becomes a SaveWarning.
    from fastensor import _ckpt
    calls = []
    monkeypatch.setattr(_ckpt._C, "ckpt_save", lambda *a: calls.append(a) or "fsync failed")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _ckpt.save(os.path.join(tmp, "x.safetensors"), [], None)
    assert calls and any(issubclass(x.category, fastensor.SaveWarning) for x in w)


def test_cli_escapes_control_characters(tmp):
    import subprocess
    cli = os.path.join(os.environ.get("BUILD", "build"), "fastensor")
    if not os.path.exists(cli):
        pytest.skip(f"no CLI at {cli} (make builds it)")
    p = os.path.join(tmp, "names.safetensors")
    ftn.save_file({"evil\x1b[2J\x07name": np.zeros(4, np.float32)}, p,
                  metadata={"k\x1b": "v\r\n"})
    out = subprocess.run([cli, "inspect", p], capture_output=True, text=True, check=True).stdout
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "evil\\x1b[2J\\x07name" in out and "k\\x1b = v\\x0d\\x0a" in out


def _fds_settle(want, seconds=5.0):
    """The process's descriptor count once it is back to ``want`` (the library's pool drops
    the references to replaced files just after the call returns), or as it is then."""
    import time
    deadline = time.monotonic() + seconds
    while True:
        n = len(os.listdir("/proc/self/fd"))
        if n <= want or time.monotonic() > deadline:
            return n
        time.sleep(0.01)


def test_install_replaces_a_file_atomically(tmp):
    """_ckpt.install (DCP's small files; ft_file_install) replaces the file at a name by one
    rename, the replaced file's last reference dropped by the library's pool (its blocks
    freed off the caller's path: tests/test_ckpt.c checks that the drop is not the caller's);
    a failed install keeps the old file and leaves no temporary or descriptor; a name that is
    a link is replaced as a name (the link's target is untouched)."""
    from fastensor import _ckpt
    path = os.path.join(tmp, "x.bin")
    with open(path, "wb") as f:
        f.write(b"old" * 1000)
    # the library's pool started before the count, by an install that replaces nothing (so
    # no dropped reference is still on its way out when the count is taken)
    warm = os.path.join(tmp, "warm.bin")
    _ckpt.install(warm, b"warm")
    os.remove(warm)
    fds = len(os.listdir("/proc/self/fd"))
    for data, sync in ((b"new", True), (b"", False), (b"x" * 100000, True)):
        _ckpt.install(path, data, sync=sync)
        with open(path, "rb") as f:
            assert f.read() == data
    assert _fds_settle(fds) == fds
    # a failed install (the directory is gone from under the name): nothing left anywhere
    with pytest.raises(FileNotFoundError):
        _ckpt.install(os.path.join(tmp, "no-such-dir", "y.bin"), b"data")
    os.chmod(tmp, 0o500)
    try:
        if os.geteuid() != 0:  # (root writes anyway)
            with pytest.raises(PermissionError):
                _ckpt.install(path, b"denied")
    finally:
        os.chmod(tmp, 0o700)
    with open(path, "rb") as f:
        assert f.read() == b"x" * 100000
    assert os.listdir(tmp) == ["x.bin"]
    assert _fds_settle(fds) == fds
    # a link at the name: the name is replaced, the target keeps its bytes
    target = os.path.join(tmp, "target.bin")
    with open(target, "wb") as f:
        f.write(b"target")
    link = os.path.join(tmp, "link.bin")
    os.symlink(target, link)
    _ckpt.install(link, b"via link")
    assert not os.path.islink(link)
    with open(link, "rb") as f:
        assert f.read() == b"via link"
    with open(target, "rb") as f:
        assert f.read() == b"target"


def test_remove_frees_the_file_off_the_callers_path(tmp):
    """_ckpt.remove (DCP's removal of a replaced checkpoint's data files; ft_file_remove)
    unlinks a file, its last reference dropped by the library's pool; a missing file is
    FileNotFoundError; no descriptor is leaked, hundreds of files at once included."""
    from fastensor import _ckpt
    path = os.path.join(tmp, "old.bin")
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    fds = _fds_settle(len(os.listdir("/proc/self/fd")))
    _ckpt.remove(path)
    assert not os.path.exists(path)
    with pytest.raises(FileNotFoundError):
        _ckpt.remove(path)
    assert _fds_settle(fds) == fds
    for i in range(200):
        p = os.path.join(tmp, f"many{i}.bin")
        with open(p, "wb") as f:
            f.write(b"y" * 4096)
        _ckpt.remove(p)
    assert _fds_settle(fds) == fds
    assert os.listdir(tmp) == []
