/* The context: settings, thread pool, bounce-buffer pool, per-engine state and what the
 * layers above keep on it. */
#include "internal.h"
#include "../engine/engine.h"

#include <errno.h>
#include <stdlib.h>

int ft_ctx_create(ft_ctx **out, const ft_config *cfg_in)
{
    if (!out)
        return ft__err(-EINVAL, "ft_ctx_create: out is NULL");
    ft_config cfg;
    int rc;
    if (cfg_in)
        cfg = *cfg_in;
    else if ((rc = ft_config_init(&cfg)) < 0)
        return rc;
    if ((rc = ft__config_resolve(&cfg)) < 0)
        return rc;
    ft_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return ft__err(-ENOMEM, "context");
    ctx->cfg = cfg;
    pthread_mutex_init(&ctx->reg_lock, NULL);
    pthread_mutex_init(&ctx->ext_lock, NULL);
    if ((rc = ft__bufpool_create(&ctx->bounce, cfg.bounce_size, 2 * cfg.threads + 2)) < 0 ||
        (rc = ft__auto_create(&ctx->autosel)) < 0 ||
        (rc = ft__stage_create(&ctx->stage, cfg.bounce_size)) < 0 ||
        (rc = ft__pool_create(&ctx->pool, cfg.threads)) < 0) {
        ft_ctx_destroy(ctx);
        return rc == -ENOMEM ? ft__err(rc, "context") : rc;
    }
    for (int id = 0; id < FT_ENGINE_COUNT; id++) {
        const ft__engine_ops *ops = ft__engine_get((ft_engine)id);
        if (ops && ops->ctx_init && (rc = ops->ctx_init(ctx)) < 0) {
            FT__KEEPING_DETAIL(ft_ctx_destroy(ctx));
            return rc;
        }
    }
    *out = ctx;
    return 0;
}

void ft_ctx_destroy(ft_ctx *ctx)
{
    if (!ctx)
        return;
    ft__pool_destroy(ctx->pool);
    ft__reg_release_all(ctx);
    pthread_mutex_destroy(&ctx->reg_lock);
    ft__auto_destroy(ctx->autosel);
    for (int id = 0; id < FT_ENGINE_COUNT; id++) {
        const ft__engine_ops *ops = ft__engine_get((ft_engine)id);
        if (ops && ops->ctx_fini)
            ops->ctx_fini(ctx);
    }
    ft__bufpool_destroy(ctx->bounce);
    for (unsigned i = 0; i < FT__CTX_EXTS; i++)
        if (ctx->ext[i].key)
            ctx->ext[i].destroy(ctx->ext[i].obj);
    pthread_mutex_destroy(&ctx->ext_lock);
    ft__stage_destroy(ctx->stage);
    free(ctx);
}

void *ft__ctx_ext(ft_ctx *ctx, const void *key, void *(*make)(ft_ctx *ctx),
                  void (*destroy)(void *obj))
{
    void *obj = NULL;
    pthread_mutex_lock(&ctx->ext_lock);
    unsigned i = 0;
    while (i < FT__CTX_EXTS && ctx->ext[i].key && ctx->ext[i].key != key)
        i++;
    if (i < FT__CTX_EXTS && ctx->ext[i].key)
        obj = ctx->ext[i].obj;
    else if (i < FT__CTX_EXTS && (obj = make(ctx)))
        ctx->ext[i] = (ft__ext_slot){.key = key, .obj = obj, .destroy = destroy};
    pthread_mutex_unlock(&ctx->ext_lock);
    return obj;
}

void ft_ctx_config(const ft_ctx *ctx, ft_config *cfg)
{
    *cfg = ctx->cfg;
}
