/* fastensor info: what this machine and the filesystem holding a path offer. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysinfo.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <unistd.h>

static void info_usage(FILE *out)
{
    fprintf(out, "usage: fastensor info [--path DIR]\n\n"
                 "Kernel, CPUs, memory, io_uring, and for the filesystem holding DIR (default .):\n"
                 "its type, block sizes and whether it accepts O_DIRECT; GPU support status.\n");
}

static const char *fs_name(long type)
{
    switch ((unsigned long)type) {
    case 0xEF53: return "ext2/3/4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794c7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x65735546: return "fuse";
    case 0x2fc12fc1: return "zfs";
    case 0xF2F52010: return "f2fs";
    default: return "other";
    }
}

/* Logical block size of the device behind @p st (sysfs), or 0 when unknown. */
static unsigned device_block_size(const struct statx *st)
{
    char p[128];
    snprintf(p, sizeof p, "/sys/dev/block/%u:%u/queue/logical_block_size", st->stx_dev_major,
             st->stx_dev_minor);
    FILE *f = fopen(p, "r");
    if (!f) { /* a partition: the queue belongs to the parent disk */
        snprintf(p, sizeof p, "/sys/dev/block/%u:%u/../queue/logical_block_size",
                 st->stx_dev_major, st->stx_dev_minor);
        f = fopen(p, "r");
    }
    unsigned v = 0;
    if (f) {
        if (fscanf(f, "%u", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

/* What engine AUTO does with cold reads there (FT_CACHE_AUTO), and why. */
static void print_cache_policy(ft_ctx *ctx, const char *path)
{
    ft_cache_info ci;
    if (ft_cache_policy(ctx, path, FT_MEM_HOST, &ci) < 0) {
        printf("cache       %s\n", ft_last_error());
        return;
    }
    printf("cache       cold reads of data up to %.1f GiB (the file, or its whole checkpoint) go "
           "through the page cache, larger ones O_DIRECT", (double)ci.room / (1u << 30));
    if (ci.prefer_direct)
        printf(";\n            but O_DIRECT all the same on this device: measured cold, buffered "
               "%.2f GB/s against O_DIRECT %.2f\n", ci.buffered_bps / 1e9, ci.direct_bps / 1e9);
    else if (ci.buffered_bps > 0 && ci.direct_bps > 0)
        printf("\n            (measured cold: buffered %.2f GB/s, O_DIRECT %.2f)\n",
               ci.buffered_bps / 1e9, ci.direct_bps / 1e9);
    else
        printf("\n            (buffered and O_DIRECT cold rates not both measured yet: "
               "`fastensor tune` measures them)\n");
}

/* Try O_DIRECT on a scratch file in @p dir. @return NULL when it works, else why not. */
static const char *odirect_probe(const char *dir, char *why, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/.fastensor-odirect-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        snprintf(why, len, "cannot create a scratch file: %s", strerror(errno));
        return why;
    }
    close(fd);
    fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
    int e = errno;
    unlink(path);
    if (fd >= 0) {
        close(fd);
        return NULL;
    }
    snprintf(why, len, "%s", e == EINVAL ? "the filesystem refuses O_DIRECT" : strerror(e));
    return why;
}

int cmd_info(int argc, char **argv)
{
    static const struct option opts[] = {
        {"path", required_argument, NULL, 'p'}, {"help", no_argument, NULL, 'h'}, {0}};
    const char *path = ".";
    int c;
    while ((c = getopt_long(argc, argv, "p:h", opts, NULL)) != -1) {
        if (c == 'p')
            path = optarg;
        else if (c == 'h') {
            info_usage(stdout);
            return EXIT_OK;
        } else {
            info_usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind < argc)
        path = argv[optind];
    struct utsname u;
    uname(&u);
    struct sysinfo si;
    sysinfo(&si);
    printf("fastensor   %s\n", ft_version());
    printf("kernel      %s %s (%s)\n", u.sysname, u.release, u.machine);
    printf("cpus        %ld online\n", sysconf(_SC_NPROCESSORS_ONLN));
    printf("memory      %.1f GiB total, %.1f GiB available\n",
           (double)si.totalram * si.mem_unit / (1u << 30),
           (double)(si.freeram + si.bufferram) * si.mem_unit / (1u << 30));
    printf("page size   %ld\n", sysconf(_SC_PAGESIZE));

    ft_ctx *ctx;
    int rc = ft_ctx_create(&ctx, NULL);
    if (rc < 0) {
        cli_ft_error("info", "cannot create a context", rc);
        return EXIT_ERR;
    }
    ft_config cfg;
    ft_ctx_config(ctx, &cfg);
    const char *why;
    int uring = ft_engine_available(ctx, FT_ENGINE_URING, &why);
    printf("io_uring    %s\n", uring ? "available" : why);
    printf("settings    threads=%u chunk=%zu queue_depth=%u bounce=%zu engine=%s cache=%s\n",
           cfg.threads, cfg.chunk_size, cfg.queue_depth, cfg.bounce_size,
           ft_engine_name(cfg.engine), ft_cache_name(cfg.cache));
    print_cache_policy(ctx, path);
    ft_ctx_destroy(ctx);

    struct statx st; /* (statx: glibc 2.28; stat is a function of glibc 2.33) */
    struct statfs sf;
    if (statx(AT_FDCWD, path, 0, STATX_TYPE, &st) != 0 || statfs(path, &sf) != 0) {
        cli_error("info", "%s: %s", path, strerror(errno));
        return EXIT_ERR;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    if (!S_ISDIR(st.stx_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
    }
    printf("filesystem  %s: %s (0x%lx), block %ld bytes, device %u:%u", path,
           fs_name((long)sf.f_type), (unsigned long)sf.f_type, (long)sf.f_bsize,
           st.stx_dev_major, st.stx_dev_minor);
    unsigned lbs = device_block_size(&st);
    if (lbs)
        printf(", logical block %u", lbs);
    printf(", %.1f GiB free\n", (double)sf.f_bavail * (double)sf.f_bsize / (1u << 30));
    char buf[256];
    const char *od = odirect_probe(dir, buf, sizeof buf);
    printf("O_DIRECT    %s\n", od ? od : "supported");
    char gpu[4096];
    ft_gpu_describe(gpu, sizeof gpu);
    fputs(gpu, stdout);
    ft_energy en;
    ft_energy_sample(&en);
    printf("energy      GPU (NVML): %s, CPU (RAPL powercap): %s\n",
           en.gpu_valid ? "readable" : "not available",
           en.cpu_valid ? "readable" : "not available");
    return EXIT_OK;
}
