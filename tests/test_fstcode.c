/* .fst streams coded ahead of their save (ft_fst_code): the save writes the very file a save
 * that codes writes; names are the save's, tensor i takes stream i (or the one it names:
 * some of the streams saved); the memory is packed, kept, grown, trimmed; mismatched tensors
 * and bad arguments refused, the old file intact. */
#include "testlib.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static ft_ctx *ctx;

enum { SMALL = 12, N = SMALL + 2 };

typedef struct set {
    char names[N][24];
    uint64_t shapes[N][2];
    void *data[N];
    ft_tensor t[N];
} set;

/* Tensors: SMALL of assorted dtypes and sizes (random bytes, an empty one, a scalar), bf16
 * weights that code well, and random bf16 whose stream (stored) takes more than a piece of
 * the coded memory (80 MiB). */
static void make(set *s, const char *prefix)
{
    static const ft_dtype types[] = {FT_DTYPE_F32, FT_DTYPE_BF16, FT_DTYPE_I64, FT_DTYPE_U8,
                                     FT_DTYPE_F16, FT_DTYPE_F64};
    uint64_t r = 12345;
    for (int i = 0; i < N; i++) {
        ft_dtype d = i < SMALL ? types[i % 6] : FT_DTYPE_BF16;
        uint64_t elems = i == 3 ? 0 : i == 5 ? 1 : i < SMALL ? 1 + (uint64_t)i * 7919 % 300000
                                 : i == SMALL ? 1500000 : 40u << 20;
        size_t bytes = (size_t)(elems * ft_dtype_bits(d) / 8);
        uint8_t *p = malloc(bytes + 1);
        if (i != SMALL) {
            for (size_t k = 0; k < bytes; k++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                p[k] = (uint8_t)(r >> 56);
            }
        } else {
            uint16_t *w = (uint16_t *)p;
            for (size_t k = 0; k < elems; k++)
                w[k] = (uint16_t)(0x3c00 + (k * 2654435761u >> 20) % 64) ^ (k & 1 ? 0x8000 : 0);
        }
        snprintf(s->names[i], sizeof s->names[i], "%s%d", prefix, i);
        s->shapes[i][0] = elems;
        s->data[i] = p;
        s->t[i] = (ft_tensor){s->names[i], d, i == 5 ? 0 : 1, i == 5 ? NULL : s->shapes[i],
                              ft_host_buf(p, bytes)}; /* (5: a scalar) */
    }
}

static void unmake(set *s)
{
    for (int i = 0; i < N; i++)
        free(s->data[i]);
}

/* Every tensor of @p path is tensor i of @p s under @p names' name. */
static void check_loads(const char *path, const set *s, const set *names)
{
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, path), 0);
    T_EQ(ft_ckpt_count(c), N);
    T_EQ(ft_ckpt_load_all(c, NULL), 0);
    for (int i = 0; i < N; i++) {
        int64_t at = ft_ckpt_find(c, names->names[i]);
        T_TRUE(at >= 0);
        T_TRUE(!s->t[i].data.len ||
               !memcmp(ft_ckpt_data(c, (size_t)at), s->t[i].data.ptr, s->t[i].data.len));
    }
    T_EQ(ft_ckpt_verify(c, NULL, NULL, NULL), 0);
    ft_ckpt_close(c);
}

static void case_same_file(void)
{
    set s;
    make(&s, "w.");
    const char *meta[] = {"step", "3", NULL};
    char plain[4200], ahead[4200];
    snprintf(plain, sizeof plain, "%s", t_path("plain.fst"));
    snprintf(ahead, sizeof ahead, "%s", t_path("ahead.fst"));
    ft_fst_coded *coded = NULL;
    for (int mode = FT_COMPRESS_ALWAYS; mode <= FT_COMPRESS_NONE; mode++) {
        ft_save_opts so = {.compression = (ft_compression)mode, .metadata = meta};
        int64_t total = ft_fst_code(ctx, t_dir(), s.t, N, &so, &coded);
        T_TRUE(total > 0);
        T_TRUE(ft_fst_coded_memory(coded) >= (uint64_t)total);
        uint64_t raw = 0;
        for (int i = 0; i < N; i++)
            raw += s.t[i].data.len;
        if (mode == FT_COMPRESS_ALWAYS) /* the weights coded: less than the tensors' bytes */
            T_TRUE((uint64_t)total < raw);
        /* the source may change now: the streams are the save's */
        uint8_t first = *(uint8_t *)s.data[SMALL];
        *(uint8_t *)s.data[SMALL] ^= 0xff;
        ft_save_opts ao = so;
        ao.coded = coded;
        T_EQ(ft_ckpt_save(ctx, ahead, s.t, N, &ao), 0);
        *(uint8_t *)s.data[SMALL] = first;
        T_EQ(ft_ckpt_save(ctx, plain, s.t, N, &so), 0);
        T_TRUE(t_same_files(plain, ahead));
        check_loads(ahead, &s, &s);
    }
    /* the save's names (any), stream i for tensor i, data pointers not read */
    set renamed;
    make(&renamed, "renamed.layer.");
    for (int i = 0; i < N; i++)
        renamed.t[i].data.ptr = NULL;
    ft_save_opts ao = {.coded = coded};
    T_EQ(ft_ckpt_save(ctx, ahead, renamed.t, N, &ao), 0);
    check_loads(ahead, &s, &renamed);
    /* some of the coded tensors, each naming its stream */
    ft_tensor some[2] = {renamed.t[SMALL], renamed.t[5]};
    size_t index[2] = {SMALL, 5};
    ao.coded_index = index;
    T_EQ(ft_ckpt_save(ctx, ahead, some, 2, &ao), 0);
    ft_ckpt *c;
    T_EQ(ft_ckpt_open(ctx, &c, ahead), 0);
    T_EQ(ft_ckpt_count(c), 2);
    T_EQ(ft_ckpt_load_all(c, NULL), 0);
    for (int i = 0; i < 2; i++)
        T_TRUE(!memcmp(ft_ckpt_data(c, (size_t)ft_ckpt_find(c, some[i].name)),
                       s.data[index[i]], some[i].data.len));
    ft_ckpt_close(c);
    index[1] = N;
    T_EQ(ft_ckpt_save(ctx, ahead, some, 2, &ao), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "coded stream 14 of 14") != NULL);
    ft_fst_coded_free(coded);
    unmake(&renamed);
    unmake(&s);
}

