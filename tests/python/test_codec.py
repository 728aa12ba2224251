"""The tensor codec through the extension (fastensor._C.codec_*): byte-exact round trips of
torch tensors of every float dtype, and errors as Python exceptions."""
import pytest

torch = pytest.importorskip("torch")

from fastensor import _C, context  # noqa: E402


def encode(t, block=0):
    n = t.numel() * t.element_size()
    buf = torch.empty(max(1, _C.codec_bound(n, t.element_size(), block)), dtype=torch.uint8)
    m = _C.codec_encode(context(), t.data_ptr(), n, t.element_size(), block, 0, buf.data_ptr(),
                        buf.numel())
    return buf[:m]


def decode_into(stream, like):
    out = torch.empty_like(like)
    n = _C.codec_decode(context(), stream.numpy(), out.data_ptr(),
                        out.numel() * out.element_size())
    assert n == out.numel() * out.element_size()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32,
                                   torch.float64, torch.float8_e4m3fn])
@pytest.mark.parametrize("n", [0, 1, 1000, (1 << 20) + 3])
def test_round_trip(dtype, n):
    g = torch.Generator().manual_seed(n)
    t = (torch.randn(n, generator=g) * 0.05).to(dtype)
    if n > 10:
        t.view(torch.uint8)[:8] = torch.tensor([0xff, 0x7f, 0, 0x80, 1, 0, 0x7f, 0x80],
                                               dtype=torch.uint8)  # NaN, -0, subnormal bits
    s = encode(t)
    assert _C.codec_size(s.numpy()) == n * t.element_size()
    back = decode_into(s, t)
    assert torch.equal(back.view(torch.uint8), t.view(torch.uint8))
    if n > 1000 and dtype in (torch.bfloat16, torch.float16):  # the exponent byte: ~2-4 bits
        assert s.numel() < (0.75 if dtype == torch.bfloat16 else 0.85) * n * t.element_size()


def test_errors():
    t = torch.randn(4096)
    s = encode(t)
    with pytest.raises(ValueError, match="magic"):
        _C.codec_decode(context(), b"x" * 64, t.data_ptr(), 16384)
    bad = s.clone()
    bad[-100] ^= 0x10
    with pytest.raises(ValueError, match="checksum|corrupt"):
        decode_into(bad, t)
    with pytest.raises(ValueError, match="element size"):
        _C.codec_encode(context(), t.data_ptr(), 16384, 3, 0, 0, s.data_ptr(), s.numel())
    with pytest.raises(OSError):
        _C.codec_decode(context(), s.numpy(), t.data_ptr(), 100)  # room too small: ENOSPC
