"""fastensor.dcp: torch.distributed.checkpoint through fastensor. Multi-process cases run
ranks under torchrun with the gloo backend on the CPU (tests/python/dcp_worker.py)."""
import os
import pickle
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
if not torch.distributed.is_available():
    pytest.skip("this torch was built without torch.distributed", allow_module_level=True)

import fastensor.dcp as fdcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

# DCP re-raises a rank's exception as CheckpointException (a BaseException, not an Exception)
FAIL = (Exception, CheckpointException)
from fastensor.torch import load_file, save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")


def torchrun(nproc, *args, fail=False):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", os.path.join(HERE, "dcp_worker.py")] + list(args)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if fail:
        assert r.returncode != 0, "the killed save exited 0"
    else:
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r.stdout + r.stderr


def assert_same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert isinstance(b[k], torch.Tensor), k
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert torch.equal(a[k].view(torch.uint8) if a[k].dim() else a[k],
                               b[k].view(torch.uint8) if b[k].dim() else b[k]), k
        else:
            assert a[k] == b[k], k


def loaded(path):
    return torch.load(path, weights_only=False)


def test_save_at_4_load_at_2_and_1_byte_exact_against_dcp_default(tmp):
    ft, ref = os.path.join(tmp, "ft"), os.path.join(tmp, "default")
    exp = os.path.join(tmp, "expected.pt")
    torchrun(4, "save", exp, "--path", ft, "--default-path", ref)
    names = sorted(os.listdir(ft))
    assert names[0] == ".metadata" and len([n for n in names if n.endswith(".safetensors")]) == 4
    expected = loaded(exp)
    outs = {}
    for world, extra in ((2, []), (2, ["--default"]), (1, []), (2, ["--columns"]),
                         (2, ["--columns", "--default"])):
        out = os.path.join(tmp, f"got-{world}-{'-'.join(extra)}.pt")
        path = ref if "--default" in extra else ft
        torchrun(world, "load", out, "--path", path, *extra)
        outs[(world, tuple(extra))] = loaded(out)
    for (world, extra), got in outs.items():
        if "--columns" in extra:
            want = {k: v for k, v in expected.items() if k.startswith("model.")}
            want["step"] = expected["step"]
            assert_same(got, want)
        else:
            assert_same(got, expected)
    assert_same(outs[(2, ())], outs[(2, ("--default",))])
    assert_same(outs[(2, ("--columns",))], outs[(2, ("--columns", "--default"))])


def test_compressed_save_at_4_load_at_2_1_and_by_columns(tmp):
    """compression="always": each rank's tensors in a .fst container, decoded and resharded
    on load as safetensors data files are."""
    ck, exp = os.path.join(tmp, "ck"), os.path.join(tmp, "expected.pt")
    torchrun(4, "save", exp, "--path", ck, "--compression", "always")
    names = os.listdir(ck)
    assert len([n for n in names if n.endswith(".fst")]) == 4
    assert not [n for n in names if n.endswith(".safetensors")]
    expected = loaded(exp)
    for world, extra in ((2, []), (1, []), (2, ["--columns"])):
        out = os.path.join(tmp, f"got-{world}-{'-'.join(extra)}.pt")
        torchrun(world, "load", out, "--path", ck, *extra)
        got = loaded(out)
        if extra:
            want = {k: v for k, v in expected.items() if k.startswith("model.")}
            want["step"] = expected["step"]
            assert_same(got, want)
        else:
            assert_same(got, expected)


