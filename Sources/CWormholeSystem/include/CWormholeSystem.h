#ifndef C_WORMHOLE_SYSTEM_H
#define C_WORMHOLE_SYSTEM_H

#if defined(__linux__)
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sys/eventfd.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <errno.h>

/// Creates a close-on-exec, non-blocking eventfd (Glibc's module map does not import eventfd).
static inline int cwormhole_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

/// Pins the calling thread, and the children it spawns later, to one CPU. Returns 0 or -1 with errno set.
static inline int cwormhole_pin_to_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof(set), &set);
}

/// The CPU the calling thread runs on now, or -1.
static inline int cwormhole_current_cpu(void) { return sched_getcpu(); }

/// Renames without replacing: fails with EEXIST when `to` exists (renameat2 with RENAME_NOREPLACE).
static inline int cwormhole_rename_noreplace(int fromdir, const char *from, int todir, const char *to) {
#ifdef SYS_renameat2
    return (int)syscall(SYS_renameat2, fromdir, from, todir, to, 1 /* RENAME_NOREPLACE */);
#else
    errno = ENOSYS;
    return -1;
#endif
}
#endif

#endif
