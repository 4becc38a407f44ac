// The comparison cases of `Benchmarks/compare` that are not the wormhole: the hand-written floors, ZeroMQ and
// Redis, each written in C against the library's own C API so that no language runtime is measured instead of the
// transport.
//
//   peers CASE METRIC --size BYTES --count N --warm-up N --dir DIR --cpu A --peer-cpu B [--redis-port P]
//
// CASE is pipe, unix, rename, in-place, zmq-pair, zmq-pushpull, redis-pubsub or redis-stream; METRIC is latency
// (ping-pong, one-way = half the round trip) or throughput (one producer, one consumer, first to last message
// received). The process forks its peer, pins each side to its CPU, and prints one JSON line with the figures, the
// same line `wormhole bench-case` prints for the wormhole's cases.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

// MARK: Options and helpers

static const char *case_name, *metric, *dir = "/tmp";
static long size = 64, count = 10000, warm_up = 1000;
static int cpu = 0, peer_cpu = 0, redis_port = 6379;

static void die(const char *what) {
    fprintf(stderr, "peers: %s: %s\n", what, errno ? strerror(errno) : "failed");
    exit(1);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void pin(int which) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(which, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
}

static void write_all(int fd, const void *bytes, size_t length) {
    const char *p = bytes;
    while (length > 0) {
        ssize_t n = write(fd, p, length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("write");
        p += n;
        length -= (size_t)n;
    }
}

static void read_all(int fd, void *bytes, size_t length) {
    char *p = bytes;
    while (length > 0) {
        ssize_t n = read(fd, p, length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("read");
        p += n;
        length -= (size_t)n;
    }
}

static char *message(uint64_t sequence) {
    static char *buffer;
    if (!buffer) {
        buffer = malloc((size_t)size);
        memset(buffer, 'x', (size_t)size);
    }
    memcpy(buffer, &sequence, sizeof sequence);
    return buffer;
}

static uint64_t sequence_of(const void *bytes) {
    uint64_t sequence;
    memcpy(&sequence, bytes, sizeof sequence);
    return sequence;
}

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void report_latency(uint64_t *samples, long n) {
    qsort(samples, (size_t)n, sizeof *samples, compare_u64);
#define AT(p) ((double)samples[(long)((double)(n - 1) * (p))] / 1000.0)
    printf("{\"case\":\"%s\",\"metric\":\"latency\",\"size\":%ld,\"count\":%ld,\"p50_us\":%.3f,\"p99_us\":%.3f,"
           "\"percentiles_us\":[",
           case_name, size, n, AT(0.50), AT(0.99));
    for (int p = 0; p <= 100; p++) printf("%s%.3f", p ? "," : "", AT(p / 100.0));
    printf("]}\n");
#undef AT
}

static void report_throughput(long received, uint64_t first, uint64_t last) {
    double rate = (double)(received - 1) / ((double)(last - first) / 1e9);
    printf("{\"case\":\"%s\",\"metric\":\"throughput\",\"size\":%ld,\"count\":%ld,\"received\":%ld,"
           "\"messages_per_second\":%.1f}\n",
           case_name, size, count, received, rate);
}

// MARK: The two processes
//
// Each case has a `measure` side (this process) and a `peer` side (the forked child). The peer says "ready" over a
// pipe once it can receive, and waits for "go" before producing, so that the consumer is ready first.

static int ready_pipe[2], go_pipe[2];
static void signal_ready(void) { write_all(ready_pipe[1], "r", 1); }
static void wait_ready(void) { char c; read_all(ready_pipe[0], &c, 1); }
static void signal_go(void) { write_all(go_pipe[1], "g", 1); }
static void wait_go(void) { char c; read_all(go_pipe[0], &c, 1); }

typedef struct {
    void (*setup)(int is_peer);
    void (*send)(int is_peer, uint64_t sequence);
    uint64_t (*receive)(int is_peer);               // latency: one message
    long (*receive_some)(void);                     // throughput: messages received by one call
    void (*produce)(void);                          // throughput: the peer sends `count` messages
} Transport;

static void run_latency(const Transport *t) {
    long total = warm_up + count;
    uint64_t *samples = malloc(sizeof(uint64_t) * (size_t)count);
    for (long i = 0; i < total; i++) {
        uint64_t start = now_ns();
        t->send(0, (uint64_t)i);
        uint64_t answer = t->receive(0);
        uint64_t elapsed = now_ns() - start;
        if (answer != (uint64_t)i) {
            fprintf(stderr, "peers: %s answered %llu to %ld\n", case_name, (unsigned long long)answer, i);
            exit(1);
        }
        if (i >= warm_up) samples[i - warm_up] = elapsed / 2;
    }
    report_latency(samples, count);
}

static void peer_latency(const Transport *t) {
    signal_ready();
    for (;;) t->send(1, t->receive(1));
}

static volatile long progress;  // messages received so far, for the report of a run that stalls

static void stalled(int signal) {
    (void)signal;
    char text[128];
    int length = snprintf(text, sizeof text, "peers: %s %s stalled after %ld of %ld messages\n", case_name, metric,
                          (long)progress, count);
    write(2, text, (size_t)length);
    _exit(3);
}

static void run_throughput(const Transport *t) {
    signal_go();
    long received = 0;
    uint64_t first = 0, last = 0;
    while (received < count) {
        long got = t->receive_some();
        uint64_t now = now_ns();
        if (got > 0 && received == 0) first = now;
        received += got;
        progress = received;
        last = now;
    }
    report_throughput(received, first, last);
}

// MARK: A pipe and a Unix socket: bytes, no file

static int to_peer[2], from_peer[2];
static char *stream_buffer;

static void stream_setup_pipe(int is_peer) {
    (void)is_peer;
}

static void stream_send(int is_peer, uint64_t sequence) {
    write_all(is_peer ? from_peer[1] : to_peer[1], message(sequence), (size_t)size);
}

static uint64_t stream_receive(int is_peer) {
    if (!stream_buffer) stream_buffer = malloc((size_t)size);
    read_all(is_peer ? to_peer[0] : from_peer[0], stream_buffer, (size_t)size);
    return sequence_of(stream_buffer);
}

static long stream_leftover;
static long stream_receive_some(void) {
    static char chunk[256 * 1024];
    ssize_t n = read(from_peer[0], chunk, sizeof chunk);
    if (n <= 0) die("read");
    stream_leftover += n;
    long whole = stream_leftover / size;
    stream_leftover -= whole * size;
    return whole;
}

static void stream_produce(void) {
    for (long i = 0; i < count; i++) stream_send(1, (uint64_t)i);
}

static void make_pipes(void) {
    if (pipe(to_peer) || pipe(from_peer)) die("pipe");
}

static void make_socket_pairs(void) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, to_peer) || socketpair(AF_UNIX, SOCK_STREAM, 0, from_peer))
        die("socketpair");
    // Each pair is used one way: [1] writes, [0] reads.
}

