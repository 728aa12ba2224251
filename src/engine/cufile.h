/* cuFile's types and entry points as fastensor declares them (libcufile.so.0 is opened at run
 * time; nothing of it is needed to build), shared by the cuFile engine and its batch path. */
#ifndef FT_ENGINE_CUFILE_H
#define FT_ENGINE_CUFILE_H

#include "engine.h"

#include <sys/types.h>
#include <time.h>

typedef struct cufile_error {
    int err;    /* CU_FILE_* (5000 + n), 0 on success */
    int cu_err; /* CUresult */
} cufile_error;

typedef struct cufile_descr {
    int type;   /* 1: CU_FILE_HANDLE_TYPE_OPAQUE_FD */
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
} cufile_descr;

/* CUfileIOParams_t and CUfileIOEvents_t of cufile.h, for the batch API. */
typedef struct cufile_io_params {
    int mode; /* CUFILE_BATCH */
    struct {
        void *base;
        off_t file_offset;
        off_t buf_offset;
        size_t size;
    } batch;
    void *fh;
    int opcode; /* CUFILE_READ, CUFILE_WRITE */
    void *cookie;
} cufile_io_params;

typedef struct cufile_io_event {
    void *cookie;
    int status; /* CUFILE_* status bits below */
    size_t ret; /* bytes done, or a negative error */
} cufile_io_event;

enum {
    CUFILE_BATCH = 1,
    CUFILE_READ = 0,
    CUFILE_WRITE = 1,
    CUFILE_WAITING = 0x01,
    CUFILE_PENDING = 0x02,
    CUFILE_COMPLETE = 0x10,
};

/* CUfileDrvProps_t, with room for fields later versions append. */
typedef struct cufile_props {
    struct {
        unsigned major, minor;
        size_t poll_thresh, max_direct_io;
        unsigned status_flags, control_flags;
    } nvfs;
    unsigned feature_flags, max_device_cache_size, per_buffer_cache_size,
        max_device_pinned_mem_size, max_batch_io_size, max_batch_io_timeout_msecs;
    char spare[256];
} cufile_props;

typedef struct ft__cufile_api {
    cufile_error (*DriverOpen)(void);
    cufile_error (*DriverGetProperties)(cufile_props *props);
    cufile_error (*HandleRegister)(void **fh, cufile_descr *descr);
    void (*HandleDeregister)(void *fh);
    cufile_error (*BufRegister)(const void *ptr, size_t len, int flags);
    cufile_error (*BufDeregister)(const void *ptr);
    ssize_t (*Read)(void *fh, void *base, size_t size, off_t file_off, off_t buf_off);
    ssize_t (*Write)(void *fh, const void *base, size_t size, off_t file_off, off_t buf_off);
    cufile_error (*BatchSetUp)(void **batch, unsigned nr);
    cufile_error (*BatchSubmit)(void *batch, unsigned nr, cufile_io_params *params,
                                unsigned flags);
    cufile_error (*BatchGetStatus)(void *batch, unsigned min_nr, unsigned *nr,
                                   cufile_io_event *events, struct timespec *timeout);
    cufile_error (*BatchCancel)(void *batch);
    void (*BatchDestroy)(void *batch);
} ft__cufile_api;

/** The entry points; valid once ft__cufile_usable() returned 1. */
extern ft__cufile_api ft__cf;

/** 1 when cuFile can be used in this process, else 0 and *reason (may be NULL) set. */
int ft__cufile_usable(const char **reason);
/** The file's registered cuFile handle (registered once, a failure remembered). */
int ft__cufile_file_handle(ft_file *f, void **out);
/** The base cuFile addresses [ptr, ptr+len) from: its registered buffer's start, else ptr. */
uint8_t *ft__cufile_base(ft_ctx *ctx, uint8_t *ptr, uint64_t len);
/** Whether the open driver runs true GPUDirect Storage (nvidia-fs is loaded). */
bool ft__cufile_gds(void);

/** cuFile's mode ("GPUDirect Storage (nvidia-fs)" / "compatibility mode") or NULL. */
const char *ft__cufile_mode(void);
/** Describe the batch API's state ("available, N ops per batch" / "not available: why"). */
void ft__cufile_batch_describe(char *buf, size_t len);

/* A file's cuFile state (its engine_state[FT_ENGINE_CUFILE], under the file's lock). */
typedef struct ft__cufile_file {
    void *handle; /* registered cuFile handle, NULL until first use */
    int err;      /* cached -errno when registration failed */
    int code;     /* cuFile's error code of that failure */
} ft__cufile_file;

#endif