def test_compressed_one_process_modes_verify_corruption_consolidate(tmp):
    g = torch.Generator().manual_seed(12)
    s = small_state(8)
    s["wb"] = (torch.randn(256, 512, generator=g) * 0.02).to(torch.bfloat16)  # weights-like
    sizes = {}
    for mode in (None, "none", "auto", "always"):
        ck = os.path.join(tmp, str(mode))
        dcp.save(s, storage_writer=fdcp.FastensorWriter(ck, compression=mode))
        data = [n for n in os.listdir(ck) if n.endswith(".fst" if mode else ".safetensors")]
        assert len(data) == 1, os.listdir(ck)
        sizes[mode] = os.path.getsize(os.path.join(ck, data[0]))
        for verify in (False, True):
            got = zeros_like_state(s)
            dcp.load(got, storage_reader=fdcp.FastensorReader(ck, verify=verify))
            assert_same(flat(got), flat(s))
    assert sizes["always"] < 0.85 * sizes["none"], sizes  # bf16 weights: about 0.67
    # the container is one fastensor reads by itself, and consolidate reads it
    ck = os.path.join(tmp, "always")
    data = os.path.join(ck, [n for n in os.listdir(ck) if n.endswith(".fst")][0])
    tensors = {k: v for k, v in flat(s).items() if isinstance(v, torch.Tensor)}
    assert_same(load_file(data), tensors)
    out = os.path.join(tmp, "full.safetensors")
    assert sorted(fdcp.consolidate(ck, out)) == ["nested.lr", "step"]
    assert_same(load_file(out), tensors)
    # a byte flipped in the coded stream of "wb": verify names the rank, file, item, checksum
    md = pickle.load(open(os.path.join(ck, ".metadata"), "rb"))
    from fastensor import _fst
    entry = _fst.Container(data).entry("wb")
    assert entry.compressed
    c = _fst.Container(data)
    with open(data, "r+b") as f:
        at = c.data_start + entry.stored[0] + (entry.stored[1] - entry.stored[0]) // 2
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    del c
    with pytest.raises(FAIL) as e:
        dcp.load(zeros_like_state(s), storage_reader=fdcp.FastensorReader(ck, verify=True))
    msg = str(e.value)
    name = os.path.basename(data)
    assert "rank 0" in msg and name in msg and "'wb'" in msg and "checksum" in msg, msg
    assert any(k.fqn == "wb" for k in md.storage_data)
    # another save replaces the container and removes it
    dcp.save(s, storage_writer=fdcp.FastensorWriter(ck, compression="always"))
    assert not os.path.exists(data)
    got = zeros_like_state(s)
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck, verify=True))
    assert_same(flat(got), flat(s))


def test_async_save_at_2(tmp):
    ck, exp, out = (os.path.join(tmp, n) for n in ("ck", "exp.pt", "got.pt"))
    log = torchrun(2, "save", exp, "--path", ck, "--async-save")
    assert "async_save blocked" in log
    torchrun(2, "load", out, "--path", ck)
    assert_same(loaded(out), loaded(exp))


@pytest.mark.parametrize("kill", [("1", "data"), ("0", "data"), ("0", "commit")])
def test_killed_save_leaves_the_previous_checkpoint(tmp, kill):
    ck, first, out = (os.path.join(tmp, n) for n in ("ck", "first.pt", "got.pt"))
    torchrun(2, "save", first, "--path", ck)
    meta = open(os.path.join(ck, ".metadata"), "rb").read()
    torchrun(2, "save", os.path.join(tmp, "second.pt"), "--path", ck, "--seed", "1",
             "--kill-rank", kill[0], "--kill-at", kill[1], fail=True)
    assert open(os.path.join(ck, ".metadata"), "rb").read() == meta
    torchrun(1, "load", out, "--path", ck)
    assert_same(loaded(out), loaded(first))
    # the next save commits, and clears what the killed one left
    third = os.path.join(tmp, "third.pt")
    torchrun(2, "save", third, "--path", ck, "--seed", "2")
    torchrun(2, "load", out, "--path", ck)
    assert_same(loaded(out), loaded(third))
    left = sorted(os.listdir(ck))
    md = pickle.load(open(os.path.join(ck, ".metadata"), "rb"))
    live = {si.relative_path for si in md.storage_data.values()}
    assert left == [".metadata"] + sorted(live), left  # nothing of the killed save is left


# ---- one process (no process group) ----

@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*Detected an existing checkpoint.*")
        yield


