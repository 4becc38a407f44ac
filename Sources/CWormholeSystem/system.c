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

#if defined(__linux__)
#include <fcntl.h>
#include <linux/falloc.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <errno.h>

int cwormhole_punch_hole(int fd, long long offset, long long length) {
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
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
