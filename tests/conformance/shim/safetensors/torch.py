# `safetensors.torch` mapped onto fastensor.torch: names re-exported, nothing else.
from fastensor.torch import (  # noqa: F401
    _end_ptr, _filter_shared_not_shared, _find_shared_tensors, _is_complete,
    _remove_duplicate_names, load, load_file, load_model, save, save_file, save_model,
    storage_ptr, storage_size)
