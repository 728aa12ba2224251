/*
 * Included first into every file of the library, the CLI and the extension (not sanitizer
 * builds): the glibc functions whose default version is newer than glibc 2.28 are bound to
 * the older versions glibc still exports, so what is built on a new glibc loads on glibc 2.28
 * or newer (the CLI's startup code, from the toolchain, goes through tools/start.c). glibc
 * 2.34 moved the pthread and dl functions into libc.so.6 under new versions (the old ones
 * stay: in libc.so.6 there, in libpthread.so.0 / libdl.so.2 before, which the link names
 * too). stat and fstat (2.33 as functions) go through syscall.c's own wrappers (the CLI uses
 * statx, 2.28) and strerrordesc_np (2.32) is not used.
 */
#ifndef FT_GLIBC_COMPAT_H
#define FT_GLIBC_COMPAT_H

#if defined(__linux__) && !defined(__ASSEMBLER__)
#if defined(__x86_64__)
#define FT__GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define FT__GLIBC_BASE "GLIBC_2.17"
#endif
#ifdef FT__GLIBC_BASE
__asm__(".symver dlopen,dlopen@" FT__GLIBC_BASE);
__asm__(".symver dlsym,dlsym@" FT__GLIBC_BASE);
__asm__(".symver dlclose,dlclose@" FT__GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" FT__GLIBC_BASE);
__asm__(".symver pthread_create,pthread_create@" FT__GLIBC_BASE);
__asm__(".symver pthread_join,pthread_join@" FT__GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" FT__GLIBC_BASE);
__asm__(".symver pthread_detach,pthread_detach@" FT__GLIBC_BASE);
__asm__(".symver pthread_key_create,pthread_key_create@" FT__GLIBC_BASE);
__asm__(".symver pthread_setspecific,pthread_setspecific@" FT__GLIBC_BASE);
__asm__(".symver pthread_getspecific,pthread_getspecific@" FT__GLIBC_BASE);
/* libm: glibc 2.29 gave these new versions (faster, no SVID error handling) */
__asm__(".symver exp,exp@" FT__GLIBC_BASE);
__asm__(".symver log,log@" FT__GLIBC_BASE);
__asm__(".symver pow,pow@" FT__GLIBC_BASE);
__asm__(".symver exp2,exp2@" FT__GLIBC_BASE);
__asm__(".symver log2,log2@" FT__GLIBC_BASE);
#endif
#endif

#endif
