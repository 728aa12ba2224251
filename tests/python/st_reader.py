"""An independent minimal safetensors reader/writer for the tests (json + struct only, no
fastensor code), following the format: u64 little-endian header length, JSON header, data."""
import json
import struct

import numpy as np

DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
          "F16": np.float16, "U32": np.uint32, "I32": np.int32, "F32": np.float32,
          "U64": np.uint64, "I64": np.int64, "F64": np.float64, "C64": np.complex64,
          "BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}


def read(path):
    """-> (header dict, data start, {name: (dtype, shape, raw bytes)})"""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    start = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), blob[start + b:start + e])
    return header, start, out


def write(path, tensors, pad=0):
    """tensors: {name: (dtype_name, shape, bytes)} laid out in order, header unpadded + pad."""
    header, at, chunks = {}, 0, []
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
        chunks.append(raw)
    h = json.dumps(header).encode() + b" " * pad
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))
