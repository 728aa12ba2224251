/* Runs a fuzz target's LLVMFuzzerTestOneInput over files (its corpus) without libFuzzer: the
 * corpus as regression tests in `make test`. Exit 0 when every input ran. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            return 1;
        }
        uint8_t *buf = malloc(1 << 24);
        size_t n = fread(buf, 1, 1 << 24, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        free(buf);
    }
    printf("%d inputs replayed\n", argc - 1);
    return 0;
}