def _dcp_passes_metadata_errors():
    import inspect
    from torch.distributed.checkpoint import state_dict_loader
    return "global metadata read failed" in inspect.getsource(state_dict_loader)


def reader_error(pattern):
    """What dcp.load raises when our reader's read_metadata fails: our message, which DCP
    passes on (torch 2.13: "metadata is None; global metadata read failed: ..."); torch
    2.11's loader drops it (logged as a warning) and raises a bare "metadata is None"."""
    return pattern if _dcp_passes_metadata_errors() else f"(?m){pattern}|metadata is None$"


NO_CHECKPOINT = reader_error("no DCP checkpoint here")


def small_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(33, 17, generator=g), "b": torch.randn(17, generator=g).half(),
            "i": torch.randint(0, 100, (5,), generator=g), "e": torch.empty(0, 3),
            "s": torch.tensor(2.5, dtype=torch.float64),
            "bf": torch.randn(8, 8, generator=g).to(torch.bfloat16), "step": 11,
            "nested": {"lr": 0.5, "t": torch.arange(6).reshape(2, 3)}}


def zeros_like_state(s):
    out = {}
    for k, v in s.items():
        if isinstance(v, dict):
            out[k] = zeros_like_state(v)
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)
        else:
            out[k] = None
    return out


def flat(s, prefix=""):
    out = {}
    for k, v in s.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_one_process_round_trip_and_formats(tmp):
    s = small_state()
    ck = os.path.join(tmp, "ck")
    dcp.save(s, storage_writer=fdcp.FastensorWriter(ck))
    got = zeros_like_state(s)
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck))
    assert_same(flat(got), flat(s))
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck, verify=True))
    assert_same(flat(got), flat(s))
    # .metadata is DCP's: FileSystemReader reads it
    md = dcp.FileSystemReader(ck).read_metadata()
    assert "w" in md.state_dict_metadata and md.storage_meta.modules == ["fastensor.dcp"]
    # the rank file is a safetensors file of the tensors, by FQN
    rank_file = [n for n in os.listdir(ck) if n.endswith(".safetensors")]
    assert len(rank_file) == 1
    direct = load_file(os.path.join(ck, rank_file[0]))
    tensors = {k: v for k, v in flat(s).items() if isinstance(v, torch.Tensor)}
    assert_same(direct, tensors)
    # DCP's HuggingFaceStorageReader reads the layout
    hf = pytest.importorskip("torch.distributed.checkpoint").__dict__.get(
        "HuggingFaceStorageReader")
    if hf is not None:
        pytest.importorskip("safetensors")
        into = {k: torch.zeros_like(v) for k, v in tensors.items()}
        dcp.load(into, storage_reader=hf(ck))
        assert_same(into, tensors)


def test_consolidate_and_cli(tmp):
    s = small_state(3)
    ck = os.path.join(tmp, "ck")
    dcp.save(s, storage_writer=fdcp.FastensorWriter(ck))
    out = os.path.join(tmp, "full.safetensors")
    skipped = fdcp.consolidate(ck, out)
    assert sorted(skipped) == ["nested.lr", "step"]
    tensors = {k: v for k, v in flat(s).items() if isinstance(v, torch.Tensor)}
    assert_same(load_file(out), tensors)
    out2 = os.path.join(tmp, "cli.safetensors")
    env = dict(os.environ, PYTHONPATH=PYDIR)
    r = subprocess.run([sys.executable, "-m", "fastensor.dcp", "consolidate", ck, out2],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "left out 2 non-tensor items" in r.stderr
    assert_same(load_file(out2), tensors)
    r = subprocess.run([sys.executable, "-m", "fastensor.dcp", "consolidate",
                        os.path.join(tmp, "nothing"), out2], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 1 and "no DCP checkpoint here" in r.stderr


def test_overwrite_replaces_atomically_and_removes_old_files(tmp):
    ck = os.path.join(tmp, "ck")
    dcp.save(small_state(0), storage_writer=fdcp.FastensorWriter(ck))
    first = sorted(os.listdir(ck))
    foreign = os.path.join(ck, "notes.txt")
    open(foreign, "w").write("mine")
    dcp.save(small_state(1), storage_writer=fdcp.FastensorWriter(ck))
    second = sorted(os.listdir(ck))
    assert len(second) == len(first) + 1 and not set(first[1:]) & set(second)
    assert open(foreign).read() == "mine"
    got = zeros_like_state(small_state(1))
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck))
    assert_same(flat(got), flat(small_state(1)))
    with pytest.raises(FAIL, match="overwrite=False"):
        dcp.save(small_state(2), storage_writer=fdcp.FastensorWriter(ck, overwrite=False))
    got = zeros_like_state(small_state(1))
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck))
    assert_same(flat(got), flat(small_state(1)))


