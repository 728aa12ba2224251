/* The checksum of checkpoint blocks and codec blocks: xxh3-64. */
#include "base.h"

#include <xxhash.h>

/* libxxhash built with its x86 dispatcher (Debian's and Ubuntu's on amd64) also exports
 * XXH3_64bits_dispatch: the same hash, with AVX2/AVX-512 picked at run time where the
 * baseline XXH3_64bits is SSE2 (a save's staging copy + checksum ran at 8-9 GB/s with it,
 * 13-16 GB/s with the dispatcher on the development VM). Weak, so that a libxxhash without
 * it still loads and the baseline serves. */
XXH64_hash_t XXH3_64bits_dispatch(const void *input, size_t len) __attribute__((weak));

uint64_t ft__csum(const void *data, size_t len)
{
    return XXH3_64bits_dispatch ? XXH3_64bits_dispatch(data, len) : XXH3_64bits(data, len);
}
