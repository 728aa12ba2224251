/* fastensor: command-line front end. Exit codes: 0 ok, 1 error, 2 usage. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"info", cmd_info, "what this machine and filesystem offer (io_uring, O_DIRECT, ...)"},
    {"bench", cmd_bench, "measure engines x read/write x block sizes x cache state"},
    {"demo", cmd_demo, "a saved model, per engine: a cold, a 2nd and a 2-process load"},
    {"inspect", cmd_inspect, "list a checkpoint's tensors, metadata, shards and alignment"},
    {"verify", cmd_verify, "check a checkpoint's block checksums"},
    {"convert", cmd_convert, "a checkpoint to a .fst container or a safetensors file"},
    {"gc", cmd_gc, "remove what interrupted saves left in a directory"},
    {"tune", cmd_tune, "build the AUTO selector's profile for a filesystem"},
    {"profile", cmd_profile, "profile show: print the AUTO selector's dictionary"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: fastensor [--cache auto|keep|bypass] COMMAND [OPTIONS]   "
                 "(fastensor COMMAND --help)\n\n"
                 "Fast tensor I/O between files and memory (version %s).\n\ncommands:\n",
            ft_version());
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n--cache: what the command's transfers leave in the page cache (as "
                 "FASTENSOR_CACHE).\nSettings come from FASTENSOR_THREADS, FASTENSOR_CHUNK_SIZE, "
                 "FASTENSOR_QUEUE_DEPTH,\nFASTENSOR_BOUNCE_SIZE, FASTENSOR_ENGINE and "
                 "FASTENSOR_CACHE.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return EXIT_OK;
    }
    if (!strcmp(argv[1], "--cache")) { /* for every command: its contexts read the variable */
        if (argc < 4 || ft_cache_from_name(argv[2]) < 0) {
            cli_error("fastensor", "--cache takes auto, keep or bypass, then a command");
            return EXIT_USAGE;
        }
        setenv("FASTENSOR_CACHE", argv[2], 1);
        argc -= 2;
        argv += 2;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("fastensor %s\n", ft_version());
        return EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "fastensor: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
