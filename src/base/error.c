#include "base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
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

void ft__first_err_init(ft__first_err *c)
{
    pthread_mutex_init(&c->lock, NULL);
    c->index = UINT32_MAX;
    c->err = 0;
    c->detail[0] = '\0';
}

void ft__first_err_note(ft__first_err *c, unsigned index, int err)
{
    pthread_mutex_lock(&c->lock);
    if (index < c->index) {
        c->index = index;
        c->err = err;
        ft__detail_save(c->detail);
    }
    pthread_mutex_unlock(&c->lock);
}

int ft__first_err_take(ft__first_err *c)
{
    pthread_mutex_destroy(&c->lock);
    if (c->index == UINT32_MAX)
        return 0;
    ft__detail_restore(c->detail);
    return c->err;
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
    /* GNU strerror_r: a static string for known errors, else "Unknown error N" in buf
     * (strerrordesc_np would need glibc 2.32) */
    static _Thread_local char buf[48];
    return strerror_r(err, buf, sizeof buf);
}

const char *ft_version(void)
{
    return FT_VERSION_STRING;
}