@pytest.mark.parametrize("verify", [False, True])
def test_a_save_during_a_load_leaves_the_load_its_version(tmp, verify):
    """A save replacing the checkpoint after the load read its metadata (and removing the
    old data files) changes nothing for that load: it reads the version it started with."""
    ck = os.path.join(tmp, "ck")
    dcp.save(small_state(0), storage_writer=fdcp.FastensorWriter(ck))
    old_files = {n for n in os.listdir(ck) if n.endswith(".safetensors")}

    class Racing(fdcp.FastensorReader):
        def set_up_storage_reader(self, *a, **k):
            super().set_up_storage_reader(*a, **k)
            dcp.save(small_state(1), storage_writer=fdcp.FastensorWriter(ck))

    got = zeros_like_state(small_state(0))
    dcp.load(got, storage_reader=Racing(ck, verify=verify))
    assert not old_files & set(os.listdir(ck))  # the save did remove them
    assert_same(flat(got), flat(small_state(0)))
    got = zeros_like_state(small_state(1))
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck))
    assert_same(flat(got), flat(small_state(1)))


def test_a_data_file_missing_from_the_start_is_named(tmp):
    ck = os.path.join(tmp, "ck")
    dcp.save(small_state(0), storage_writer=fdcp.FastensorWriter(ck))
    for n in os.listdir(ck):
        if n.endswith(".safetensors"):
            os.unlink(os.path.join(ck, n))
    with pytest.raises(FAIL, match=r"rank 0: .*\.safetensors \(items .*No such file"):
        dcp.load(zeros_like_state(small_state(0)), storage_reader=fdcp.FastensorReader(ck))


def test_reads_dcp_default_writer_checkpoints(tmp):
    s = small_state(4)
    ck = os.path.join(tmp, "ck")
    dcp.save(s, storage_writer=dcp.FileSystemWriter(ck))
    got = zeros_like_state(s)
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck))
    assert_same(flat(got), flat(s))


def test_corruption_and_truncation_name_rank_file_and_item(tmp):
    s = {"w": torch.randn(1 << 16), "v": torch.randn(100)}
    ck = os.path.join(tmp, "ck")
    dcp.save(s, storage_writer=fdcp.FastensorWriter(ck))
    name = [n for n in os.listdir(ck) if n.endswith(".safetensors")][0]
    path = os.path.join(ck, name)
    md = pickle.load(open(os.path.join(ck, ".metadata"), "rb"))
    info = [v for k, v in md.storage_data.items() if k.fqn == "w"][0]
    with open(path, "r+b") as f:
        f.seek(info.offset + 1000)
        b = f.read(1)
        f.seek(info.offset + 1000)
        f.write(bytes([b[0] ^ 0x40]))
    got = {"w": torch.zeros(1 << 16), "v": torch.zeros(100)}
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck))  # unverified: reads the flip
    assert not torch.equal(got["w"], s["w"]) and torch.equal(got["v"], s["v"])
    with pytest.raises(FAIL) as e:
        dcp.load(got, storage_reader=fdcp.FastensorReader(ck, verify=True))
    msg = str(e.value)
    assert "rank 0" in msg and name in msg and "'w'" in msg and "checksum" in msg, msg
    os.truncate(path, info.offset + 10)
    with pytest.raises(FAIL) as e:
        dcp.load(got, storage_reader=fdcp.FastensorReader(ck))
    msg = str(e.value)
    assert "rank 0" in msg and name in msg, msg
    with pytest.raises(FAIL, match=NO_CHECKPOINT):
        dcp.load(got, storage_reader=fdcp.FastensorReader(os.path.join(tmp, "none")))
    open(os.path.join(tmp, "bad"), "w").close()
    os.makedirs(os.path.join(tmp, "badck"))
    open(os.path.join(tmp, "badck", ".metadata"), "wb").write(b"not a pickle")
    with pytest.raises(FAIL, match=reader_error("not a DCP checkpoint")):
        dcp.load(got, storage_reader=fdcp.FastensorReader(os.path.join(tmp, "badck")))