// MARK: Files with inotify: rename over the file, or write it in place

static int inotify_fd;
static char ping_path[PATH_MAX], pong_path[PATH_MAX], tmp_path[2][PATH_MAX];
static int file_fd[2];  // in-place: [0] ping, [1] pong
static int renaming;

static void file_setup(int is_peer) {
    inotify_fd = inotify_init1(IN_CLOEXEC);
    if (inotify_fd < 0) die("inotify_init1");
    const char *watched = is_peer ? ping_path : pong_path;
    if (renaming) {
        if (inotify_add_watch(inotify_fd, dir, IN_MOVED_TO) < 0) die("inotify_add_watch");
    } else {
        file_fd[0] = open(ping_path, O_RDWR | O_CLOEXEC);
        file_fd[1] = open(pong_path, O_RDWR | O_CLOEXEC);
        if (file_fd[0] < 0 || file_fd[1] < 0) die("open");
        if (inotify_add_watch(inotify_fd, watched, IN_MODIFY) < 0) die("inotify_add_watch");
    }
}

static void file_send(int is_peer, uint64_t sequence) {
    if (renaming) {
        const char *tmp = tmp_path[is_peer], *target = is_peer ? pong_path : ping_path;
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) die("open");
        write_all(fd, message(sequence), (size_t)size);
        close(fd);
        if (rename(tmp, target) != 0) die("rename");
    } else {
        if (pwrite(file_fd[is_peer], message(sequence), (size_t)size, 0) != size) die("pwrite");
    }
}

