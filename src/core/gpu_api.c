/* Public GPU helpers: status, device memory for callers without a CUDA runtime of their own
 * (the CLI, tests, benchmarks), and a description of the GPUs and cuFile. */
#include "internal.h"
#include "../gpu/cuda.h"
#include "../engine/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


int ft_cuda_available(const char **reason)
{
    return ft__cuda_load(reason) == 0;
}

int ft_cuda_alloc(int device, size_t len, void **out)
{
    const char *why;
    if (!out || ft__cuda_load(&why) < 0)
        return out ? ft__err(-ENODEV, "CUDA not available: %s", why)
                   : ft__err(-EINVAL, "ft_cuda_alloc: out is NULL");
    int rc = ft__cuda_enter(device);
    if (rc < 0)
        return rc;
    CUdeviceptr p = 0;
    CUresult r = ft__cu.MemAlloc(&p, len ? len : 1);
    ft__cuda_leave();
    if (r != 0)
        return ft__cuda_err(r, "cuMemAlloc");
    *out = (void *)(uintptr_t)p;
    return 0;
}

int ft_cuda_free(void *ptr)
{
    if (!ptr)
        return 0;
    int device;
    bool pinned;
    int kind = ft__cuda_pointer(ptr, &device, &pinned);
    if (kind != 1)
        return ft__err(-EINVAL, "ft_cuda_free: %p is not device memory", ptr);
    int rc = ft__cuda_enter(device);
    if (rc < 0)
        return rc;
    CUresult r = ft__cu.MemFree((CUdeviceptr)(uintptr_t)ptr);
    ft__cuda_leave();
    return r ? ft__cuda_err(r, "cuMemFree") : 0;
}

int ft_cuda_copy(void *dst, const void *src, size_t len)
{
    int dd = -1, sd = -1;
    bool pinned;
    if (ft__cuda_load(NULL) < 0)
        return ft__err(-ENODEV, "CUDA not available");
    int dk = ft__cuda_pointer(dst, &dd, &pinned), sk = ft__cuda_pointer(src, &sd, &pinned);
    if (dk < 0 || sk < 0 || dk == sk)
        return ft__err(-EINVAL, "ft_cuda_copy copies between host and device memory");
    int rc = ft__cuda_enter(dk ? dd : sd);
    if (rc < 0)
        return rc;
    CUresult r = dk ? ft__cu.MemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, len)
                    : ft__cu.MemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, len);
    ft__cuda_leave();
    return r ? ft__cuda_err(r, "cuMemcpy") : 0;
}

/* Host-to-device bandwidth of pinned memory (GB/s) on @p device, 256 MiB, best of 3. */
static double pinned_bandwidth(int device)
{
    const size_t n = 256u << 20;
    void *host = NULL;
    CUdeviceptr dev = 0;
    double best = 0;
    if (ft__cuda_enter(device) < 0)
        return 0;
    if (ft__cu.MemHostAlloc(&host, n, 0) == 0 && ft__cu.MemAlloc(&dev, n) == 0) {
        for (int i = 0; i < 3; i++) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            if (ft__cu.MemcpyHtoD(dev, host, n) != 0)
                break;
            clock_gettime(CLOCK_MONOTONIC, &b);
            double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
            if ((double)n / s / 1e9 > best)
                best = (double)n / s / 1e9;
        }
    }
    if (dev)
        ft__cu.MemFree(dev);
    if (host)
        ft__cu.MemFreeHost(host);
    ft__cuda_leave();
    return best;
}

/* Each engine's lines of the description, from @p at on (@p devices: -1 without CUDA). */
static void engine_lines(int devices, char *buf, size_t len, size_t at)
{
    for (int id = 0; id < FT_ENGINE_COUNT && at < len; id++) {
        const ft__engine_ops *ops = ft__engine_get((ft_engine)id);
        if (ops && ops->describe)
            at += ops->describe(devices, buf + at, len - at);
    }
}

int ft_gpu_describe(char *buf, size_t len)
{
    const char *why;
    if (!buf || !len)
        return -EINVAL;
    if (ft__cuda_load(&why) < 0) {
        engine_lines(-1, buf, len, (size_t)snprintf(buf, len, "cuda        not available: %s\n",
                                                    why));
        return 0;
    }
    int version = 0, count = 0;
    ft__cu.DriverGetVersion(&version);
    ft__cu.DeviceGetCount(&count);
    size_t at = (size_t)snprintf(buf, len, "cuda        driver API %d.%d, %d device(s)\n",
                                 version / 1000, version % 1000 / 10, count);
    for (int i = 0; i < count && at < len; i++) {
        CUdevice dev;
        char name[128] = "?";
        size_t mem = 0;
        if (ft__cu.DeviceGet(&dev, i) == 0) {
            ft__cu.DeviceGetName(name, sizeof name, dev);
            ft__cu.DeviceTotalMem(&mem, dev);
        }
        at += (size_t)snprintf(buf + at, len - at,
                               "gpu %-7d %s, %.1f GiB, pinned host->device copy %.1f GB/s\n", i,
                               name, (double)mem / (1u << 30), pinned_bandwidth(i));
    }
    engine_lines(count, buf, len, at);
    return 0;
}