@pytest.mark.parametrize("compression", [None, "always"])
def test_strided_and_dtype_changing_reads(tmp, compression):
    # a plan that reads a box of columns (runs far apart), and a destination of another dtype
    g = torch.Generator().manual_seed(5)
    s = {"m": torch.randn(300, 200, generator=g), "h": torch.randn(64, 64, generator=g)}
    ck = os.path.join(tmp, "ck")
    dcp.save(s, storage_writer=fdcp.FastensorWriter(ck, compression=compression))
    reader = fdcp.FastensorReader(ck)
    md = reader.read_metadata()
    reader.set_up_storage_reader(md, True)
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    class Planner:
        def __init__(self):
            self.dest = {"m": torch.zeros(300, 30), "h": torch.zeros(64, 64,
                                                                     dtype=torch.float64)}

        def resolve_tensor(self, req):
            return self.dest[req.dest_index.fqn]

        def commit_tensor(self, req, t):
            pass

    items = [ReadItem(LoadItemType.TENSOR, MetadataIndex("m", [0, 0]), torch.Size([0, 0]),
                      MetadataIndex("m", [0, 0]), torch.Size([0, 100]), torch.Size([300, 30])),
             ReadItem(LoadItemType.TENSOR, MetadataIndex("h", [0, 0]), torch.Size([0, 0]),
                      MetadataIndex("h", [0, 0]), torch.Size([0, 0]), torch.Size([64, 64]))]
    pl = Planner()
    reader.read_data(LoadPlan(items), pl).wait()
    assert torch.equal(pl.dest["m"], s["m"][:, 100:130])
    assert torch.equal(pl.dest["h"], s["h"].double())


def test_async_staging_reuses_host_copies(tmp):
    s = small_state(6)
    w = fdcp.FastensorWriter(os.path.join(tmp, "a"))
    first = w.stage(s)
    w._unlend()
    second = fdcp.FastensorWriter(os.path.join(tmp, "b")).stage(s)
    assert second["w"].data_ptr() == first["w"].data_ptr()
    assert torch.equal(second["w"], s["w"]) and second["w"].data_ptr() != s["w"].data_ptr()
    busy = fdcp.FastensorWriter(os.path.join(tmp, "c")).stage(s)  # second is still lent
    assert busy["w"].data_ptr() != second["w"].data_ptr()
    fdcp.release_staging_memory()
    fut = dcp.async_save(s, storage_writer=fdcp.FastensorWriter(os.path.join(tmp, "d")))
    fut.result()
    got = zeros_like_state(s)
    dcp.load(got, storage_reader=fdcp.FastensorReader(os.path.join(tmp, "d")))
    assert_same(flat(got), flat(s))


def test_async_staging_takes_the_new_values(tmp):
    """A reused staging copy holds this save's tensors and leaves, never the last save's."""
    fdcp.release_staging_memory()
    s = small_state(7)
    for step in range(3):
        s["step"], s["nested"]["lr"] = step, step / 4
        s["w"].add_(1)
        path = os.path.join(tmp, f"s{step}")
        dcp.async_save(s, storage_writer=fdcp.FastensorWriter(path)).result()
        got = zeros_like_state(s)
        dcp.load(got, storage_reader=fdcp.FastensorReader(path))
        assert_same(flat(got), flat(s))
        assert got["step"] == step and got["nested"]["lr"] == step / 4
    fdcp.release_staging_memory()


