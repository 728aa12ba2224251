/*
 * The tensors of a save, checked (names, dtypes, shapes against their bytes, memory), and
 * safetensors' order of laying them out.
 */
#include "ckpt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ft__tensors_check(const ft_tensor *t, size_t n, const char *const *meta, bool fst,
                      bool coded)
{
    const char **names = malloc((n ? n : 1) * sizeof *names);
    if (!names)
        return ft__err(-ENOMEM, "tensor names");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *nm = t[i].name;
        uint64_t bytes = 0;
        int sized = 0;
        if (!nm || !ft__utf8_valid(nm, strlen(nm)) || strcmp(nm, "__metadata__") == 0 ||
            (fst && strcmp(nm, "fastensor.container") == 0))
            rc = ft__err(-EINVAL, "tensor %zu: name missing, not UTF-8, or reserved", i);
        else if (!ft_dtype_bits(t[i].dtype))
            rc = ft__err(-EINVAL, "tensor '%s': unknown dtype %d", nm, (int)t[i].dtype);
        else if (t[i].ndim > FT_MAX_DIMS || (t[i].ndim && !t[i].shape))
            rc = ft__err(-EINVAL, "tensor '%s': bad shape (%u dimensions)", nm, t[i].ndim);
        else if ((sized = ft__tensor_bytes(t[i].dtype, t[i].shape, t[i].ndim, &bytes)) < 0)
            rc = ft__err(-EINVAL, "tensor '%s': %s", nm,
                         sized == -EDOM ? "its packed elements do not fill whole bytes"
                                        : "size overflows");
        else if (coded)
            ; /* (its data is not read: its stream is) */
        else if (t[i].data.kind != FT_MEM_HOST && t[i].data.kind != FT_MEM_CUDA)
            rc = ft__err(-EINVAL, "tensor '%s': memory kind %d not supported", nm,
                         (int)t[i].data.kind);
        else if (t[i].data.kind == FT_MEM_CUDA && !ft_cuda_available(NULL))
            rc = ft__err(-ENODEV, "tensor '%s': device memory, but CUDA is not available", nm);
        if (rc == 0 && bytes != t[i].data.len)
            rc = ft__err(-EINVAL, "tensor '%s': shape x dtype is %llu bytes, buffer has %zu",
                         nm, (unsigned long long)bytes, t[i].data.len);
        if (rc == 0 && bytes && !t[i].data.ptr && !coded)
            rc = ft__err(-EFAULT, "tensor '%s': data pointer is NULL", nm);
        names[i] = nm;
    }
    if (rc == 0) { /* unique names */
        qsort(names, n, sizeof *names, (int (*)(const void *, const void *))strcmp);
        for (size_t i = 1; i < n && rc == 0; i++)
            if (strcmp(names[i - 1], names[i]) == 0)
                rc = ft__err(-EINVAL, "tensor name '%s' appears twice", names[i]);
    }
    free(names);
    for (size_t i = 0; rc == 0 && meta && meta[i]; i += 2)
        if (!meta[i + 1] || !ft__utf8_valid(meta[i], strlen(meta[i])) ||
            !ft__utf8_valid(meta[i + 1], strlen(meta[i + 1])) ||
            strncmp(meta[i], "fastensor.", 10) == 0)
            rc = ft__err(-EINVAL, "metadata entry %zu: needs a UTF-8 key (not fastensor.*) "
                                  "and value", i / 2);
    return rc;
}

/* safetensors' layout order: the highest dtype rank first (larger elements first: each
 * tensor then sits aligned to its element size), then by name (a loop over the sorted names
 * reads the file front to back). */
int ft__tensor_layout_cmp(const void *a, const void *b)
{
    const ft_tensor *x = &((const ft__placed *)a)->t, *y = &((const ft__placed *)b)->t;
    unsigned rx = ft_dtype_rank(x->dtype), ry = ft_dtype_rank(y->dtype);
    return rx != ry ? (rx < ry ? 1 : -1) : strcmp(x->name, y->name);
}