static uint64_t file_receive(int is_peer) {
    static char events[4096];
    static char *buffer;
    if (!buffer) buffer = malloc((size_t)size);
    const char *name = is_peer ? "ping" : "pong";
    for (;;) {
        ssize_t n = read(inotify_fd, events, sizeof events);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("read inotify");
        int ours = !renaming;
        for (char *p = events; p < events + n;) {
            struct inotify_event *event = (struct inotify_event *)p;
            if (renaming && event->len && strcmp(event->name, name) == 0) ours = 1;
            p += sizeof *event + event->len;
        }
        if (!ours) continue;
        if (renaming) {
            int fd = open(is_peer ? ping_path : pong_path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) die("open");
            ssize_t got = pread(fd, buffer, (size_t)size, 0);
            close(fd);
            if (got != size) continue;
        } else {
            if (pread(file_fd[is_peer ? 0 : 1], buffer, (size_t)size, 0) != size) continue;
        }
        return sequence_of(buffer);
    }
}

static void file_prepare(void) {
    snprintf(ping_path, sizeof ping_path, "%s/ping", dir);
    snprintf(pong_path, sizeof pong_path, "%s/pong", dir);
    snprintf(tmp_path[0], sizeof tmp_path[0], "%s/.ping.tmp", dir);
    snprintf(tmp_path[1], sizeof tmp_path[1], "%s/.pong.tmp", dir);
    for (int i = 0; i < 2; i++) {
        int fd = open(i ? pong_path : ping_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) die("create");
        write_all(fd, message(UINT64_MAX), (size_t)size);
        close(fd);
    }
}

// MARK: ZeroMQ over ipc

static void *zmq_context, *zmq_in, *zmq_out;
static int zmq_pair;
static char zmq_endpoint[2][PATH_MAX + 16];
static zmq_msg_t zmq_message;

static void zmq_setup(int is_peer) {
    zmq_context = zmq_ctx_new();
    if (zmq_pair) {
        zmq_in = zmq_out = zmq_socket(zmq_context, ZMQ_PAIR);
        if ((is_peer ? zmq_connect : zmq_bind)(zmq_in, zmq_endpoint[0]) != 0) die("zmq PAIR");
    } else {
        // PUSH/PULL: the measuring side binds a PULL for what comes back and a PUSH for what goes out.
        zmq_in = zmq_socket(zmq_context, ZMQ_PULL);
        zmq_out = zmq_socket(zmq_context, ZMQ_PUSH);
        if (is_peer) {
            if (zmq_connect(zmq_in, zmq_endpoint[0]) || zmq_connect(zmq_out, zmq_endpoint[1])) die("zmq connect");
        } else {
            if (zmq_bind(zmq_out, zmq_endpoint[0]) || zmq_bind(zmq_in, zmq_endpoint[1])) die("zmq bind");
        }
    }
    zmq_msg_init(&zmq_message);
}

static void zmq_send_one(int is_peer, uint64_t sequence) {
    (void)is_peer;
    if (zmq_send(zmq_out, message(sequence), (size_t)size, 0) != size) die("zmq_send");
}

static uint64_t zmq_receive_one(int is_peer) {
    (void)is_peer;
    if (zmq_msg_recv(&zmq_message, zmq_in, 0) < 0) die("zmq_msg_recv");
    return sequence_of(zmq_msg_data(&zmq_message));
}

static long zmq_receive_some(void) {
    zmq_receive_one(0);
    return 1;
}

static void zmq_produce(void) {
    for (long i = 0; i < count; i++) zmq_send_one(1, (uint64_t)i);
}

// MARK: Redis over TCP on 127.0.0.1: pub/sub (nothing kept) and streams (kept, in the AOF)