def _stage_on_host(monkeypatch, s, compression="always"):
    """Coded staging on the host encoder (it stands for the GPU's, which this machine lacks),
    the writer's memory for it made empty ahead (after a first save, a background coding
    makes it)."""
    monkeypatch.setattr(fdcp, "_codes_on_gpu", lambda tensors, mode: mode not in (None, "none"))
    fdcp.release_staging_memory()
    fdcp._STAGING.give(("fst", fdcp._signature(s)), fdcp._fst.code(".", [], compression)[0])


def coded_state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": (torch.randn(512, 300, generator=g) * 0.02).to(torch.bfloat16),
            "f": torch.randn(40000, generator=g) * 1e-3, "i": torch.arange(7), "step": 2,
            "e": torch.empty(0, 3), "nested": {"h": torch.randn(9, generator=g).half()}}


def test_async_save_stages_coded_streams(tmp, monkeypatch):
    """A compressed async save whose tensors the GPU codes stages their coded streams (in
    memory kept for the next save): the caller's later changes are not in the save, each
    save loads byte-exact, a save without that memory copies."""
    s = coded_state(1)
    _stage_on_host(monkeypatch, s)
    sig = fdcp._signature(s)
    for step in range(3):
        s["step"], s["f"] = step, s["f"] + 1
        w = fdcp.FastensorWriter(os.path.join(tmp, f"s{step}"), compression="always")
        staged = w.stage(s)
        assert w._staged[-1].where == ("coded" if step < 2 else "host")
        want = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in flat(s).items()}
        s["w"].add_(1)  # after staging: not in this save
        dcp.save(staged, storage_writer=w)  # (what async_save's thread does)
        w._unlend()
        s["w"].sub_(1)
        got = zeros_like_state(s)
        dcp.load(got, storage_reader=fdcp.FastensorReader(w.path))
        assert_same(flat(got), want)
        assert [f for f in os.listdir(w.path) if f.endswith(".fst")]
        if step == 0:  # (the streams of these small tensors: one piece of memory)
            kept = fdcp._STAGING.free[("fst", sig)][0]
            assert fdcp._fst.coded_memory(kept) == 64 << 20
        if step == 1:  # without the coded memory: a copy
            fdcp._STAGING.free.pop(("fst", sig))
    # staging="copy": a copy though the memory for coded streams is there
    fdcp._STAGING.give(("fst", sig), fdcp._fst.code(tmp, [], "always")[0])
    w = fdcp.FastensorWriter(os.path.join(tmp, "copy"), compression="always", staging="copy")
    w.stage(s)
    assert w._staged[-1].where == "host"
    w._unlend()
    with pytest.raises(ValueError, match="staging must be"):
        fdcp.FastensorWriter(tmp, staging="coded")
    fdcp.release_staging_memory()


def test_async_save_coded_through_dcp(tmp, monkeypatch):
    """The first save stages a copy; its memory of coded streams is made after it, in the
    background; the next saves stage coded streams."""
    import time
    s = coded_state(2)
    _stage_on_host(monkeypatch, s, "auto")
    key = ("fst", fdcp._signature(s))
    fdcp._STAGING.free.clear()
    for step in range(3):
        if step == 1:
            deadline = time.monotonic() + 60
            while not fdcp._STAGING.free.get(key) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert bool(fdcp._STAGING.free.get(key)) == (step > 0)
        s["step"] = step
        s["f"].add_(1)
        path = os.path.join(tmp, f"a{step}")
        want = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in flat(s).items()}
        fut = dcp.async_save(s, storage_writer=fdcp.FastensorWriter(path, compression="auto"))
        s["f"].add_(100)
        fut.result()
        s["f"].sub_(100)
        got = zeros_like_state(s)
        dcp.load(got, storage_reader=fdcp.FastensorReader(path, verify=True))
        assert_same(flat(got), want)
    assert fdcp._STAGING.free.get(("fst", fdcp._signature(s)))
    fdcp.release_staging_memory()


