#!/usr/bin/env bash
# Build an LD_PRELOAD library that logs every NVML call a program makes, with its return
# code, and passes the call on unchanged to the libnvidia-ml.so.1 the program loaded (the
# real driver's or gpushare's simulated one alike).
#
#   tests/nvidia/nvml-trace.sh OUT.so BINARY...
#
# One wrapper per nvml* function the BINARYs reference (nm -D --undefined-only; go-nvml
# references all of nvml.h), except nvmlErrorString (it returns a string, not a code).
# At run time, with LD_PRELOAD=OUT.so and NVML_TRACE=FILE, each call appends one line
#
#   <function> <return code> <first argument> <second argument>
#
# (arguments in hex: for most calls the handle, then an index or a pointer) to FILE; a
# function the loaded library lacks is logged as "<function> ABSENT" and answers
# NVML_ERROR_FUNCTION_NOT_FOUND (13), where without the trace the program would stop with
# "symbol lookup error". Without NVML_TRACE nothing is written.
#
# How it forwards: NVML's functions take only integers and pointers (no floats, no structs
# by value), at most 8 of them; on x86-64 and aarch64 a wrapper that takes and passes 8
# integer registers forwards any of them unchanged (the extra ones are ignored by the
# callee). nvmlReturn_t is an int.
set -euo pipefail
OUT=${1:?usage: nvml-trace.sh OUT.so BINARY...}
shift
[ $# -gt 0 ] || { echo "usage: nvml-trace.sh OUT.so BINARY..." >&2; exit 2; }
command -v "${CC:-gcc}" >/dev/null || { echo "a C compiler (${CC:-gcc}) is needed" >&2; exit 2; }
case "$(uname -m)" in x86_64 | aarch64) ;; *) echo "nvml-trace: only x86_64 and aarch64 are supported" >&2; exit 2 ;; esac
SRC=$(mktemp /tmp/nvml-trace.XXXXXX.c)
trap 'rm -f "$SRC"' EXIT
{
    cat <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef unsigned long long u64;
typedef int (*nvml_fn)(u64, u64, u64, u64, u64, u64, u64, u64);
static nvml_fn real(const char *name) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_NOLOAD);
    void *f = lib ? dlsym(lib, name) : NULL;
    if (!f) f = dlsym(RTLD_NEXT, name);
    return (nvml_fn)f;
}
static void say(const char *line) {
    const char *path = getenv("NVML_TRACE");
    if (!path) return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t n = write(fd, line, strlen(line)); /* one write per line: whole lines from threads */
    (void)n;
    close(fd);
}
static int call(const char *name, nvml_fn *cache, u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h) {
    char line[256];
    if (!*cache) *cache = real(name);
    if (!*cache) {
        snprintf(line, sizeof line, "%s ABSENT\n", name);
        say(line);
        return 13; /* NVML_ERROR_FUNCTION_NOT_FOUND */
    }
    int rc = (*cache)(a, b, c, d, e, f, g, h);
    snprintf(line, sizeof line, "%s %d %#llx %#llx\n", name, rc, a, b);
    say(line);
    return rc;
}
#define WRAP(name) \
    int name(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f, u64 g, u64 h) { \
        static nvml_fn cache; \
        return call(#name, &cache, a, b, c, d, e, f, g, h); \
    }
EOF
    for b in "$@"; do nm -D --undefined-only "$b" | awk '{print $2}'; done | grep '^nvml' | sed 's/@.*//' |
        grep -v -x nvmlErrorString | sort -u | sed 's/.*/WRAP(&)/'
} > "$SRC"
"${CC:-gcc}" -shared -fPIC -O1 -fno-builtin -w -o "$OUT" "$SRC" -ldl
echo "nvml-trace: $OUT wraps $(grep -c '^WRAP(' "$SRC") nvml* functions"
