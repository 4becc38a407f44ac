#ifndef C_WORMHOLE_SYSTEM_H
#define C_WORMHOLE_SYSTEM_H

#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE  // for CPU_SET and sched_setaffinity
#endif

#include <stddef.h>
#include <stdint.h>

/// CRC-32C (Castagnoli) of `length` bytes, continuing from `crc` (0 to start). Uses the SSE 4.2 instruction
/// where the CPU has it, a table otherwise; both give the same value.
uint32_t cwormhole_crc32c(uint32_t crc, const void *bytes, size_t length);

/// Sends `head` followed by `body` as one packet on a connected socket (`sendmsg` with two parts, so that neither is
/// copied into the other first), without raising SIGPIPE where the platform has MSG_NOSIGNAL; with `wait` 0, without
/// waiting for room (MSG_DONTWAIT). Returns the bytes sent, or -1 with errno set.
long cwormhole_send_parts(
    int socket, const void *head, size_t headLength, const void *body, size_t bodyLength, int wait);

/// Reads a 64-bit counter in memory shared with other processes (a `MAP_SHARED` mapping), with acquire ordering.
static inline uint64_t cwormhole_shared_load(const uint64_t *counter) {
    return __atomic_load_n(counter, __ATOMIC_ACQUIRE);
}

/// Adds 1 to a 64-bit counter in memory shared with other processes, with release ordering.
static inline void cwormhole_shared_increment(uint64_t *counter) {
    (void)__atomic_fetch_add(counter, 1, __ATOMIC_ACQ_REL);
}

/// The calling thread's callback driver (an opaque object of WormholeKit's), or NULL: a C11 thread-local, far
/// cheaper to read per message than a pthread key or Foundation's thread dictionary.
void *cwormhole_current_driver(void);

/// Sets the calling thread's callback driver (NULL to clear it).
void cwormhole_set_current_driver(void *driver);

/// Whether the calling thread is running a handler of the inotify monitor: 1 or 0 (a C11 thread-local).
int cwormhole_inotify_handler_running(void);

/// Sets whether the calling thread is running a handler of the inotify monitor.
void cwormhole_set_inotify_handler_running(int running);

#if defined(__linux__)
#include <sys/eventfd.h>
#include <sys/vfs.h>
#include <sched.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <errno.h>

/// Creates a close-on-exec, non-blocking eventfd (Glibc's module map does not import eventfd).
static inline int cwormhole_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

/// The type of the file system holding an open file (`fstatfs`'s `f_type`: 0xEF53 for ext2/3/4, 0x01021994 for
/// tmpfs), or -1 with errno set (Glibc's module map does not import statfs).
static inline long cwormhole_file_system_type(int fd) {
    struct statfs info;
    return fstatfs(fd, &info) == 0 ? (long)info.f_type : -1;
}

/// Frees the blocks of [offset, offset + length) without changing the file's size or later offsets
/// (fallocate with FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE). Returns 0, or -1 with errno set.
int cwormhole_punch_hole(int fd, long long offset, long long length);

/// Creates a close-on-exec epoll instance that waits for input on `first` and `second` (level-triggered, as `poll`):
/// registered once, where `poll` adds and removes itself on both descriptors' wait queues at every call. Returns the
/// instance, or -1 with errno set.
int cwormhole_epoll_pair(int first, int second);

/// Waits up to `timeout` milliseconds (-1: for ever) on an instance made by `cwormhole_epoll_pair`; sets bit 0 of
/// `*ready` when `first` has input and bit 1 when `second` has. Returns how many have (0: timed out), or -1 with errno
/// set.
int cwormhole_epoll_wait_pair(int epoll, int timeout, int *ready);

/// The user id of the process at the other end of a connected Unix socket (SO_PEERCRED). Returns 0, or -1.
int cwormhole_peer_uid(int socket, unsigned int *uid);

/// Receives up to `count` packets waiting on a socket with one call and without blocking (recvmmsg with
/// MSG_DONTWAIT): packet `i` goes into `buffers + i * size`, its length into `lengths[i]` (0: the peer closed the
/// connection; `size + 1`: the packet did not fit and was cut). Returns how many were received, fewer than `count` when
/// no more were waiting or the connection failed after them (the next call then returns the error); -1 with errno set
/// (EAGAIN: none was waiting). `count` is at most 64.
int cwormhole_receive_packets(int socket, void *buffers, size_t size, unsigned int count, size_t *lengths);

/// As `cwormhole_receive_packets`, but waits for the first packet (`MSG_WAITFORONE`), then takes those already waiting
/// without waiting more: a lone datagram costs one call, a burst few. Retried when a signal interrupts the wait.
int cwormhole_receive_packets_waiting(int socket, void *buffers, size_t size, unsigned int count, size_t *lengths);

/// Names the calling thread (at most 15 characters are kept), as `ps -L` and debuggers show it.
static inline void cwormhole_set_thread_name(const char *name) { pthread_setname_np(pthread_self(), name); }

/// Copies the calling thread's name into `buffer` (16 bytes are enough).
static inline int cwormhole_thread_name(char *buffer, size_t size) {
    return pthread_getname_np(pthread_self(), buffer, size);
}


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