def test_async_coded_saves_at_2(tmp):
    """Two ranks with the same plain tensors: DCP writes each tensor from one rank, so a
    rank's save writes some of its coded streams."""
    ck, out = os.path.join(tmp, "ck"), os.path.join(tmp, "want.pt")
    log = torchrun(2, "coded", out, "--path", ck)
    assert "rank 0: staged coded,coded" in log and "rank 1: staged coded,coded" in log
    want = loaded(out)
    files = [f for f in os.listdir(ck) if f.endswith(".fst")]
    assert len(files) == 2
    got = {"w": torch.zeros(300, 257, dtype=torch.bfloat16), "v": torch.zeros(1000),
           "i": torch.zeros(7, dtype=torch.long), "step": -1,
           "n": {"x": torch.zeros(64, 33, dtype=torch.half)}}
    dcp.load(got, storage_reader=fdcp.FastensorReader(ck, verify=True))
    assert_same(flat(got), want)


def test_bad_settings_are_refused(tmp):
    with pytest.raises(ValueError):
        fdcp.FastensorWriter(tmp, engine="nope")
    with pytest.raises(ValueError):
        fdcp.FastensorReader(tmp, cache="sometimes")
    with pytest.raises(ValueError, match="compression must be one of"):
        fdcp.FastensorWriter(tmp, compression="zip")
    save_file({"x": torch.zeros(2)}, os.path.join(tmp, "plain.safetensors"))
    with pytest.raises(FAIL, match=NO_CHECKPOINT):
        dcp.load({"x": torch.zeros(2)}, storage_reader=fdcp.FastensorReader(tmp))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda)")
@pytest.mark.parametrize("compression", [None, "always"])
def test_cuda_state_dict_round_trip_against_default(tmp, compression):
    """(compressed: decoded on the GPU into the CUDA destinations, on the host with verify)"""
    g = torch.Generator().manual_seed(9)
    s = {"w": torch.randn(1024, 513, generator=g).cuda(),
         "b": torch.randn(77, generator=g).to(torch.bfloat16).cuda(), "step": 5,
         "host": torch.arange(10)}
    ck, ref = os.path.join(tmp, "ft"), os.path.join(tmp, "default")
    dcp.save(s, storage_writer=fdcp.FastensorWriter(ck, compression=compression))
    dcp.save(s, storage_writer=dcp.FileSystemWriter(ref))
    for reader in (fdcp.FastensorReader(ck), fdcp.FastensorReader(ck, verify=True)):
        got = {"w": torch.zeros_like(s["w"]), "b": torch.zeros_like(s["b"]), "step": 0,
               "host": torch.zeros(10, dtype=torch.long)}
        dcp.load(got, storage_reader=reader)
        torch.cuda.synchronize()
        assert got["w"].is_cuda and torch.equal(got["w"], s["w"])
        assert torch.equal(got["b"], s["b"]) and got["step"] == 5
        assert torch.equal(got["host"], s["host"])
    want = {"w": torch.zeros_like(s["w"]), "b": torch.zeros_like(s["b"]), "step": 0,
            "host": torch.zeros(10, dtype=torch.long)}
    dcp.load(want, storage_reader=dcp.FileSystemReader(ref))
    assert torch.equal(want["w"], got["w"]) and torch.equal(want["b"], got["b"])
    # columns of a CUDA destination: a strided read through a device span
    cols = {"w": torch.zeros(1024, 513, device="cuda")[:, 100:200]}
    fut = dcp.async_save(s, storage_writer=fdcp.FastensorWriter(os.path.join(tmp, "a"),
                                                                 compression=compression))
    fut.result()
    got = {"w": torch.zeros_like(s["w"])}
    dcp.load(got, storage_reader=fdcp.FastensorReader(os.path.join(tmp, "a")))
    assert torch.equal(got["w"], s["w"])
    del cols


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda)")
def test_cuda_async_staging_on_device_then_pinned(tmp):
    """A process's first async save of a CUDA state dict stages on the GPU; the next one
    finds a pinned copy made in the background; both load byte-exact."""
    import time
    fdcp.release_staging_memory()
    g = torch.Generator().manual_seed(3)
    s = {"w": torch.randn(2048, 1000, generator=g).cuda(), "step": 1,
         "b": torch.randn(33, generator=g).to(torch.bfloat16).cuda(), "host": torch.arange(9)}
    sig = fdcp._signature(s)
    where = []
    for step in range(2):
        s["step"] = step
        s["w"].mul_(2)
        w = fdcp.FastensorWriter(os.path.join(tmp, f"c{step}"))
        staged = w.stage(s)
        where.append(w._staged[-1].where)
        assert staged["w"].data_ptr() != s["w"].data_ptr()
        w._unlend()
        deadline = time.monotonic() + 60
        while not fdcp._STAGING.free.get(sig) and time.monotonic() < deadline:
            time.sleep(0.05)  # the pinned copy is made in the background
        kept = fdcp._STAGING.free[sig][0]
        assert all(t.is_pinned() for t in kept if t.numel())
        path = os.path.join(tmp, f"a{step}")
        dcp.async_save(s, storage_writer=fdcp.FastensorWriter(path)).result()
        got = {"w": torch.zeros_like(s["w"]), "b": torch.zeros_like(s["b"]), "step": -1,
               "host": torch.zeros(9, dtype=torch.long)}
        dcp.load(got, storage_reader=fdcp.FastensorReader(path))
        torch.cuda.synchronize()
        assert torch.equal(got["w"], s["w"]) and torch.equal(got["b"], s["b"])
        assert torch.equal(got["host"], s["host"]) and got["step"] == step
    assert where == ["device", "kept"]
    fdcp.release_staging_memory()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda)")
