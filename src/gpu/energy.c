/* Energy counters: GPU energy from NVML (dlopen libnvidia-ml.so.1), CPU package energy from
 * /sys/class/powercap (RAPL), each reported only where readable. */
#include "cuda.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
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

/* Sum of the RAPL package counters (microjoules), or -1. */
static double rapl_uj(void)
{
    DIR *d = opendir("/sys/class/powercap");
    if (!d)
        return -1;
    double total = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        /* top-level packages only: intel-rapl:N (not intel-rapl:N:M subzones) */
        if (strncmp(e->d_name, "intel-rapl:", 11) != 0 || strchr(e->d_name + 11, ':'))
            continue;
        char p[512];
        snprintf(p, sizeof p, "/sys/class/powercap/%s/energy_uj", e->d_name);
        FILE *f = fopen(p, "r");
        unsigned long long v;
        if (f && fscanf(f, "%llu", &v) == 1)
            total = (total < 0 ? 0 : total) + (double)v;
        if (f)
            fclose(f);
    }
    closedir(d);
    return total;
}

int ft_energy_sample(ft_energy *out)
{
    if (!out)
        return -22;
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
