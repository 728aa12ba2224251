"""safe_open for the frameworks fastensor has no layer of its own for (TensorFlow, JAX/Flax,
MLX, Paddle): the numpy handle's arrays, handed to the framework (imported when first
needed, as safetensors does)."""
from __future__ import annotations

import importlib


def _to(module, function):
    def convert(arr):
        return getattr(importlib.import_module(module), function)(arr)
    return convert


CONVERTERS = {"tf": _to("tensorflow", "convert_to_tensor"),
              "tensorflow": _to("tensorflow", "convert_to_tensor"),
              "flax": _to("jax.numpy", "asarray"), "jax": _to("jax.numpy", "asarray"),
              "mlx": _to("mlx.core", "array"), "paddle": _to("paddle", "to_tensor")}


class Converted:
    """A numpy ``safe_open`` handle whose tensors come as ``framework``'s."""

    def __init__(self, handle, framework):
        self._h, self._convert = handle, CONVERTERS[framework]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getattr__(self, name):  # keys, offset_keys, metadata, close, ...
        return getattr(self._h, name)

    def get_tensor(self, name):
        return self._convert(self._h.get_tensor(name))

    def get_tensors(self, *args, **kwargs):
        return {k: self._convert(v) for k, v in self._h.get_tensors(*args, **kwargs).items()}

    def get_slice(self, name):
        return _Slice(self._h.get_slice(name), self._convert)


class _Slice:
    def __init__(self, s, convert):
        self._s, self._convert = s, convert

    def __getattr__(self, name):  # get_shape, get_dtype, __len__
        return getattr(self._s, name)

    def __getitem__(self, key):
        return self._convert(self._s[key])
