/*
 * The CUDA driver API, opened at run time with dlopen("libcuda.so.1"): the few types and
 * prototypes fastensor needs, declared here so nothing CUDA is needed to build or link.
 * Every entry is NULL until ft__cuda_load() succeeds.
 */
#ifndef FT_GPU_CUDA_H
#define FT_GPU_CUDA_H

#include "../base/base.h"

typedef int CUresult;      /* 0 = CUDA_SUCCESS */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;

enum {
    FT_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    FT_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    FT_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    FT_CU_MEMORYTYPE_HOST = 1,
    FT_CU_MEMORYTYPE_DEVICE = 2,
    FT_CU_MEMORYTYPE_UNIFIED = 4,
    FT_CU_STREAM_NON_BLOCKING = 1,
    FT_CU_EVENT_DISABLE_TIMING = 2,
    FT_CU_MEMHOSTALLOC_PORTABLE = 1,
    FT_CU_MEMHOSTREGISTER_PORTABLE = 1,
    FT_CU_MEMHOSTREGISTER_READ_ONLY = 8, /* the GPU only reads it: read-only pages may pin */
    FT_CU_ERROR_OUT_OF_MEMORY = 2,
    FT_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    FT_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

typedef struct ft__cuda_api {
    CUresult (*Init)(unsigned flags);
    CUresult (*DriverGetVersion)(int *version);
    CUresult (*DeviceGetCount)(int *count);
    CUresult (*DeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*DeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*DeviceTotalMem)(size_t *bytes, CUdevice dev);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*CtxPushCurrent)(CUcontext ctx);
    CUresult (*CtxPopCurrent)(CUcontext *ctx);
    CUresult (*PointerGetAttribute)(void *data, int attribute, CUdeviceptr ptr);
    CUresult (*MemAlloc)(CUdeviceptr *ptr, size_t bytes);
    CUresult (*MemFree)(CUdeviceptr ptr);
    CUresult (*MemHostAlloc)(void **ptr, size_t bytes, unsigned flags);
    CUresult (*MemFreeHost)(void *ptr);
    CUresult (*MemHostRegister)(void *ptr, size_t bytes, unsigned flags);
    CUresult (*MemHostUnregister)(void *ptr);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
    CUresult (*MemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*MemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);
    CUresult (*MemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);
    CUresult (*MemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t n, CUstream s);
    CUresult (*StreamCreate)(CUstream *s, unsigned flags);
    CUresult (*StreamDestroy)(CUstream s);
    CUresult (*StreamSynchronize)(CUstream s);
    CUresult (*StreamWaitEvent)(CUstream s, CUevent e, unsigned flags);
    CUresult (*EventCreate)(CUevent *e, unsigned flags);
    CUresult (*EventDestroy)(CUevent e);
    CUresult (*EventRecord)(CUevent e, CUstream s);
    CUresult (*EventSynchronize)(CUevent e);
    CUresult (*EventQuery)(CUevent e); /* 0 done, 600 (CUDA_ERROR_NOT_READY) pending */
    CUresult (*GetErrorString)(CUresult r, const char **s);
    /* optional (NULL where the driver lacks them): kernels, stream-ordered allocation */
    CUresult (*ModuleLoadData)(CUmodule *m, const void *image);
    CUresult (*ModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
    CUresult (*FuncSetAttribute)(CUfunction f, int attribute, int value);
    CUresult (*LaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared, CUstream s,
                             void **params, void **extra);
    CUresult (*MemAllocAsync)(CUdeviceptr *ptr, size_t bytes, CUstream s);
    CUresult (*MemFreeAsync)(CUdeviceptr ptr, CUstream s);
} ft__cuda_api;

extern ft__cuda_api ft__cu;

/** Open the driver once. @return 0, or -ENODEV / -ENOSYS with *reason (static text). */
int ft__cuda_load(const char **reason);

/**
 * Whether this process can hold CUDA memory: the driver library is loaded, by fastensor or
 * anyone else, and initialised (cuInit called); then it is opened like ft__cuda_load. Never
 * loads or initialises the driver itself: cuInit takes a tenth of a second or more in some
 * VMs, and a process that has not initialised CUDA has neither device nor pinned memory
 * (torch, for one, loads the library at import and initialises it on first CUDA use). Cheap:
 * the loaded objects are walked again only when objects were added since the last walk.
 */
bool ft__cuda_in_use(void);

/** A buffer pool whose buffers are page-locked for the GPU (device copies from them run at
 * DMA speed) where the process has initialised CUDA (ft__cuda_in_use), plain ones otherwise:
 * never initialises CUDA just to pin. */
int ft__bufpool_create_pinned(ft__bufpool **out, size_t buf_size, unsigned max_cached);
/** Whether the buffers of a pool of ft__bufpool_create_pinned are page-locked. */
static inline bool ft__bufpool_pinned(const ft__bufpool *p)
{
    return ft__bufpool_hooked(p);
}

/** Map a CUresult to -errno and set the detail message "what: CUDA error N (text)". */
int ft__cuda_err(CUresult r, const char *what);

/**
 * Classify @p ptr: 1 device memory (ordinal in *device), 0 host memory (pageable or
 * pinned: *pinned set), or -errno. Works without CUDA (everything is host then).
 */
int ft__cuda_pointer(const void *ptr, int *device, bool *pinned);
/** *device = the CUDA device holding @p buf's memory (whatever kind it claims), -1 for
 * host memory. @return 0 or -errno. */
int ft__buf_device(const ft_buf *buf, int *device);

/**
 * Function @p name (a string kept for the process's life, as the image: the cache keeps the
 * pointer) of the module image @p image (fatbin, cubin or PTX, kept by the caller
 * for the process's life) in @p device's primary context, which the caller has entered
 * (ft__cuda_enter): loaded on first use, then kept. @return 0 and *fn, or -ENOSYS where the
 * driver cannot load modules, -errno.
 */
int ft__cuda_function(int device, const void *image, const char *name, CUfunction *fn);

/** Device memory for work queued on @p stream: stream-ordered where the driver has it. */
int ft__cuda_alloc(CUdeviceptr *ptr, size_t bytes, CUstream stream);
/** Free memory of ft__cuda_alloc once the work queued on @p stream so far is done. */
void ft__cuda_free(CUdeviceptr ptr, CUstream stream);

/** Make @p device's primary context current on this thread (pushed); pop with _leave. */
int ft__cuda_enter(int device);
void ft__cuda_leave(void);

/**
 * Record, now, an event on @p stream (a CUstream of @p device; NULL: the legacy default
 * stream): what was queued there before this call. @return 0 and *event, or -errno.
 */
int ft__cuda_event_after(int device, void *stream, void **event);
/** Wait on the host for an event of ft__cuda_event_after. @return 0 or -errno. */
int ft__cuda_event_wait(int device, void *event);
/** Free an event of ft__cuda_event_after (NULL: nothing). */
void ft__cuda_event_free(int device, void *event);

#endif
