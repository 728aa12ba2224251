/* fastensor convert: a checkpoint to a .fst container or a safetensors file, byte-exact. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static int usage(FILE *out, int status)
{
    fprintf(out, "usage: fastensor convert SRC DST [--compression auto|always|none] "
                 "[--engine E]\n\n"
                 "Converts a checkpoint byte-exactly, keeping its metadata: to a compressed "
                 ".fst container\nwhere DST ends in .fst (--compression: auto codes float "
                 "tensors where coding pays on\nthis machine and disk, always codes each, none "
                 "stores them), else to a safetensors file.\nSRC is either (a file, index or "
                 "directory). Holds the tensors in host memory; DST is\ninstalled atomically "
                 "(a failed convert leaves what was there).\n");
    return status;
}

int cmd_convert(int argc, char **argv)
{
    static const struct option opts[] = {{"compression", required_argument, NULL, 'c'},
                                         {"engine", required_argument, NULL, 'e'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    static const char *const modes[] = {"auto", "always", "none"};
    ft_save_opts so = {.engine = FT_ENGINE_AUTO};
    ft_load_opts lo = {.engine = FT_ENGINE_AUTO};
    int c, e;
    while ((c = getopt_long(argc, argv, "c:e:h", opts, NULL)) != -1) {
        if (c == 'e' && (e = ft_engine_from_name(optarg)) >= 0) {
            so.engine = lo.engine = (ft_engine)e;
            continue;
        }
        for (e = 0; c == 'c' && e < FT_COMPRESS_COUNT && strcmp(optarg, modes[e]); e++)
            ;
        if (c == 'c' && e < FT_COMPRESS_COUNT) {
            so.compression = (ft_compression)e;
            continue;
        }
        return usage(c == 'h' ? stdout : stderr, c == 'h' ? EXIT_OK : EXIT_USAGE);
    }
    if (optind != argc - 2) {
        cli_error("convert", "expected SRC and DST (see --help)");
        return EXIT_USAGE;
    }
    const char *src = argv[optind], *dst = argv[optind + 1];
    size_t n = strlen(dst);
    if (so.compression != FT_COMPRESS_AUTO && !(n > 4 && !strcmp(dst + n - 4, ".fst"))) {
        cli_error("convert", "--compression is for a .fst DST");
        return EXIT_USAGE;
    }
    ft_ctx *ctx = NULL;
    ft_ckpt *ck = NULL;
    int rc = ft_ctx_create(&ctx, NULL);
    if (rc == 0)
        rc = ft_ckpt_open(ctx, &ck, src);
    if (rc == 0)
        rc = ft_ckpt_load_all(ck, &lo);
    size_t count = ck ? ft_ckpt_count(ck) : 0, nmeta = ck ? ft_ckpt_metadata_count(ck) : 0;
    ft_tensor *t = rc == 0 ? calloc(count + 1, sizeof *t) : NULL;
    const char **meta = rc == 0 ? calloc(2 * nmeta + 1, sizeof *meta) : NULL;
    if (rc == 0 && (!t || !meta))
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < count; i++) {
        ft_tensor_info info;
        ft_ckpt_info(ck, i, &info);
        t[i] = (ft_tensor){.name = info.name, .dtype = info.dtype, .ndim = info.ndim,
                           .shape = info.shape,
                           .data = ft_host_buf((void *)ft_ckpt_data(ck, i),
                                               (size_t)info.nbytes)};
    }
    for (size_t i = 0; rc == 0 && i < nmeta; i++)
        ft_ckpt_metadata(ck, i, &meta[2 * i], &meta[2 * i + 1]);
    so.metadata = meta;
    if (rc == 0)
        rc = ft_ckpt_save(ctx, dst, t, count, &so);
    if (rc < 0)
        cli_error("convert", "%s", rc == -ENOMEM && !*ft_last_error() ? "out of memory"
                                                                    : ft_last_error());
    else if (rc == FT_SAVE_WARNING)
        cli_error("convert", "warning: %s", ft_last_error());
    else
        printf("%s -> %s: %zu tensors\n", src, dst, count);
    free(t);
    free(meta);
    ft_ckpt_close(ck);
    ft_ctx_destroy(ctx);
    return rc < 0 ? EXIT_ERR : EXIT_OK;
}
