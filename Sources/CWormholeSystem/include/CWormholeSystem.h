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

/// Sends one frame on a connected stream socket: a 4-byte little-endian length, then `head` and `body` (one
/// `sendmsg` of three parts, so that nothing is copied first). Stream sockets carry a connection's packets where
/// sequenced-packet sockets do not exist (XNU's local domain has stream and datagram sockets only). Without `wait`, a
/// socket with no room fails with EAGAIN having sent nothing; a frame begun is always finished, waiting if need be
/// (bounded by the socket's SO_SNDTIMEO), so that no half frame is left on the connection. Returns the bytes of the
/// packet sent (`headLength + bodyLength`), or -1 with errno set (EMSGSIZE for a packet longer than 16 MiB).
long cwormhole_send_frame(
    int socket, const void *head, size_t headLength, const void *body, size_t bodyLength, int wait);

/// Receives one frame of a connected stream socket into `buffer`. Returns the packet's length (1 or more), 0 when the
/// peer closed the connection (or sent an empty packet, which no sender of ours does), or -1 with errno set: EAGAIN
/// when, without `wait`, no whole frame is waiting yet (nothing is consumed then: the frame is read once whole, so
/// that a peer that stops in the middle of one holds up nobody); EMSGSIZE when the frame is longer than `size` (close
/// the connection); a timeout of the socket's SO_RCVTIMEO as EAGAIN too. The socket's receive buffer must hold the
/// largest frame (PacketSocket sets it), or a frame that cannot be whole there is never read without `wait`.
long cwormhole_receive_frame(int socket, void *buffer, size_t size, int wait);

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

#include <pthread.h>

/// Names the calling thread (Linux keeps 15 characters, Darwin 63), as `ps -L` and debuggers show it. Darwin's
/// `pthread_setname_np` names the calling thread only and takes the name alone (libpthread's `pthread.h`).
static inline void cwormhole_set_thread_name(const char *name) {
#if defined(__APPLE__)
    (void)pthread_setname_np(name);
#else
    (void)pthread_setname_np(pthread_self(), name);
#endif
}

/// Copies the calling thread's name into `buffer` (16 bytes are enough on Linux; Darwin's are cut to fit).
/// `pthread_getname_np(pthread_t, char *, size_t)` is the same on both.
static inline int cwormhole_thread_name(char *buffer, size_t size) {
    return pthread_getname_np(pthread_self(), buffer, size);
}

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

#endif

// The calls that durability and space need, by each platform's own names: the constants come from its headers, never
// from numbers written here (Darwin's SEEK_DATA is 4, Linux's 3). The Darwin branches were read against xnu's
// bsd/sys/fcntl.h and bsd/sys/unistd.h and Libc's stdio.h (ARCHITECTURE.md, "Apple platforms").

/// Flushes a file's data and metadata to stable storage. On Darwin `fsync` leaves them in the drive's cache, so
/// F_FULLFSYNC asks the drive to flush it (falling back to `fsync` where the file system refuses F_FULLFSYNC, as
/// network ones do); elsewhere `fsync`. Returns 0, or -1 with errno set.
int cwormhole_full_sync(int fd);

/// Frees the blocks of [offset, offset + length) without changing the file's size or later offsets: Linux's
/// fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE), Darwin's fcntl(F_PUNCHHOLE) (APFS; offset and length are
/// multiples of the block size, which the callers' 4096 is). Returns 0, or -1 with errno set (ENOTSUP, EINVAL where
/// the file system cannot).
int cwormhole_punch_hole(int fd, long long offset, long long length);

/// The first offset at or after `offset` that holds data (lseek with SEEK_DATA), or -1 with errno set (ENXIO: none;
/// EINVAL or ENOSYS where the file system or platform cannot tell).
long long cwormhole_seek_data(int fd, long long offset);

/// Renames without replacing: fails with EEXIST when `to` exists. Linux's renameat2 with RENAME_NOREPLACE, Darwin's
/// renameatx_np with RENAME_EXCL; ENOSYS, EINVAL or ENOTSUP where the file system or kernel cannot.
int cwormhole_rename_noreplace(int fromdir, const char *from, int todir, const char *to);

#endif
