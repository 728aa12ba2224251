/* The CUDA driver shim: dlopen, symbol table, errors, pointers, primary contexts. */
#include "cuda.h"

#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

ft__cuda_api ft__cu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const char *load_reason = "not loaded";
static int load_rc = -ENODEV;

#define MAX_DEVICES 64
static CUcontext primary[MAX_DEVICES];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

static void *sym(void *lib, const char *versioned, const char *plain)
{
    void *p = versioned ? dlsym(lib, versioned) : NULL;
    return p ? p : dlsym(lib, plain);
}

static void load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        load_reason = "libcuda.so.1 not found (no NVIDIA driver)";
        return;
    }
    /* The _v2 names are what cuda.h maps the plain ones to since CUDA 4 / 11. */
#define LOAD(field, versioned, plain)                                                         \
    if (!(*(void **)&ft__cu.field = sym(lib, versioned, plain))) {                           \
        load_reason = "libcuda.so.1 lacks " plain;                                            \
        return;                                                                               \
    }
    LOAD(Init, NULL, "cuInit");
    LOAD(DriverGetVersion, NULL, "cuDriverGetVersion");
    LOAD(DeviceGetCount, NULL, "cuDeviceGetCount");
    LOAD(DeviceGet, NULL, "cuDeviceGet");
    LOAD(DeviceGetName, NULL, "cuDeviceGetName");
    LOAD(DeviceTotalMem, "cuDeviceTotalMem_v2", "cuDeviceTotalMem");
    LOAD(DevicePrimaryCtxRetain, NULL, "cuDevicePrimaryCtxRetain");
    LOAD(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
    LOAD(CtxPushCurrent, "cuCtxPushCurrent_v2", "cuCtxPushCurrent");
    LOAD(CtxPopCurrent, "cuCtxPopCurrent_v2", "cuCtxPopCurrent");
    LOAD(PointerGetAttribute, NULL, "cuPointerGetAttribute");
    LOAD(MemAlloc, "cuMemAlloc_v2", "cuMemAlloc");
    LOAD(MemFree, "cuMemFree_v2", "cuMemFree");
    LOAD(MemHostAlloc, NULL, "cuMemHostAlloc");
    LOAD(MemFreeHost, NULL, "cuMemFreeHost");
    LOAD(MemHostRegister, "cuMemHostRegister_v2", "cuMemHostRegister");
    LOAD(MemHostUnregister, NULL, "cuMemHostUnregister");
    LOAD(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync");
    LOAD(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync");
    LOAD(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync");
    LOAD(MemcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
    LOAD(MemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
    LOAD(MemsetD8Async, NULL, "cuMemsetD8Async");
    LOAD(StreamCreate, NULL, "cuStreamCreate");
    LOAD(StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
    LOAD(StreamSynchronize, NULL, "cuStreamSynchronize");
    LOAD(StreamWaitEvent, NULL, "cuStreamWaitEvent");
    LOAD(EventCreate, NULL, "cuEventCreate");
    LOAD(EventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
    LOAD(EventRecord, NULL, "cuEventRecord");
    LOAD(EventSynchronize, NULL, "cuEventSynchronize");
    LOAD(EventQuery, NULL, "cuEventQuery");
    LOAD(GetErrorString, NULL, "cuGetErrorString");
#undef LOAD
#define LOAD_OPTIONAL(field, versioned, plain) *(void **)&ft__cu.field = sym(lib, versioned, plain);
    LOAD_OPTIONAL(ModuleLoadData, NULL, "cuModuleLoadData");
    LOAD_OPTIONAL(ModuleGetFunction, NULL, "cuModuleGetFunction");
    LOAD_OPTIONAL(FuncSetAttribute, NULL, "cuFuncSetAttribute");
    LOAD_OPTIONAL(LaunchKernel, NULL, "cuLaunchKernel");
    LOAD_OPTIONAL(MemAllocAsync, NULL, "cuMemAllocAsync");
    LOAD_OPTIONAL(MemFreeAsync, NULL, "cuMemFreeAsync");
#undef LOAD_OPTIONAL
    CUresult r = ft__cu.Init(0);
    int count = 0;
    if (r != 0) {
        load_reason = r == 100 ? "no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)"
                               : "cuInit failed (driver present but not usable)";
        return;
    }
    if (ft__cu.DeviceGetCount(&count) != 0 || count == 0) {
        load_reason = "no CUDA device";
        return;
    }
    load_reason = "";
    load_rc = 0;
}

int ft__cuda_load(const char **reason)
{
    pthread_once(&load_once, load);
    if (reason)
        *reason = load_reason;
    return load_rc;
}

typedef struct find_cuda {
    unsigned long long adds; /* objects loaded so far, as dl_iterate_phdr counts them */
    bool stop_early;         /* only count */
    char path[4096];         /* the driver library's path, when found */
} find_cuda;

static int find_cuda_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    find_cuda *fc = arg;
    fc->adds = info->dlpi_adds;
    if (fc->stop_early)
        return 1;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libcuda.so", 10) != 0)
        return 0;
    snprintf(fc->path, sizeof fc->path, "%s", name);
    return 1;
}

/* cuDeviceGetCount of the driver library someone else loaded, found by walking the loaded
 * objects again whenever objects were added since the last walk; NULL while there is none. */
static CUresult (*others_count(void))(int *)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static _Atomic unsigned long long walked = UINT64_MAX; /* object count of the last walk */
    static CUresult (*_Atomic count)(int *);
    CUresult (*fn)(int *) = atomic_load_explicit(&count, memory_order_acquire);
    if (fn)
        return fn;
    find_cuda fc = {.stop_early = true};
    dl_iterate_phdr(find_cuda_cb, &fc);
    if (fc.adds == atomic_load_explicit(&walked, memory_order_relaxed))
        return NULL; /* nothing loaded since a walk that found no driver */
    pthread_mutex_lock(&lock);
    if (!(fn = atomic_load(&count))) {
        fc.stop_early = false;
        fc.path[0] = '\0';
        dl_iterate_phdr(find_cuda_cb, &fc);
        void *lib = fc.path[0] ? dlopen(fc.path, RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL) : NULL;
        if (lib && (*(void **)&fn = dlsym(lib, "cuDeviceGetCount")) != NULL)
            atomic_store_explicit(&count, fn, memory_order_release);
        /* (the reference is kept: the library stays as long as the process) */
        atomic_store_explicit(&walked, fc.adds, memory_order_relaxed);
    }
    pthread_mutex_unlock(&lock);
    return fn;
}

bool ft__cuda_in_use(void)
{
    static _Atomic bool initialised;
    if (atomic_load_explicit(&initialised, memory_order_acquire))
        return ft__cuda_load(NULL) == 0;
    CUresult (*count)(int *) = others_count();
    int n = 0;
    /* 3 (CUDA_ERROR_NOT_INITIALIZED): loaded, but nobody called cuInit, so no memory of
     * the process is CUDA's yet; without cuInit every call but a few answers that. */
    if (!count || count(&n) == 3)
        return false;
    bool ok = ft__cuda_load(NULL) == 0;
    atomic_store_explicit(&initialised, true, memory_order_release);
    return ok;
}

int ft__cuda_err(CUresult r, const char *what)
{
    const char *text = NULL;
    if (ft__cu.GetErrorString)
        ft__cu.GetErrorString(r, &text);
    int e = r == 2 ? -ENOMEM : r == 1 ? -EINVAL : r == 101 ? -ENODEV : -EIO;
    return ft__err(e, "%s: CUDA error %d (%s)", what, r, text ? text : "unknown");
}

int ft__cuda_pointer(const void *ptr, int *device, bool *pinned)
{
    *pinned = false;
    if (ft__cuda_load(NULL) < 0 || !ptr)
        return 0;
    unsigned type = 0;
    CUresult r = ft__cu.PointerGetAttribute(&type, FT_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                            (CUdeviceptr)(uintptr_t)ptr);
    if (r != 0)
        return 0; /* not known to CUDA: ordinary host memory */
    if (type == FT_CU_MEMORYTYPE_HOST) {
        *pinned = true;
        return 0;
    }
    if (type != FT_CU_MEMORYTYPE_DEVICE && type != FT_CU_MEMORYTYPE_UNIFIED)
        return 0;
    int ordinal = 0;
    r = ft__cu.PointerGetAttribute(&ordinal, FT_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                   (CUdeviceptr)(uintptr_t)ptr);
    if (r != 0)
        return ft__cuda_err(r, "cuPointerGetAttribute(DEVICE_ORDINAL)");
    *device = ordinal;
    return 1;
}

int ft__cuda_enter(int device)
{
    if (device < 0 || device >= MAX_DEVICES)
        return ft__err(-ENODEV, "CUDA device %d is out of range", device);
    pthread_mutex_lock(&primary_lock);
    CUresult r = 0;
    if (!primary[device]) {
        CUdevice dev;
        r = ft__cu.DeviceGet(&dev, device);
        if (r == 0)
            r = ft__cu.DevicePrimaryCtxRetain(&primary[device], dev);
    }
    CUcontext ctx = primary[device];
    pthread_mutex_unlock(&primary_lock);
    if (r != 0)
        return ft__cuda_err(r, "cuDevicePrimaryCtxRetain");
    r = ft__cu.CtxPushCurrent(ctx);
    return r ? ft__cuda_err(r, "cuCtxPushCurrent") : 0;
}

void ft__cuda_leave(void)
{
    CUcontext ignored;
    ft__cu.CtxPopCurrent(&ignored);
}

typedef struct kernel {
    int device;
    const void *image;
    const char *name;
    CUfunction fn;
} kernel;

/* the codec's 22 kernels (4 decoders; the encoder's 4 steps by 4 element sizes, and 2) on
 * each of 8 GPUs, and more */
#define MAX_KERNELS 256
static kernel kernels[MAX_KERNELS];
static unsigned nkernels;
static CUmodule modules[MAX_KERNELS];
static const void *module_image[MAX_KERNELS];
static int module_device[MAX_KERNELS];
static unsigned nmodules;
static pthread_mutex_t kernel_lock = PTHREAD_MUTEX_INITIALIZER;

int ft__cuda_function(int device, const void *image, const char *name, CUfunction *fn)
{
    if (!ft__cu.ModuleLoadData || !ft__cu.ModuleGetFunction || !ft__cu.LaunchKernel)
        return ft__err(-ENOSYS, "the CUDA driver cannot load kernels (no cuModuleLoadData)");
    int rc = 0;
    pthread_mutex_lock(&kernel_lock);
    for (unsigned i = 0; i < nkernels; i++)
        if (kernels[i].device == device && kernels[i].image == image &&
            strcmp(kernels[i].name, name) == 0) {
            *fn = kernels[i].fn;
            goto out;
        }
    CUmodule mod = NULL;
    for (unsigned i = 0; i < nmodules; i++)
        if (module_device[i] == device && module_image[i] == image)
            mod = modules[i];
    if (!mod) {
        if (nmodules == MAX_KERNELS) {
            rc = ft__err(-ENOMEM, "too many CUDA modules");
            goto out;
        }
        CUresult r = ft__cu.ModuleLoadData(&mod, image);
        if (r != 0) {
            rc = ft__cuda_err(r, "cuModuleLoadData (fastensor's kernels)");
            goto out;
        }
        modules[nmodules] = mod;
        module_image[nmodules] = image;
        module_device[nmodules++] = device;
    }
    if (nkernels == MAX_KERNELS) {
        rc = ft__err(-ENOMEM, "too many CUDA kernels");
        goto out;
    }
    CUresult r = ft__cu.ModuleGetFunction(fn, mod, name);
    if (r != 0) {
        rc = ft__cuda_err(r, "cuModuleGetFunction");
        goto out;
    }
    kernels[nkernels++] = (kernel){device, image, name, *fn};
out:
    pthread_mutex_unlock(&kernel_lock);
    return rc;
}

int ft__cuda_alloc(CUdeviceptr *ptr, size_t bytes, CUstream stream)
{
    CUresult r = ft__cu.MemAllocAsync ? ft__cu.MemAllocAsync(ptr, bytes, stream)
                                      : ft__cu.MemAlloc(ptr, bytes);
    return r ? ft__cuda_err(r, "allocating device memory") : 0;
}

void ft__cuda_free(CUdeviceptr ptr, CUstream stream)
{
    if (!ptr)
        return;
    if (ft__cu.MemFreeAsync) {
        ft__cu.MemFreeAsync(ptr, stream);
        return;
    }
    ft__cu.StreamSynchronize(stream);
    ft__cu.MemFree(ptr);
}

int ft__cuda_event_after(int device, void *stream, void **event)
{
    *event = NULL;
    int rc = ft__cuda_enter(device);
    if (rc < 0)
        return rc;
    CUevent ev = NULL;
    CUresult r = ft__cu.EventCreate(&ev, FT_CU_EVENT_DISABLE_TIMING);
    if (r == 0)
        r = ft__cu.EventRecord(ev, (CUstream)stream);
    if (r != 0 && ev)
        ft__cu.EventDestroy(ev);
    ft__cuda_leave();
    if (r != 0)
        return ft__cuda_err(r, "event on the caller's stream");
    *event = ev;
    return 0;
}

int ft__cuda_event_wait(int device, void *event)
{
    int rc = ft__cuda_enter(device);
    if (rc < 0)
        return rc;
    CUresult r = ft__cu.EventSynchronize((CUevent)event);
    ft__cuda_leave();
    return r ? ft__cuda_err(r, "waiting for the caller's stream") : 0;
}

void ft__cuda_event_free(int device, void *event)
{
    if (event && ft__cuda_enter(device) == 0) {
        ft__cu.EventDestroy((CUevent)event);
        ft__cuda_leave();
    }
}

static void pin(void *buf, size_t len)
{
    if (ft__cuda_enter(0) == 0) {
        ft__cu.MemHostRegister(buf, len, FT_CU_MEMHOSTREGISTER_PORTABLE);
        ft__cuda_leave(); /* a failure leaves it pageable, which still works */
    }
}

static void unpin(void *buf)
{
    ft__cu.MemHostUnregister(buf); /* of a buffer never registered: an error, and harmless */
}

static const ft__buf_hooks pinned_hooks = {.made = pin, .unmade = unpin};

int ft__bufpool_create_pinned(ft__bufpool **out, size_t buf_size, unsigned max_cached)
{
    return ft__bufpool_create_with(out, buf_size, max_cached,
                                   ft__cuda_in_use() ? &pinned_hooks : NULL);
}

int ft__buf_device(const ft_buf *buf, int *device)
{
    *device = -1;
    if (buf->kind == FT_MEM_CUDA || ft__cuda_in_use()) {
        /* Device memory, whatever the caller said: a memcpy on it would crash. (A process
         * that has not initialised CUDA holds none.) */
        int dev = buf->device;
        bool pinned;
        int kind = ft__cuda_pointer(buf->ptr, &dev, &pinned);
        if (kind < 0)
            return kind;
        if (kind == 1 || buf->kind == FT_MEM_CUDA)
            *device = dev;
    }
    return 0;
}
