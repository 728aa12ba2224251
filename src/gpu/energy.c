/* Energy counters: GPU energy from NVML (dlopen libnvidia-ml.so.1), CPU package energy from
 * /sys/class/powercap (RAPL), each reported only where readable. */
#include "cuda.h"
#include "../base/syscall.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct nvmlDevice_st *nvml_device;

static struct {
    int (*Init)(void);
    int (*DeviceGetCount)(unsigned *count);
    int (*DeviceGetHandleByIndex)(unsigned index, nvml_device *dev);
    int (*DeviceGetTotalEnergyConsumption)(nvml_device dev, unsigned long long *mj);
    unsigned count;
} nv;

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;
static bool nv_ok;

static void nv_load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return;
    *(void **)&nv.Init = dlsym(lib, "nvmlInit_v2");
    *(void **)&nv.DeviceGetCount = dlsym(lib, "nvmlDeviceGetCount_v2");
    *(void **)&nv.DeviceGetHandleByIndex = dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nv.DeviceGetTotalEnergyConsumption =
        dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    if (!nv.Init || !nv.DeviceGetCount || !nv.DeviceGetHandleByIndex ||
        !nv.DeviceGetTotalEnergyConsumption || nv.Init() != 0 ||
        nv.DeviceGetCount(&nv.count) != 0 || nv.count == 0)
        return;
    nv_ok = true;
}

/* One counter file's value, or -1. */
static double counter_uj(const char *path)
{
    int fd = ft__sys.open(path, O_RDONLY | O_CLOEXEC, 0); /* no fault test: no RAPL here */
    if (fd < 0)
        return -1;
    char text[32];
    ssize_t n = ft__sys.pread(fd, text, sizeof text - 1, 0); /* no fault test: no RAPL here */
    ft__sys.close(fd); /* no fault test: no RAPL here */
    if (n <= 0)
        return -1;
    text[n] = '\0';
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    return end == text ? -1 : (double)v;
}

/* Sum of the RAPL package counters (microjoules), or -1. */
static double rapl_uj(void)
{
    DIR *d = ft__sys.opendir("/sys/class/powercap");
    if (!d)
        return -1;
    double total = -1;
    struct dirent *e;
    while (ft__dir_next(d, &e) > 0) {
        /* top-level packages only: intel-rapl:N (not intel-rapl:N:M subzones) */
        if (strncmp(e->d_name, "intel-rapl:", 11) != 0 || strchr(e->d_name + 11, ':'))
            continue;
        char p[512];
        snprintf(p, sizeof p, "/sys/class/powercap/%s/energy_uj", e->d_name);
        double v = counter_uj(p);
        if (v >= 0)
            total = (total < 0 ? 0 : total) + v;
    }
    ft__sys.closedir(d);
    return total;
}

int ft_energy_sample(ft_energy *out)
{
    if (!out)
        return -EINVAL;
    memset(out, 0, sizeof *out);
    pthread_once(&nv_once, nv_load);
    if (nv_ok) {
        double mj = 0;
        bool any = false;
        for (unsigned i = 0; i < nv.count; i++) {
            nvml_device dev;
            unsigned long long v;
            if (nv.DeviceGetHandleByIndex(i, &dev) == 0 &&
                nv.DeviceGetTotalEnergyConsumption(dev, &v) == 0) {
                mj += (double)v;
                any = true;
            }
        }
        out->gpu_valid = any;
        out->gpu_joules = mj / 1e3;
    }
    double uj = rapl_uj();
    out->cpu_valid = uj >= 0;
    out->cpu_joules = uj >= 0 ? uj / 1e6 : 0;
    return 0;
}
