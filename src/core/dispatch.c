/* One transfer through one engine: device memory through pinned staging where the engine
 * does not move it itself (io.c for every call, fill.c for the fill arm's copies). */
#include "internal.h"
#include "../engine/engine.h"
#include "../gpu/cuda.h"

int64_t ft__dispatch(const ft__io *io, ft_engine engine, bool write, void *ready)
{
    const ft__engine_ops *ops = ft__engine_get(engine);
    if (io->device >= 0 && !(ops->caps & FT__CAP_DEVICE_MEMORY)) /* via pinned staging */
        return ft__stage_transfer(io, ops, write, io->device, ready);
    if (io->device >= 0 && !(ops->caps & FT__CAP_STREAM_ORDER)) {
        /* cuFile runs on no stream: wait for the caller's on the host */
        int rc = ft__cuda_event_wait(io->device, ready);
        if (rc < 0)
            return rc;
    }
    ft__io run = *io;
    run.ready = ready;
    return write ? ops->write(&run) : ops->read(&run);
}