static redisContext *redis_command, *redis_subscriber;
static int redis_streams;
static char redis_last_id[64] = "0";
static const long redis_window = 64;  // commands a producer pipelines before reading their replies

static redisContext *redis_connect(void) {
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    if (!c || c->err) {
        fprintf(stderr, "peers: redis on 127.0.0.1:%d: %s\n", redis_port, c ? c->errstr : "no memory");
        exit(1);
    }
    return c;
}

static void redis_check(redisReply *reply, const char *what) {
    if (!reply || reply->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "peers: redis %s: %s\n", what, reply ? reply->str : redis_command->errstr);
        exit(1);
    }
}

static void redis_setup(int is_peer) {
    redis_command = redis_connect();
    if (!redis_streams) {
        redis_subscriber = redis_connect();
        redisReply *reply = redisCommand(redis_subscriber, "SUBSCRIBE %s", is_peer ? "ping" : "pong");
        redis_check(reply, "SUBSCRIBE");
        freeReplyObject(reply);
    } else if (!is_peer) {
        redisReply *reply = redisCommand(redis_command, "DEL ping pong throughput");
        redis_check(reply, "DEL");
        freeReplyObject(reply);
    }
}

static void redis_send(int is_peer, uint64_t sequence) {
    const char *target = is_peer ? "pong" : "ping";
    redisReply *reply = redis_streams
        ? redisCommand(redis_command, "XADD %s * m %b", target, message(sequence), (size_t)size)
        : redisCommand(redis_command, "PUBLISH %s %b", target, message(sequence), (size_t)size);
    redis_check(reply, "send");
    freeReplyObject(reply);
}

// Reads entries of a stream after the last id seen; calls `each` with each entry's payload; returns how many.
static long redis_read_stream(const char *stream, long at_most, uint64_t *last_sequence) {
    redisReply *reply =
        redisCommand(redis_command, "XREAD COUNT %ld BLOCK 0 STREAMS %s %s", at_most, stream, redis_last_id);
    redis_check(reply, "XREAD");
    long got = 0;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements > 0) {
        redisReply *entries = reply->element[0]->element[1];
        for (size_t i = 0; i < entries->elements; i++) {
            redisReply *entry = entries->element[i];
            snprintf(redis_last_id, sizeof redis_last_id, "%s", entry->element[0]->str);
            redisReply *fields = entry->element[1];
            if (last_sequence && fields->elements >= 2) *last_sequence = sequence_of(fields->element[1]->str);
            got++;
        }
    }
    freeReplyObject(reply);
    return got;
}

static uint64_t redis_receive(int is_peer) {
    if (redis_streams) {
        uint64_t sequence = UINT64_MAX;
        while (redis_read_stream(is_peer ? "ping" : "pong", 1, &sequence) == 0) {
        }
        return sequence;
    }
    redisReply *reply;
    if (redisGetReply(redis_subscriber, (void **)&reply) != REDIS_OK) die("redis subscriber");
    uint64_t sequence = sequence_of(reply->element[2]->str);
    freeReplyObject(reply);
    return sequence;
}

static long redis_receive_some(void) {
    if (redis_streams) return redis_read_stream("throughput", 1000, NULL);
    redisReply *reply;
    if (redisGetReply(redis_subscriber, (void **)&reply) != REDIS_OK) die("redis subscriber");
    freeReplyObject(reply);
    return 1;
}

static void redis_produce(void) {
    for (long i = 0; i < count; i += redis_window) {
        long batch = count - i < redis_window ? count - i : redis_window;
        for (long j = 0; j < batch; j++) {
            if (redis_streams)
                redisAppendCommand(redis_command, "XADD throughput * m %b", message((uint64_t)(i + j)), (size_t)size);
            else
                redisAppendCommand(redis_command, "PUBLISH pong %b", message((uint64_t)(i + j)), (size_t)size);
        }
        for (long j = 0; j < batch; j++) {
            redisReply *reply;
            if (redisGetReply(redis_command, (void **)&reply) != REDIS_OK) die("redis producer");
            redis_check(reply, "produce");
            freeReplyObject(reply);
        }
    }
}

// MARK: Main

