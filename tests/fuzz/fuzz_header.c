/* libFuzzer target: the safetensors header parser. Input: 8 bytes of data-section size
 * (little-endian, capped at 1 TiB) then the header's JSON. */
#include "../../src/ckpt/ckpt.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    uint64_t data_size = 0;
    memcpy(&data_size, data, 8);
    data_size &= (1ull << 40) - 1;
    ft__st_header h;
    if (ft__st_parse((const char *)data + 8, size - 8, data_size, "fuzz", &h) == 0) {
        for (size_t i = 0; i < h.ntensors; i++) /* what a load relies on */
            if (h.tensors[i].end > data_size || h.tensors[i].begin > h.tensors[i].end)
                __builtin_trap();
        ft__st_header_free(&h);
    }
    return 0;
}
