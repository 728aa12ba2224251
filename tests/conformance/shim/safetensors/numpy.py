# `safetensors.numpy` mapped onto fastensor.numpy: names re-exported, nothing else.
from fastensor.numpy import load, load_file, save, save_file  # noqa: F401
