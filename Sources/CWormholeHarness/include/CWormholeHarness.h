#ifndef CWORMHOLE_HARNESS_H
#define CWORMHOLE_HARNESS_H

#ifdef __linux__
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>

/// Pins the calling thread, and the children it spawns later, to one CPU, so that both sides of a benchmark share
/// it. Returns 0, or -1 with errno set.
static inline int cwormhole_pin_to_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof(set), &set);
}
#endif

#endif
