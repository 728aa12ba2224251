/* safetensors element types. */
#include "ckpt.h"

#include <errno.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[FT_DTYPE_COUNT] = {
    [FT_DTYPE_BOOL] = {"BOOL", 1},       [FT_DTYPE_U8] = {"U8", 1},
    [FT_DTYPE_I8] = {"I8", 1},           [FT_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [FT_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [FT_DTYPE_F8_E8M0] = {"F8_E8M0", 1},
    [FT_DTYPE_I16] = {"I16", 2},         [FT_DTYPE_U16] = {"U16", 2},
    [FT_DTYPE_F16] = {"F16", 2},         [FT_DTYPE_BF16] = {"BF16", 2},
    [FT_DTYPE_I32] = {"I32", 4},         [FT_DTYPE_U32] = {"U32", 4},
    [FT_DTYPE_F32] = {"F32", 4},         [FT_DTYPE_C64] = {"C64", 8},
    [FT_DTYPE_F64] = {"F64", 8},         [FT_DTYPE_I64] = {"I64", 8},
    [FT_DTYPE_U64] = {"U64", 8},
};

const char *ft_dtype_name(ft_dtype d)
{
    return (unsigned)d < FT_DTYPE_COUNT ? dtypes[d].name : NULL;
}

int ft_dtype_from_name(const char *name)
{
    for (int d = 0; name && d < FT_DTYPE_COUNT; d++)
        if (strcmp(name, dtypes[d].name) == 0)
            return d;
    return -EINVAL;
}

size_t ft_dtype_size(ft_dtype d)
{
    return (unsigned)d < FT_DTYPE_COUNT ? dtypes[d].size : 0;
}
