#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char detail[FT__DETAIL_MAX];

int ft__err(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (n >= 0 && err < 0 && (size_t)n < sizeof detail)
        snprintf(detail + n, sizeof detail - (size_t)n, ": %s", ft_strerror(err));
    return err;
}

void ft__detail_save(char *dst)
{
    memcpy(dst, detail, FT__DETAIL_MAX);
}

void ft__detail_restore(const char *src)
{
    if (src != detail)
        snprintf(detail, sizeof detail, "%s", src);
}

const char *ft_last_error(void)
{
    return detail;
}

const char *ft_strerror(int err)
{
    if (err < 0)
        err = -err;
    if (err == 0)
        return "success";
    const char *s = strerrordesc_np(err);
    return s ? s : "unknown error";
}

const char *ft_version(void)
{
    return FT_VERSION_STRING;
}
