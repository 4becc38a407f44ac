#include "CWormholeSystem.h"

#include <sys/socket.h>
#include <sys/uio.h>

static _Thread_local void *current_driver = 0;

void *cwormhole_current_driver(void) { return current_driver; }

void cwormhole_set_current_driver(void *driver) { current_driver = driver; }

static _Thread_local int inotify_handler_running = 0;

int cwormhole_inotify_handler_running(void) { return inotify_handler_running; }

void cwormhole_set_inotify_handler_running(int running) { inotify_handler_running = running; }

long cwormhole_send_parts(
    int socket, const void *head, size_t headLength, const void *body, size_t bodyLength, int wait) {
    struct iovec parts[2] = {{(void *)head, headLength}, {(void *)body, bodyLength}};
    struct msghdr message = {0};
    message.msg_iov = parts;
    message.msg_iovlen = bodyLength > 0 ? 2 : 1;
    int flags = wait ? 0 : MSG_DONTWAIT;
#ifdef MSG_NOSIGNAL
    flags |= MSG_NOSIGNAL;
#endif
    return (long)sendmsg(socket, &message, flags);
}

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

/// The longest packet a frame carries: far above the live packets' 68 KiB, so that a length past it is damage.
#define FRAME_LIMIT (16u << 20)

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0  // Darwin: PacketSocket sets SO_NOSIGPIPE on the socket instead
#endif

long cwormhole_send_frame(
    int socket, const void *head, size_t headLength, const void *body, size_t bodyLength, int wait) {
    size_t packet = headLength + bodyLength;
    if (packet > FRAME_LIMIT) {
        errno = EMSGSIZE;
        return -1;
    }
    unsigned char length[4] = {(unsigned char)packet, (unsigned char)(packet >> 8), (unsigned char)(packet >> 16),
                               (unsigned char)(packet >> 24)};
    struct iovec parts[3] = {{length, 4}, {(void *)head, headLength}, {(void *)body, bodyLength}};
    size_t total = 4 + packet, sent = 0;
    while (sent < total) {
        // The parts not yet sent, from the one `sent` falls in.
        struct iovec rest[3];
        int count = 0;
        size_t skip = sent;
        for (int index = 0; index < 3; index++) {
            if (skip >= parts[index].iov_len) {
                skip -= parts[index].iov_len;
                continue;
            }
            rest[count].iov_base = (char *)parts[index].iov_base + skip;
            rest[count].iov_len = parts[index].iov_len - skip;
            skip = 0;
            count++;
        }
        struct msghdr message;
        memset(&message, 0, sizeof message);
        message.msg_iov = rest;
        message.msg_iovlen = count;
        // Only the first call may give up for want of room: once a frame is begun, it is finished.
        int flags = MSG_NOSIGNAL | (!wait && sent == 0 ? MSG_DONTWAIT : 0);
        ssize_t done = sendmsg(socket, &message, flags);
        if (done < 0) {
            if (errno == EINTR) continue;
            if (sent > 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait) return -1;  // SO_SNDTIMEO ran out
            if (sent > 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                // A non-blocking socket cannot finish here: wait for room, then go on.
                struct pollfd room = {socket, POLLOUT, 0};
                (void)poll(&room, 1, 1000);
                continue;
            }
            return -1;
        }
        sent += (size_t)done;
    }
    return (long)packet;
}

long cwormhole_receive_frame(int socket, void *buffer, size_t size, int wait) {
    unsigned char length[4];
    ssize_t peeked;
    do peeked = recv(socket, length, 4, MSG_PEEK | (wait ? MSG_WAITALL : MSG_DONTWAIT));
    while (peeked < 0 && errno == EINTR);
    if (peeked < 0) return -1;
    if (peeked == 0) return 0;
    if (peeked < 4) {
        if (!wait) {
            errno = EAGAIN;
            return -1;
        }
        return 0;  // the peer closed the connection inside a frame's length
    }
    size_t packet = (size_t)length[0] | (size_t)length[1] << 8 | (size_t)length[2] << 16 | (size_t)length[3] << 24;
    if (packet > size || packet > FRAME_LIMIT) {
        errno = EMSGSIZE;
        return -1;
    }
    if (!wait) {
        int waiting = 0;
        if (ioctl(socket, FIONREAD, &waiting) != 0) return -1;
        if ((size_t)waiting < 4 + packet) {
            errno = EAGAIN;
            return -1;
        }
    }
    ssize_t got;
    do got = recv(socket, length, 4, MSG_WAITALL);
    while (got < 0 && errno == EINTR);
    if (got != 4) return got < 0 ? -1 : 0;
    size_t done = 0;
    while (done < packet) {
        ssize_t part = recv(socket, (char *)buffer + done, packet - done, MSG_WAITALL);
        if (part < 0 && errno == EINTR) continue;
        if (part < 0) return -1;
        if (part == 0) return 0;  // closed inside the frame
        done += (size_t)part;
    }
    return (long)packet;
}