def test_cuda_async_saves_stage_coded_streams(tmp):
    """Compressed async saves of a CUDA state dict whose GPU codes it: the first stages on
    the GPU; the memory of coded streams is made after it; the next ones stage the streams
    the GPU codes; all load byte-exact."""
    import time
    g = torch.Generator().manual_seed(5)
    s = {"w": (torch.randn(4096, 1024, generator=g) * 0.02).to(torch.bfloat16).cuda(),
         "f": (torch.randn(300000, generator=g) * 1e-3).cuda(), "step": 1,
         "host": torch.arange(9)}
    if not fdcp._codes_on_gpu(fdcp._locals(s), "always"):
        pytest.skip("the GPU encoder does not code here (fastensor._fst.gpu_codes)")
    fdcp.release_staging_memory()
    key = ("fst", fdcp._signature(s))
    where = []
    for step in range(3):
        s["step"] = step
        s["w"].add_(1)
        w = fdcp.FastensorWriter(os.path.join(tmp, f"c{step}"), compression="always")
        staged = w.stage(s)
        where.append(w._staged[-1].where)
        want = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
        s["w"].add_(1)  # after staging: not in this save
        dcp.save(staged, storage_writer=w)
        w._unlend()
        s["w"].sub_(1)
        deadline = time.monotonic() + 60
        while not fdcp._STAGING.free.get(key) and time.monotonic() < deadline:
            time.sleep(0.05)  # (after the first save: made in the background)
        kept = fdcp._STAGING.free[key][0]
        assert fdcp._fst.coded_memory(kept) == 64 << 20  # (the streams: one piece of it)
        got = {"w": torch.zeros_like(s["w"]), "f": torch.zeros_like(s["f"]), "step": -1,
               "host": torch.zeros(9, dtype=torch.long)}
        dcp.load(got, storage_reader=fdcp.FastensorReader(w.path))
        torch.cuda.synchronize()
        assert torch.equal(got["w"], want["w"]) and torch.equal(got["f"], want["f"])
        assert torch.equal(got["host"], s["host"]) and got["step"] == step
    assert where == ["device", "coded", "coded"]
    fdcp.release_staging_memory()
