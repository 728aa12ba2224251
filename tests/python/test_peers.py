"""bench/peers.py: its fingerprint catches changed, moved and missing bytes, and a run end to
end gives every tool a figure (or a reason), and none to a tool whose bytes differ."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import peers  # noqa: E402


def test_fingerprint_sees_every_byte():
    g = torch.Generator().manual_seed(3)
    t = torch.randint(-32768, 32768, (3, 70001), dtype=torch.int16, generator=g)
    fp = peers.fingerprint(t.view(torch.bfloat16))
    assert fp == peers.fingerprint(t.clone().view(torch.bfloat16))
    assert fp[:2] == ["bfloat16", [3, 70001]]
    changed = t.clone()
    changed.view(-1)[123456] ^= 1
    assert peers.fingerprint(changed.view(torch.bfloat16)) != fp
    base = t.clone().view(-1)
    base[10], base[11] = 1, 2
    moved = base.clone()
    moved[10], moved[11] = 2, 1  # the same bytes, two of them swapped
    assert peers.fingerprint(moved) != peers.fingerprint(base)
    assert peers.fingerprint(t.view(torch.bfloat16)[:, :-1]) != fp
    assert peers.fingerprint(t.view(torch.float16)) != fp  # the dtype is part of it


def run(tmp, *extra):
    out = os.path.join(tmp, "peers.json")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "peers.py"), "--size", "8M",
                        "--rounds", "1", "--dir", tmp, "--json", out, *extra],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    with open(out) as f:
        return json.load(f), p.stdout


def test_a_run_end_to_end(tmp):
    res, text = run(tmp, "--tools", "fastensor,safetensors,instanttensor", "--rows", "warm")
    assert res["tools"] == ["fastensor", "safetensors"]
    assert res["skipped"]["instanttensor"] == "CUDA only"
    for tool in ("fastensor", "safetensors"):
        (gbps,) = res["samples"]["warm"][tool]
        assert gbps and gbps > 0
    assert "| warm |" in text


def test_other_bytes_get_no_figure(tmp, monkeypatch):
    """A loader that hands back other bytes (here: the fingerprints it is checked against say
    so) is reported, not measured."""
    monkeypatch.setenv("PEERS_TAMPER", "1")
    res, _ = run(tmp, "--tools", "fastensor", "--rows", "warm")
    assert res["samples"]["warm"]["fastensor"] == [None]
    assert "other bytes than written" in res["skipped"]["fastensor warm"]


def test_tools_with_settings(tmp):
    assert peers.parse_tool("fastensor") == ("fastensor", None)
    assert peers.parse_tool("fastensor-bypass:FASTENSOR_THREADS=3+FASTENSOR_ENGINE=posix") == \
        ("fastensor-bypass", {"env": {"FASTENSOR_THREADS": "3", "FASTENSOR_ENGINE": "posix"}})
    assert peers.parse_tool("raw:jobs=4+bs=4M") == ("raw", {"fio": {"jobs": "4", "bs": "4M"}})
    env = peers.env_for("fastensor:FASTENSOR_THREADS=3", {"env": {"FASTENSOR_THREADS": "3"}},
                        str(tmp))
    assert env["FASTENSOR_THREADS"] == "3"
    assert env["FASTENSOR_PROFILE"].endswith("profile-fastensor:FASTENSOR_THREADS=3")
    env = peers.env_for("fastensor:PYTHONPATH=/a/b", {}, str(tmp))  # (a profile in the run's
    assert os.path.dirname(env["FASTENSOR_PROFILE"]) == str(tmp)    # directory, not below it)
    # a setting that the library refuses fails that tool's loads, which the run reports
    res, _ = run(tmp, "--tools", "fastensor:FASTENSOR_THREADS=2,fastensor:FASTENSOR_THREADS=5000",
                 "--rows", "warm")
    (gbps,) = res["samples"]["warm"]["fastensor:FASTENSOR_THREADS=2"]
    assert gbps and gbps > 0
    assert res["samples"]["warm"]["fastensor:FASTENSOR_THREADS=5000"] == [None]
    assert "threads=5000 is above 4096" in res["skipped"]["fastensor:FASTENSOR_THREADS=5000 warm"]
