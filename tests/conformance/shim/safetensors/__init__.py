# `safetensors` mapped onto fastensor for the conformance run: names re-exported, nothing else.
from fastensor import (  # noqa: F401
    SafetensorError, TensorSpec, __version__, _safe_open_handle, deserialize, safe_open,
    serialize, serialize_file)