static void parse(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: peers CASE latency|throughput [--size N] [--count N] [--warm-up N] [--dir D] "
                        "[--cpu A] [--peer-cpu B] [--redis-port P]\n");
        exit(2);
    }
    case_name = argv[1];
    metric = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
        const char *name = argv[i], *value = argv[i + 1];
        if (!strcmp(name, "--size")) size = atol(value);
        else if (!strcmp(name, "--count")) count = atol(value);
        else if (!strcmp(name, "--warm-up")) warm_up = atol(value);
        else if (!strcmp(name, "--dir")) dir = value;
        else if (!strcmp(name, "--cpu")) cpu = atoi(value);
        else if (!strcmp(name, "--peer-cpu")) peer_cpu = atoi(value);
        else if (!strcmp(name, "--redis-port")) redis_port = atoi(value);
        else {
            fprintf(stderr, "peers: unknown option %s\n", name);
            exit(2);
        }
    }
    if (size < (long)sizeof(uint64_t)) size = sizeof(uint64_t);
}

int main(int argc, char **argv) {
    parse(argc, argv);
    int latency = !strcmp(metric, "latency");
    if (!latency && strcmp(metric, "throughput")) {
        fprintf(stderr, "peers: the metric is latency or throughput, not %s\n", metric);
        return 2;
    }
    Transport t = {0};
    if (!strcmp(case_name, "pipe") || !strcmp(case_name, "unix")) {
        if (!strcmp(case_name, "pipe")) make_pipes(); else make_socket_pairs();
        t = (Transport){stream_setup_pipe, stream_send, stream_receive, stream_receive_some, stream_produce};
    } else if (!strcmp(case_name, "rename") || !strcmp(case_name, "in-place")) {
        if (!latency) {
            fprintf(stderr, "peers: %s keeps only the latest message; it has no throughput case\n", case_name);
            return 2;
        }
        renaming = !strcmp(case_name, "rename");
        file_prepare();
        t = (Transport){file_setup, file_send, file_receive, NULL, NULL};
    } else if (!strcmp(case_name, "zmq-pair") || !strcmp(case_name, "zmq-pushpull")) {
        zmq_pair = !strcmp(case_name, "zmq-pair");
        snprintf(zmq_endpoint[0], sizeof zmq_endpoint[0], "ipc://%s/zmq-0", dir);
        snprintf(zmq_endpoint[1], sizeof zmq_endpoint[1], "ipc://%s/zmq-1", dir);
        t = (Transport){zmq_setup, zmq_send_one, zmq_receive_one, zmq_receive_some, zmq_produce};
    } else if (!strcmp(case_name, "redis-pubsub") || !strcmp(case_name, "redis-stream")) {
        redis_streams = !strcmp(case_name, "redis-stream");
        t = (Transport){redis_setup, redis_send, redis_receive, redis_receive_some, redis_produce};
    } else {
        fprintf(stderr, "peers: unknown case %s\n", case_name);
        return 2;
    }

    if (pipe(ready_pipe) || pipe(go_pipe)) die("pipe");
    // Set up before forking what both sides share; the measuring side binds first where there is a server side.
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        pin(peer_cpu);
        if (!strcmp(case_name, "zmq-pair") || !strcmp(case_name, "zmq-pushpull")) wait_go();  // after the bind
        t.setup(1);
        if (latency) peer_latency(&t);
        signal_ready();
        if (strcmp(case_name, "zmq-pair") && strcmp(case_name, "zmq-pushpull")) wait_go();
        t.produce();
        // Stay until the measuring side has everything and kills this process: exiting at once could drop what
        // is still queued (ZeroMQ's I/O thread sends after zmq_send returns).
        for (;;) pause();
    }
    pin(cpu);
    signal(SIGALRM, stalled);
    alarm(300);  // nothing here may hang a comparison run
    t.setup(0);
    if (!strcmp(case_name, "zmq-pair") || !strcmp(case_name, "zmq-pushpull")) signal_go();
    wait_ready();
    if (latency) run_latency(&t);
    else run_throughput(&t);
    fflush(stdout);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return 0;
}