static void case_memory(void)
{
    set s;
    make(&s, "w.");
    ft_fst_coded *coded = NULL;
    ft_save_opts so = {.compression = FT_COMPRESS_ALWAYS};
    T_TRUE(ft_fst_code(ctx, t_dir(), s.t, N, &so, &coded) > 0);
    uint64_t all = ft_fst_coded_memory(coded);
    T_TRUE(all > (64u << 20)); /* the 80 MiB tensor's stream takes a piece of its own */
    /* fewer tensors: the memory they do not need is given back; the same again: the same */
    T_TRUE(ft_fst_code(ctx, t_dir(), s.t, SMALL, &so, &coded) > 0);
    T_EQ(ft_fst_coded_memory(coded), 64u << 20);
    T_TRUE(ft_fst_code(ctx, t_dir(), s.t, N, &so, &coded) > 0);
    T_EQ(ft_fst_coded_memory(coded), all);
    T_TRUE(ft_fst_code(ctx, t_dir(), s.t, N, &so, &coded) > 0);
    T_EQ(ft_fst_coded_memory(coded), all);
    ft_fst_coded_free(coded);
    ft_fst_coded_free(NULL);
    T_EQ(ft_fst_coded_memory(NULL), 0);
    unmake(&s);
}

static bool holds(const char *path, const char *text)
{
    char buf[64] = {0};
    int fd = open(path, O_RDONLY);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n == (ssize_t)strlen(text) && !memcmp(buf, text, (size_t)n);
}

static void case_refused(void)
{
    set s;
    make(&s, "w.");
    const char *path = t_path("kept.fst");
    t_write_text(path, "previous contents");
    ft_fst_coded *coded = NULL;
    ft_save_opts so = {.compression = FT_COMPRESS_ALWAYS};
    T_EQ(ft_fst_code(NULL, t_dir(), s.t, N, &so, &coded), -EINVAL);
    T_EQ(ft_fst_code(ctx, t_dir(), s.t, N, &so, NULL), -EINVAL);
    T_EQ(ft_fst_code(ctx, t_dir(), NULL, N, &so, &coded), -EINVAL);
    ft_save_opts bad = {.compression = FT_COMPRESS_COUNT};
    T_EQ(ft_fst_code(ctx, t_dir(), s.t, N, &bad, &coded), -EINVAL);
    T_TRUE(ft_fst_code(ctx, t_dir(), s.t, SMALL, &so, &coded) > 0);
    ft_save_opts ao = {.coded = coded};
    /* another count; another order (shapes differ); another dtype; a safetensors path */
    T_EQ(ft_ckpt_save(ctx, path, s.t, SMALL - 1, &ao), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "11") != NULL);
    ft_tensor swapped[SMALL];
    memcpy(swapped, s.t, sizeof swapped);
    swapped[0] = s.t[1];
    swapped[1] = s.t[0];
    T_EQ(ft_ckpt_save(ctx, path, swapped, SMALL, &ao), -EINVAL);
    T_TRUE(strstr(ft_last_error(), "coded stream") != NULL);
    memcpy(swapped, s.t, sizeof swapped);
    swapped[0].dtype = FT_DTYPE_I32; /* (4 bytes, as f32) */
    T_EQ(ft_ckpt_save(ctx, path, swapped, SMALL, &ao), -EINVAL);
    T_EQ(ft_ckpt_save(ctx, t_path("kept.safetensors"), s.t, SMALL, &ao), -EINVAL);
    T_TRUE(holds(path, "previous contents"));
    /* a failed call leaves no streams: a save with it is refused */
    s.t[2].name = NULL;
    T_EQ(ft_fst_code(ctx, t_dir(), s.t, SMALL, &so, &coded), -EINVAL);
    T_EQ(ft_ckpt_save(ctx, path, s.t, 0, &ao), 0);
    s.t[2].name = s.names[2];
    T_EQ(ft_ckpt_save(ctx, path, s.t, SMALL, &ao), -EINVAL);
    ft_fst_coded_free(coded);
    unmake(&s);
}

int main(void)
{
    if (!t_have_odirect())
        t_skip("no O_DIRECT on the filesystem of %s (set FT_TEST_DIR to an ext4/xfs "
               "directory)", t_dir());
    ctx = t_ctx(4);
    const t_case cases[] = {
        {"a save of streams coded ahead writes the file a coding save writes", case_same_file},
        {"the coded memory: packed, kept, grown, trimmed", case_memory},
        {"mismatched tensors and bad arguments refused, the old file intact", case_refused},
    };
    int rc = t_run(cases, sizeof cases / sizeof *cases);
    ft_ctx_destroy(ctx);
    return rc;
}