int cwormhole_full_sync(int fd) {
#if defined(__APPLE__)
    if (fcntl(fd, F_FULLFSYNC) == 0) return 0;
    // F_FULLFSYNC is refused by file systems that have no way to flush the drive (network ones): fsync is the most
    // they do.
    if (errno != ENOTSUP && errno != EINVAL && errno != ENOTTY) return -1;
#endif
    int result;
    do result = fsync(fd);
    while (result != 0 && errno == EINTR);
    return result;
}

long long cwormhole_seek_data(int fd, long long offset) {
#if defined(SEEK_DATA)
    return (long long)lseek(fd, (off_t)offset, SEEK_DATA);
#else
    (void)fd;
    (void)offset;
    errno = ENOSYS;
    return -1;
#endif
}

#if defined(__APPLE__)
int cwormhole_punch_hole(int fd, long long offset, long long length) {
    struct fpunchhole hole = {0};
    hole.fp_offset = (off_t)offset;
    hole.fp_length = (off_t)length;
    return fcntl(fd, F_PUNCHHOLE, &hole);
}

int cwormhole_rename_noreplace(int fromdir, const char *from, int todir, const char *to) {
    return renameatx_np(fromdir, from, todir, to, RENAME_EXCL);
}
#endif

#if !defined(__APPLE__) && !defined(__linux__)
int cwormhole_punch_hole(int fd, long long offset, long long length) {
    (void)fd;
    (void)offset;
    (void)length;
    errno = ENOTSUP;
    return -1;
}

int cwormhole_rename_noreplace(int fromdir, const char *from, int todir, const char *to) {
    (void)fromdir;
    (void)from;
    (void)todir;
    (void)to;
    errno = ENOSYS;
    return -1;
}
#endif

#if defined(__linux__)
#include <linux/falloc.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/syscall.h>

int cwormhole_punch_hole(int fd, long long offset, long long length) {
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
}

int cwormhole_rename_noreplace(int fromdir, const char *from, int todir, const char *to) {
#ifdef SYS_renameat2
    return (int)syscall(SYS_renameat2, fromdir, from, todir, to, 1 /* RENAME_NOREPLACE, linux/fs.h */);
#else
    (void)fromdir;
    (void)from;
    (void)todir;
    (void)to;
    errno = ENOSYS;
    return -1;
#endif
}

int cwormhole_epoll_pair(int first, int second) {
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    if (epoll < 0) return -1;
    int descriptors[2] = {first, second};
    for (int index = 0; index < 2; index++) {
        struct epoll_event event = {.events = EPOLLIN, .data.u32 = (uint32_t)index};
        if (epoll_ctl(epoll, EPOLL_CTL_ADD, descriptors[index], &event) != 0) {
            int saved = errno;
            close(epoll);
            errno = saved;
            return -1;
        }
    }
    return epoll;
}

int cwormhole_epoll_wait_pair(int epoll, int timeout, int *ready) {
    struct epoll_event events[2];
    int count = epoll_wait(epoll, events, 2, timeout);
    *ready = 0;
    for (int index = 0; index < count; index++) *ready |= 1 << events[index].data.u32;
    return count;
}

int cwormhole_peer_uid(int socket, unsigned int *uid) {
    struct ucred credentials;
    socklen_t length = sizeof(credentials);
    if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return -1;
    *uid = credentials.uid;
    return 0;
}

static int receive_packets(int socket, void *buffers, size_t size, unsigned int count, size_t *lengths, int flags) {
    if (count > 64) count = 64;
    struct mmsghdr messages[64];
    struct iovec parts[64];
    for (unsigned int index = 0; index < count; index++) {
        parts[index].iov_base = (char *)buffers + (size_t)index * size;
        parts[index].iov_len = size;
        memset(&messages[index], 0, sizeof messages[index]);
        messages[index].msg_hdr.msg_iov = &parts[index];
        messages[index].msg_hdr.msg_iovlen = 1;
    }
    int received;
    do received = recvmmsg(socket, messages, count, flags, NULL);
    while (received < 0 && errno == EINTR);
    // A packet cut to its slot is reported as longer than the slot, never as a shorter whole packet.
    for (int index = 0; index < received; index++) {
        lengths[index] = (messages[index].msg_hdr.msg_flags & MSG_TRUNC) ? size + 1 : messages[index].msg_len;
    }
    return received;
}

int cwormhole_receive_packets(int socket, void *buffers, size_t size, unsigned int count, size_t *lengths) {
    return receive_packets(socket, buffers, size, count, lengths, MSG_DONTWAIT);
}

int cwormhole_receive_packets_waiting(int socket, void *buffers, size_t size, unsigned int count, size_t *lengths) {
    return receive_packets(socket, buffers, size, count, lengths, MSG_WAITFORONE);
}
#endif
