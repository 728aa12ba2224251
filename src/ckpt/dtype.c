/* safetensors element types (the library's table: Python reads it through _C.DTYPES). */
#include "ckpt.h"

#include <errno.h>
#include <string.h>

/* name, bits of an element, the element size a .fst save codes its bytes by (a float type's
 * byte planes carry structure: its exponent bytes repeat; complex64 by its floats; 0 for
 * types stored as they are: integers, booleans, packed sub-byte types), and the type's rank
 * in safetensors' layout order (its Dtype enum: a save lays tensors out from the highest
 * rank down, each rank by name, so every tensor sits aligned to its element) */
static const struct {
    const char *name;
    unsigned bits;
    unsigned coded;
    unsigned rank;
} dtypes[FT_DTYPE_COUNT] = {
    [FT_DTYPE_BOOL] = {"BOOL", 8, 0, 0},          [FT_DTYPE_U8] = {"U8", 8, 0, 4},
    [FT_DTYPE_I8] = {"I8", 8, 0, 5},              [FT_DTYPE_F8_E5M2] = {"F8_E5M2", 8, 1, 6},
    [FT_DTYPE_F8_E4M3] = {"F8_E4M3", 8, 1, 7},    [FT_DTYPE_F8_E8M0] = {"F8_E8M0", 8, 1, 8},
    [FT_DTYPE_I16] = {"I16", 16, 0, 11},           [FT_DTYPE_U16] = {"U16", 16, 0, 12},
    [FT_DTYPE_F16] = {"F16", 16, 2, 13},           [FT_DTYPE_BF16] = {"BF16", 16, 2, 14},
    [FT_DTYPE_I32] = {"I32", 32, 0, 15},           [FT_DTYPE_U32] = {"U32", 32, 0, 16},
    [FT_DTYPE_F32] = {"F32", 32, 4, 17},           [FT_DTYPE_C64] = {"C64", 64, 4, 18},
    [FT_DTYPE_F64] = {"F64", 64, 8, 19},           [FT_DTYPE_I64] = {"I64", 64, 0, 20},
    [FT_DTYPE_U64] = {"U64", 64, 0, 21},           [FT_DTYPE_F4] = {"F4", 4, 0, 1},
    [FT_DTYPE_F6_E2M3] = {"F6_E2M3", 6, 0, 2},    [FT_DTYPE_F6_E3M2] = {"F6_E3M2", 6, 0, 3},
    [FT_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, 1, 9},
    [FT_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, 1, 10},
};

unsigned ft_dtype_rank(ft_dtype d)
{
    return (unsigned)d < FT_DTYPE_COUNT ? dtypes[d].rank : 0;
}

unsigned ft__dtype_coded(ft_dtype d)
{
    return (unsigned)d < FT_DTYPE_COUNT ? dtypes[d].coded : 0;
}

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
    unsigned bits = ft_dtype_bits(d);
    return bits % 8 ? 0 : bits / 8;
}

unsigned ft_dtype_bits(ft_dtype d)
{
    return (unsigned)d < FT_DTYPE_COUNT ? dtypes[d].bits : 0;
}

int ft__tensor_bytes(ft_dtype d, const uint64_t *shape, unsigned ndim, uint64_t *bytes)
{
    uint64_t bits = ft_dtype_bits(d);
    if (!bits)
        return -EINVAL;
    for (unsigned i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(bits, shape[i], &bits))
            return -EOVERFLOW;
    if (bits % 8)
        return -EDOM;
    *bytes = bits / 8;
    return 0;
}
