/*
 * The CLI's entry into glibc, for glibc 2.28 and newer whatever glibc builds it.
 *
 * The toolchain's startup object (Scrt1.o) calls __libc_start_main, which a glibc 2.34 or
 * newer binds to its version GLIBC_2.34: the binary then refuses to start on older glibc.
 * The older version is still exported by every newer glibc. It expects the program to pass
 * the function that runs the program's constructors (the toolchains before 2.34 linked one
 * in, __libc_csu_init); glibc 2.34 and newer call such a function instead of running them
 * themselves. So the CLI is linked with --wrap=__libc_start_main (Makefile): the startup
 * object's call comes here, and goes on to the old version with a constructor runner of
 * its own (_init, then .init_array in order, as __libc_csu_init did). Destructors need
 * nothing: the dynamic loader runs the executable's .fini_array on every glibc since 2.2.
 *
 * Only where src/base/glibc-compat.h binds old versions (not in sanitizer builds); elsewhere
 * the call goes straight through.
 */
#include "cli.h"

#ifdef FT__GLIBC_BASE
typedef int (*start_main_fn)(int, char **, char **);
typedef void (*init_fn)(int, char **, char **);

int ft__libc_start_main_old(start_main_fn main_fn, int argc, char **argv, init_fn init,
                            void (*fini)(void), void (*rtld_fini)(void), void *stack_end);
__asm__(".symver ft__libc_start_main_old,__libc_start_main@" FT__GLIBC_BASE);

int __wrap___libc_start_main(start_main_fn main_fn, int argc, char **argv, init_fn init,
                             void (*fini)(void), void (*rtld_fini)(void), void *stack_end);

extern void _init(void);
/* provided by the linker for an executable */
extern init_fn __init_array_start[] __attribute__((visibility("hidden")));
extern init_fn __init_array_end[] __attribute__((visibility("hidden")));

static void run_constructors(int argc, char **argv, char **envp)
{
    _init();
    for (init_fn *f = __init_array_start; f < __init_array_end; f++)
        (*f)(argc, argv, envp);
}

int __wrap___libc_start_main(start_main_fn main_fn, int argc, char **argv, init_fn init,
                             void (*fini)(void), void (*rtld_fini)(void), void *stack_end)
{
    (void)fini;
    return ft__libc_start_main_old(main_fn, argc, argv, init ? init : run_constructors, NULL,
                                   rtld_fini, stack_end);
}
#else
/* glibc's own versions (sanitizer builds, other architectures): straight through */
int __real___libc_start_main(int (*main_fn)(int, char **, char **), int argc, char **argv,
                             void (*init)(int, char **, char **), void (*fini)(void),
                             void (*rtld_fini)(void), void *stack_end);
int __wrap___libc_start_main(int (*main_fn)(int, char **, char **), int argc, char **argv,
                             void (*init)(int, char **, char **), void (*fini)(void),
                             void (*rtld_fini)(void), void *stack_end);

int __wrap___libc_start_main(int (*main_fn)(int, char **, char **), int argc, char **argv,
                             void (*init)(int, char **, char **), void (*fini)(void),
                             void (*rtld_fini)(void), void *stack_end)
{
    return __real___libc_start_main(main_fn, argc, argv, init, fini, rtld_fini, stack_end);
}
#endif
