/*
 * Where AUTO keeps its profiles: FASTENSOR_PROFILE ("off": nowhere; a directory: one profile
 * per device there; any other value: the file itself), else $XDG_CACHE_HOME/fastensor, else
 * $HOME/.cache/fastensor. The profiles (auto.c) and the ".active" file of AUTO's company
 * (company.c) are found here.
 */
#include "internal.h"
#include "../base/syscall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void ft__profile_place(char *dir, char *file, size_t len, bool make)
{
    const char *env = getenv("FASTENSOR_PROFILE");
    dir[0] = file[0] = '\0';
    if (env && !strcmp(env, "off"))
        return;
    struct stat st;
    if (env && *env && !(ft__sys.stat(env, &st) == 0 && S_ISDIR(st.st_mode))) {
        snprintf(file, len, "%s", env);
        return;
    }
    if (env && *env)
        snprintf(dir, len, "%s", env);
    else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
        snprintf(dir, len, "%s/fastensor", getenv("XDG_CACHE_HOME"));
    else if (getenv("HOME") && *getenv("HOME"))
        snprintf(dir, len, "%s/.cache/fastensor", getenv("HOME"));
    else
        return;
    if (!env && make) { /* create the default directory (and .cache) on first use */
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", dir);
        char *slash = strrchr(parent, '/');
        if (slash) {
            *slash = '\0';
            ft__sys.mkdir(parent, 0755); /* EEXIST mostly; a failure shows when it is saved */
        }
        ft__sys.mkdir(dir, 0755);
    }
}

