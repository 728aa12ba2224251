/* libFuzzer target: the AUTO profile parser. */
#include "../../src/select/select.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ft__selector *sel;
    if (ft__sel_create(&sel, 8) < 0)
        abort();
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    ft__sel_parse(sel, text, "fuzz", "fuzz-tag");
    free(text);
    ft__sel_destroy(sel);
    return 0;
}
