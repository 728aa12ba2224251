/* libFuzzer target: the index parser (weight map, shard names). The input is the index file,
 * read through the library from a memfd. */
#include "../../src/ckpt/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ft_ctx *ctx;
    if (!ctx && ft_ctx_create(&ctx, NULL) < 0)
        abort();
    int fd = memfd_create("index", MFD_CLOEXEC);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ft__json_doc *root;
    const char **names;
    size_t n;
    if (ft__index_read(ctx, path, &root, &names, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            if (!ft__plain_name(names[i], strlen(names[i])) ||
                (i && strcmp(names[i - 1], names[i]) >= 0)) /* sorted, distinct, plain */
                __builtin_trap();
        free(names);
        ft__json_free(root);
    }
    close(fd);
    return 0;
}
