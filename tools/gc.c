/* fastensor gc DIR: remove what interrupted saves left behind. */
#include "cli.h"

#include <getopt.h>
#include <string.h>

static void removed(const char *path, void *arg)
{
    char safe[4096];
    if (!*(const bool *)arg)
        printf("removed %s\n", cli_escape(path, safe, sizeof safe));
}

int cmd_gc(int argc, char **argv)
{
    static const struct option opts[] = {{"quiet", no_argument, NULL, 'q'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    bool quiet = false;
    int c;
    while ((c = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        if (c == 'q') {
            quiet = true;
            continue;
        }
        FILE *out = c == 'h' ? stdout : stderr;
        fprintf(out, "usage: fastensor gc DIR... [--quiet]\n\n"
                     "Remove what saves that died left in each DIR: temporaries "
                     "(*.fastensor-tmp-PID-N) of\nprocesses that are gone, and shards of "
                     "generations that no index lists. A save in\nprogress (its files are "
                     "locked) and every installed checkpoint are left alone.\n");
        return c == 'h' ? EXIT_OK : EXIT_USAGE;
    }
    if (optind >= argc) {
        cli_error("gc", "expected a directory (see --help)");
        return EXIT_USAGE;
    }
    ft_ctx *ctx;
    int rc = ft_ctx_create(&ctx, NULL);
    if (rc < 0) {
        cli_ft_error("gc", "context", rc);
        return EXIT_ERR;
    }
    int status = EXIT_OK;
    for (int i = optind; i < argc; i++) {
        int64_t n = ft_ckpt_gc(ctx, argv[i], removed, &quiet);
        if (n < 0) {
            cli_error("gc", "%s", ft_last_error());
            status = EXIT_ERR;
        } else if (!quiet) {
            printf("%s: %lld file(s) removed\n", argv[i], (long long)n);
        }
    }
    ft_ctx_destroy(ctx);
    return status;
}
