/*
 * trainhook-launch: the entry point trainhook delivers into every gang pod (docs/use/delivery.md).
 *
 * Why a program and not a script: a `#!/bin/sh` entry point cannot start in an image without a shell
 * (distroless or Chainguard Python); the kubelet then reports only "exec ...: no such file or directory" and the
 * container crash-loops with no fix named. This program needs nothing from the image (it is linked statically,
 * as Tekton's entrypoint and Argo's emissary are): it finds the image's own Python on PATH, python3 first, then
 * python (what `command -v` finds, as the shell script did), and execs
 *
 *     PYTHON -I -S DIR/launcher.pyz ARGS...
 *
 * (isolated from the user's PYTHON* variables and user site, and without `site`: the launcher needs nothing from
 * site-packages, and `site` with its .pth files was ~3 ms of every start's CPU; the training it runs is the
 * user's own command, under their Python as they wrote it), where DIR is where it was delivered: its own path up
 * to the last "/bin/", as the shell script cut its $0.
 * It execs, so nothing of it stays: the Python has its pid, its exit code and its signals. The zip's first lines
 * check the Python's version (3.8 or newer) and name the fix (launcher/deliver.py MAIN). With no Python on PATH
 * it prints one line naming the fix and exits 127, as a shell does for a missing command.
 *
 * Standard C and POSIX only, no stdio: it builds with musl (about 20 KB: the webhook keeps it in a ConfigMap
 * beside the zip, 1 MiB at most) or glibc (`cc -static -Os -s`). tests/launcher/test_delivery_entry.py runs it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZIP_NAME "launcher.pyz"
/* launcher/deliver.py FIX, word for word (tests/launcher/test_delivery_entry.py compares the line this prints). */
#define FIX "use an image with python3 3.8 or newer on PATH, or opt the gang out with the annotation " \
            "trainhook.dev/launcher: none (docs/use/delivery.md says what is lost)"
#define NO_PYTHON "trainhook-launch: no python3 or python on PATH in this image; " FIX "\n"
/* dash's default when PATH is unset (a container always has one; a bare exec may not). */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static void say(const char *a, const char *b, const char *c) {
    const char *parts[] = {"trainhook-launch: ", a, b, c, "\n"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i] != NULL && write(2, parts[i], strlen(parts[i])) < 0) {
            return;
        }
    }
}

static char *join(const char *dir, size_t dir_len, const char *name) {
    size_t name_len = strlen(name);
    char *path = malloc(dir_len + 1 + name_len + 1);
    if (path == NULL) {
        say("out of memory", NULL, NULL);
        exit(127);
    }
    memcpy(path, dir, dir_len);
    path[dir_len] = '/';
    memcpy(path + dir_len + 1, name, name_len + 1);
    return path;
}

/* The first executable regular file `name` in PATH's directories; an empty entry is the working directory. */
static char *find_on_path(const char *name) {
    const char *path = getenv("PATH");
    if (path == NULL) {
        path = DEFAULT_PATH;
    }
    for (;;) {
        const char *end = strchr(path, ':');
        size_t len = end == NULL ? strlen(path) : (size_t)(end - path);
        char *candidate = len == 0 ? join(".", 1, name) : join(path, len, name);
        struct stat st;
        if (stat(candidate, &st) == 0 && S_ISREG(st.st_mode) && access(candidate, X_OK) == 0) {
            return candidate;
        }
        free(candidate);
        if (end == NULL) {
            return NULL;
        }
        path = end + 1;
    }
}

/* DIR/launcher.pyz, DIR being `self` up to its last "/bin/" ("bin/x" alone: the working directory). */
static char *zip_beside(const char *self) {
    const char *cut = NULL;
    for (const char *p = strstr(self, "/bin/"); p != NULL; p = strstr(p + 1, "/bin/")) {
        cut = p;
    }
    if (cut != NULL) {
        return join(self, (size_t)(cut - self), ZIP_NAME);
    }
    if (strncmp(self, "bin/", 4) == 0) {
        return join(".", 1, ZIP_NAME);
    }
    return NULL;
}

int main(int argc, char **argv) {
    (void)argc;
    char *zip = zip_beside(argv[0] != NULL ? argv[0] : "");
    if (zip == NULL) {
        /* Started under a name without its directory: where the kernel found it. */
        static char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = '\0';
            zip = zip_beside(self);
        }
    }
    if (zip == NULL) {
        say("cannot tell where " ZIP_NAME " is: run me as DIR/bin/trainhook-launch (e.g. ",
            "/trainhook/bin/trainhook-launch", ")");
        return 127;
    }
    static const char *const names[] = {"python3", "python"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *python = find_on_path(names[i]);
        if (python == NULL) {
            continue;
        }
        char **args = malloc(sizeof(char *) * ((size_t)argc + 4));
        if (args == NULL) {
            say("out of memory", NULL, NULL);
            return 127;
        }
        args[0] = python;
        args[1] = "-I";
        args[2] = "-S";
        args[3] = zip;
        for (int j = 1; j < argc; j++) {
            args[j + 3] = argv[j];
        }
        args[argc + 3] = NULL;
        execv(python, args);
        int failed = errno;  /* as a shell's exec: 127 when not found, 126 when found but not runnable */
        say("cannot run ", python, failed == ENOENT ? ": no such file (a broken interpreter line?)" : ": not runnable");
        return failed == ENOENT ? 127 : 126;
    }
    if (write(2, NO_PYTHON, sizeof NO_PYTHON - 1) < 0) {
        return 127;
    }
    return 127;
}
