"""Every header length a valid safetensors file can have is read as safetensors, whatever its
first 8 bytes look like (0x580 begins "80 05", a pickle's protocol mark), through every reader:
load_file, safe_open, inspect and verify; files of both libraries' writers; a sharded
transformers save whose shard headers hit such lengths."""
import json
import os
import struct

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
st = pytest.importorskip("safetensors.torch", reason="the safetensors package is not installed")

import fastensor  # noqa: E402
import fastensor.torch as ft  # noqa: E402

PAYLOAD = bytes(range(7, 13))
TENSOR = json.dumps({"t": {"dtype": "U8", "shape": [6], "data_offsets": [0, 6]}},
                    separators=(",", ":")).encode()
# header lengths whose little-endian bytes begin 80 02 .. 80 05 (what a pickle starts with)
PICKLE_LIKE = [0x280, 0x380, 0x480, 0x580]


def padded_file(n):
    """A safetensors file whose header (JSON padded with spaces) is @p n bytes long: one
    6-byte tensor where it fits, no tensor below that."""
    head, data = (TENSOR, PAYLOAD) if n >= len(TENSOR) else (b"{}", b"")
    return struct.pack("<Q", n) + head + b" " * (n - len(head)) + data


def read_every_way(path, tensors):
    """The file's tensors through load_file, safe_open, inspect and verify; @p tensors maps
    each name to its expected bytes."""
    back = ft.load_file(path)
    assert {k: v.numpy().tobytes() for k, v in back.items()} == tensors
    with fastensor.safe_open(path, "pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        for k in f.keys():
            assert f.get_tensor(k).numpy().tobytes() == tensors[k]
    assert sorted(fastensor.inspect(path)["tensors"]) == sorted(tensors)
    assert fastensor.verify(path) in (True, False)  # checks structure; raises if invalid


def test_every_header_length_from_8_to_70000(tmp):
    path = os.path.join(tmp, "h.safetensors")
    failed = []
    for n in range(8, 70001):
        with open(path, "wb") as f:
            f.write(padded_file(n))
        try:
            read_every_way(path, {"t": PAYLOAD} if n >= len(TENSOR) else {})
        except (ValueError, OSError, AssertionError) as e:
            failed.append((n, str(e)[:200]))
    assert not failed, f"{len(failed)} header lengths refused, first: {failed[:4]}"


def test_pickle_like_lengths_read_by_safetensors_too(tmp):
    """The files the test above reads are valid: the real package reads them the same."""
    path = os.path.join(tmp, "h.safetensors")
    for n in PICKLE_LIKE + [8, 9, 4095, 4096, 69999]:
        with open(path, "wb") as f:
            f.write(padded_file(n))
        ours, theirs = ft.load_file(path), st.load_file(path)
        assert {k: v.numpy().tobytes() for k, v in ours.items()} == \
            {k: v.numpy().tobytes() for k, v in theirs.items()}, n


@pytest.mark.parametrize("writer", ["safetensors", "fastensor"])
def test_both_writers_across_header_lengths(tmp, writer):
    """Metadata of every length from 0 to 1,500 characters moves the writer's header through
    every length its padding allows in that range, the pickle-like ones included."""
    save = st.save_file if writer == "safetensors" else ft.save_file
    t = {"w": torch.arange(6, dtype=torch.uint8)}
    path = os.path.join(tmp, "m.safetensors")
    seen = set()
    for k in range(0, 1500):
        save(t, path, metadata={"note": "x" * k})
        with open(path, "rb") as f:
            seen.add(struct.unpack("<Q", f.read(8))[0])
        read_every_way(path, {"w": bytes(range(6))})
    if writer == "safetensors":  # its header lengths are multiples of 8: all of them hit
        assert set(PICKLE_LIKE) <= seen


def test_sharded_gpt2_save_pretrained_loads(tmp):
    """The directory from the bug report: shard 3 of 6 has a 0x580-byte header."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=6, n_embd=512,
                                                                 n_head=8))
    d = os.path.join(tmp, "gpt2")
    model.save_pretrained(d, max_shard_size="20MB")
    shards = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))
    assert len(shards) > 1
    lengths = set()
    for name in shards:
        with open(os.path.join(d, name), "rb") as f:
            lengths.add(struct.unpack("<Q", f.read(8))[0])
    assert lengths & set(PICKLE_LIKE), f"no shard header hits a pickle-like length: {lengths}"
    state = model.state_dict()
    ours = ft.load_file(d)
    theirs = st.load_file(os.path.join(d, shards[0]))
    assert set(theirs) <= set(ours)
    for k, v in ours.items():
        assert torch.equal(v, state[k]), k
    with fastensor.safe_open(d, "pt") as f:
        assert sorted(f.keys()) == sorted(ours)
    for name in shards:
        p = os.path.join(d, name)
        assert fastensor.verify(p) is False  # no checksums: structure checked
        assert fastensor.inspect(p)["tensors"]
