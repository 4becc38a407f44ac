import CWormholeSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The address of a socket file in a directory.
///
/// On Linux it is reached through `/proc/self/fd/N/NAME`: the address stays under the 108 bytes a socket path may have,
/// however deep the directory is, and a directory renamed away is still the one meant.
///
/// Darwin has no `/proc`, and its public headers have no `bindat` or `connectat` (xnu's `bsd/sys/socket.h` declares
/// `connectx` and `disconnectx` only; FreeBSD's `bindat` is not XNU's): there the address is the directory's path and
/// the name, which must fit in the 104 bytes of its `sun_path` (xnu's `bsd/sys/un.h`), NUL included.
/// ``LiveSocketPlacement`` puts the sockets where they fit. Linux uses paths too when
/// ``LiveSocketPlacement/addressesArePaths`` (`WORMHOLE_SOCKET_PATHS=1`), held to Darwin's 104 bytes.
struct UnixSocketAddress {
    private var storage = sockaddr_un()

    /// Nil when the address does not fit in a `sockaddr_un` (a name of some 80 bytes or more), or, for a path, in
    /// Darwin's 104 bytes.
    init?(directory: DirectoryHandle, name: String) {
        storage.sun_family = sa_family_t(AF_UNIX)
        #if os(Linux) || os(Android)
        let path =
            LiveSocketPlacement.addressesArePaths
            ? Array("\(directory.path)/\(name)".utf8CString)
            : Array("/proc/self/fd/\(directory.rawDescriptor)/\(name)".utf8CString)
        #else
        let path = Array("\(directory.path)/\(name)".utf8CString)
        #endif
        if LiveSocketPlacement.addressesArePaths, path.count > LiveSocketPlacement.longestAddress + 1 { return nil }
        guard path.count <= MemoryLayout.size(ofValue: storage.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &storage.sun_path) { buffer in
            path.withUnsafeBytes { buffer.copyMemory(from: $0) }
        }
    }

    fileprivate func withSocketAddress<T>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
        withUnsafePointer(to: storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                body($0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
    }
}

/// A Unix socket whose packets keep their boundaries: `SOCK_SEQPACKET` (sequenced packets, on a connection whose end
/// the other side sees at once) or `SOCK_DGRAM` (datagrams, one socket receiving from every sender).
///
/// XNU's local domain has no `SOCK_SEQPACKET`: on Apple platforms a connection is a `SOCK_STREAM` socket whose packets
/// travel as frames (a 4-byte length, then the packet; ``connectionsAreFramed``), read only once whole, so that the
/// calls of a connection (``send(_:)``, ``receive(into:)-(PacketBatch)``, ``receive(into:blocking:)``) keep their
/// meaning. Datagram calls are never framed.
///
/// Like swift-system's `FileDescriptor`, the value does not own the socket: whoever made or accepted it calls
/// ``close()`` once. It is copyable so that connections can be kept in dictionaries and handed from thread to thread.
/// Every call that can block is retried when a signal interrupts it.
struct PacketSocket: Hashable, Sendable {
    let rawValue: Int32

    /// The two kinds of packet socket.
    enum Kind: Sendable {
        /// `SOCK_SEQPACKET`: a connection per sender, accepted by a listening socket.
        case sequencedPackets
        /// `SOCK_DGRAM`: a socket bound to a name receives from every sender; a sender's socket may be connected to it.
        case datagrams
    }

    /// Whether connections are stream sockets that carry their packets as frames: on Apple platforms, whose local
    /// domain has no `SOCK_SEQPACKET`; on Linux only when the environment sets `WORMHOLE_FRAMED_CONNECTIONS=1`, so
    /// that the tests run the framed path across processes here too. Every process of a directory must agree (a framed
    /// requester cannot connect to a sequenced-packet responder: it is refused, and the responder is not reachable).
    static let connectionsAreFramed: Bool = {
        #if canImport(Darwin)
        return true
        #else
        return ProcessInfo.processInfo.environment["WORMHOLE_FRAMED_CONNECTIONS"] == "1"
        #endif
    }()

    /// The send and receive buffers of a framed connection: room for a few of the largest frames, since a frame is
    /// read only once it is whole in the receiver's buffer.
    static let framedBufferSize = 4 * LiveSocket.receiveBufferSize

    /// Creates an unconnected socket, close-on-exec.
    static func make(_ kind: Kind = .sequencedPackets) -> Result<PacketSocket, Errno> {
        #if os(Linux) || os(Android)
        let connection = connectionsAreFramed ? Int32(SOCK_STREAM.rawValue) : Int32(SOCK_SEQPACKET.rawValue)
        let type = kind == .datagrams ? Int32(SOCK_DGRAM.rawValue) : connection
        return valueOrErrno { socket(AF_UNIX, type | Int32(SOCK_CLOEXEC.rawValue), 0) }
            .map { descriptor in
                let socket = PacketSocket(rawValue: descriptor)
                if kind == .sequencedPackets && connectionsAreFramed { socket.setFramedBuffers() }
                return socket
            }
        #else
        // No SOCK_SEQPACKET in XNU's local domain (bsd/kern/uipc_usrreq.c): a connection is a framed stream.
        return valueOrErrno { socket(AF_UNIX, kind == .datagrams ? SOCK_DGRAM : SOCK_STREAM, 0) }.map {
            descriptor in
            _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
            let socket = PacketSocket(rawValue: descriptor)
            socket.refuseSignalOnBrokenPipe()
            if kind == .datagrams {
                // Darwin refuses a datagram larger than its send buffer (2 KiB by default), and one that does not fit
                // in its receiver's buffer (4 KiB): room for the largest, and for a few on the receiving side.
                var size = Int32(LiveSocket.receiveBufferSize)
                _ = setsockopt(descriptor, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
                var room = Int32(4 * LiveSocket.receiveBufferSize)
                _ = setsockopt(descriptor, SOL_SOCKET, SO_RCVBUF, &room, socklen_t(MemoryLayout<Int32>.size))
            } else {
                socket.setFramedBuffers()
            }
            return socket
        }
        #endif
    }

    /// Gives a framed connection buffers that hold whole frames (``framedBufferSize``).
    private func setFramedBuffers() {
        var size = Int32(Self.framedBufferSize)
        _ = setsockopt(rawValue, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        _ = setsockopt(rawValue, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    }

    /// Where `send` has no `MSG_NOSIGNAL` (Darwin), a peer gone must fail a send with `EPIPE`, not kill the process
    /// with SIGPIPE: the socket is told so once.
    private func refuseSignalOnBrokenPipe() {
        #if canImport(Darwin)
        var on: Int32 = 1
        _ = setsockopt(rawValue, SOL_SOCKET, SO_NOSIGPIPE, &on, socklen_t(MemoryLayout<Int32>.size))
        #endif
    }

    /// Creates a socket and connects it to `address`; the socket is closed again when the connection fails
    /// (`connectionRefused`: a socket file whose process is gone).
    ///
    /// With a `sendTimeout`, the connection and every send on it wait at most that long (`SO_SNDTIMEO`), then fail
    /// with `EAGAIN`: a process that stopped reading (stopped in a debugger, frozen) fills its backlog and its buffer,
    /// and a request must not wait for it longer than its own time-out.
    static func connected(
        to address: UnixSocketAddress,
        kind: Kind = .sequencedPackets,
        sendTimeout: Duration? = nil
    ) -> Result<PacketSocket, Errno> {
        make(kind).flatMap { socket in
            if let sendTimeout { socket.setSendTimeout(sendTimeout) }
            let result = address.withSocketAddress { pointer, length in
                valueOrErrno { system_connect(socket.rawValue, pointer, length) }
            }
            switch result {
            case .success: return .success(socket)
            case .failure(let errno):
                socket.close()
                return .failure(errno)
            }
        }
    }

    /// Bounds the wait of a blocking connection or send (at least a millisecond, at most a day); on a framed
    /// connection, the wait of a blocking receive too, which reads a frame whole and must not wait for ever on a peer
    /// stopped in the middle of one.
    private func setSendTimeout(_ timeout: Duration) {
        let microseconds = Int64(max(1000, min(timeout.milliseconds * 1000, 86_400_000_000)))
        var limit = timeval(tv_sec: Int(microseconds / 1_000_000), tv_usec: .init(microseconds % 1_000_000))
        _ = setsockopt(rawValue, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        if Self.connectionsAreFramed {
            _ = setsockopt(rawValue, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        }
    }

    /// Binds the socket to `address`, creating the socket file (with the umask applied to its mode).
    func bind(to address: UnixSocketAddress) -> Result<Void, Errno> {
        address.withSocketAddress { pointer, length in
            valueOrErrno { system_bind(rawValue, pointer, length) }.map { _ in }
        }
    }

    /// Starts accepting connections, up to `backlog` waiting.
    func listen(backlog: Int32) -> Result<Void, Errno> {
        valueOrErrno { system_listen(rawValue, backlog) }.map { _ in }
    }

    /// Accepts a waiting connection (blocking until one comes), close-on-exec.
    func accept() -> Result<PacketSocket, Errno> {
        valueOrErrno { system_accept(rawValue) }.map { descriptor in
            // Glibc's module leaves accept4 out: the flag is set after.
            _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
            let connection = PacketSocket(rawValue: descriptor)
            connection.refuseSignalOnBrokenPipe()
            if Self.connectionsAreFramed { connection.setFramedBuffers() }
            return connection
        }
    }

    /// Sends one packet, whole: it travels whole or not at all (a short count, which `SOCK_SEQPACKET` does not give,
    /// is reported as `messageTooLong`). A peer gone fails it with `brokenPipe`, never with a signal.
    func send(_ bytes: [UInt8]) -> Result<Void, Errno> {
        if Self.connectionsAreFramed {
            return bytes.withUnsafeBytes { buffer in
                valueOrErrno { cwormhole_send_frame(rawValue, buffer.baseAddress, buffer.count, nil, 0, 1) }
                    .flatMap { sent in sent == buffer.count ? .success(()) : .failure(.messageTooLong) }
            }
        }
        return bytes.withUnsafeBytes { buffer in
            valueOrErrno { system_send(rawValue, buffer.baseAddress, buffer.count) }.flatMap { sent in
                sent == buffer.count ? .success(()) : .failure(.messageTooLong)
            }
        }
    }

    /// Sends `head` followed by `body` as one packet, whole, without copying them together first; otherwise as
    /// ``send(_:)``. Without `waiting`, a socket with no room fails at once with `resourceTemporarilyUnavailable`
    /// (and on Darwin a datagram socket whose peer's buffer is full fails with `noBufferSpace`, waiting or not).
    func send(head: UnsafeRawBufferPointer, body: UnsafeRawBufferPointer, waiting: Bool = true) -> Result<Void, Errno> {
        valueOrErrno {
            cwormhole_send_parts(rawValue, head.baseAddress, head.count, body.baseAddress, body.count, waiting ? 1 : 0)
        }
        .flatMap { sent in sent == head.count + body.count ? .success(()) : .failure(.messageTooLong) }
    }

    /// What ``receive(into:)-(PacketBatch)`` found: `count` packets at the start of the batch, then what follows them.
    struct ReceivedPackets: Equatable {
        enum Then: Equatable {
            /// Nothing more was waiting when they were read, or the connection failed after them: wait for the
            /// socket to be ready again (a failure makes it ready, and the next receive reports it).
            case drained
            /// The batch is full: more may be waiting.
            case full
            /// The peer closed the connection, it failed, or it sent a packet larger than a slot (which no sender
            /// of ours does).
            case closed
        }
        var count: Int
        var then: Then
    }

    /// Receives the packets waiting, up to the batch's capacity, without blocking: one `recvmmsg` on Linux, so that
    /// a single packet costs one call, not a second one that finds nothing; `recv` after `recv` elsewhere.
    func receive(into batch: borrowing PacketBatch) -> ReceivedPackets {
        if Self.connectionsAreFramed { return receiveFrames(into: batch) }
        #if os(Linux) || os(Android)
        let result = valueOrErrno {
            cwormhole_receive_packets(
                rawValue,
                batch.storage.baseAddress,
                batch.slotSize,
                UInt32(batch.capacity),
                batch.lengths
            )
        }
        switch result {
        case .failure(let errno):
            let drained = errno == .wouldBlock || errno == .resourceTemporarilyUnavailable
            return ReceivedPackets(count: 0, then: drained ? .drained : .closed)
        case .success(let received):
            let count = Int(received)
            // An ended connection reads as empty packets; a packet cut to its slot is not one to deliver.
            for index in 0..<count where batch.lengths[index] == 0 || batch.lengths[index] > batch.slotSize {
                return ReceivedPackets(count: index, then: .closed)
            }
            return ReceivedPackets(count: count, then: count < batch.capacity ? .drained : .full)
        }
        #else
        for index in 0..<batch.capacity {
            switch receive(into: batch.slot(index)) {
            case .packet(let count): batch.lengths[index] = count
            case .wouldBlock: return ReceivedPackets(count: index, then: .drained)
            case .closed: return ReceivedPackets(count: index, then: .closed)
            }
        }
        return ReceivedPackets(count: batch.capacity, then: .full)
        #endif
    }

    /// ``receive(into:)-(PacketBatch)`` on a framed connection: the frames waiting whole, each into its slot.
    private func receiveFrames(into batch: borrowing PacketBatch) -> ReceivedPackets {
        for index in 0..<batch.capacity {
            let slot = batch.slot(index)
            switch valueOrErrno({ cwormhole_receive_frame(rawValue, slot.baseAddress, slot.count, 0) }) {
            case .success(0): return ReceivedPackets(count: index, then: .closed)
            case .success(let count): batch.lengths[index] = count
            case .failure(let errno) where errno == .wouldBlock || errno == .resourceTemporarilyUnavailable:
                return ReceivedPackets(count: index, then: .drained)
            case .failure:
                return ReceivedPackets(count: index, then: .closed)
            }
        }
        return ReceivedPackets(count: batch.capacity, then: .full)
    }

    /// Waits for a packet, then receives it and those already waiting, up to the batch's capacity: one `recvmmsg` on
    /// Linux. Returns how many were received; the batch's ``PacketBatch/wholePacket(at:)`` gives each, nil for an
    /// empty one or one cut to its slot. Used on a datagram socket, which has no connection to end: a failure means
    /// the system is out of memory.
    func receiveWaiting(into batch: borrowing PacketBatch) -> Result<Int, Errno> {
        #if os(Linux) || os(Android)
        return valueOrErrno {
            cwormhole_receive_packets_waiting(
                rawValue,
                batch.storage.baseAddress,
                batch.slotSize,
                UInt32(batch.capacity),
                batch.lengths
            )
        }.map { Int($0) }
        #else
        // The first waited for, the rest taken only if already there.
        for index in 0..<batch.capacity {
            let flags = index == 0 ? 0 : Int32(MSG_DONTWAIT)
            let slot = batch.slot(index)
            var message = msghdr()
            var part = iovec(iov_base: slot.baseAddress, iov_len: slot.count)
            let result = withUnsafeMutablePointer(to: &part) { part in
                message.msg_iov = part
                message.msg_iovlen = 1
                return valueOrErrno { recvmsg(rawValue, &message, flags) }
            }
            switch result {
            case .success(let count):
                batch.lengths[index] = message.msg_flags & Int32(MSG_TRUNC) != 0 ? slot.count + 1 : count
            case .failure(let errno):
                return index == 0 ? .failure(errno) : .success(index)
            }
        }
        return .success(batch.capacity)
        #endif
    }

    /// What ``receive(into:blocking:)`` found.
    enum Received: Equatable {
        /// A packet of `count` bytes, at the start of the buffer, shorter than the buffer.
        case packet(count: Int)
        /// Nothing waiting (only without blocking).
        case wouldBlock
        /// The peer closed the connection, it failed, or it sent a packet that filled the buffer (which `recv` may have
        /// cut: no sender of ours sends one that large).
        case closed
    }

    /// Receives one packet into `buffer`; without `blocking`, returns ``Received/wouldBlock`` at once when none waits.
    func receive(into buffer: UnsafeMutableRawBufferPointer, blocking: Bool = false) -> Received {
        if Self.connectionsAreFramed {
            switch valueOrErrno({
                cwormhole_receive_frame(rawValue, buffer.baseAddress, buffer.count, blocking ? 1 : 0)
            })
            {
            case .success(0): return .closed
            // A frame that fills the buffer is refused as a sequenced packet that fills it is (it may have been cut).
            case .success(let count) where count >= buffer.count: return .closed
            case .success(let count): return .packet(count: count)
            case .failure(let errno):
                let waiting = !blocking && (errno == .wouldBlock || errno == .resourceTemporarilyUnavailable)
                return waiting ? .wouldBlock : .closed
            }
        }
        let flags = blocking ? 0 : Int32(MSG_DONTWAIT)
        switch valueOrErrno({ recv(rawValue, buffer.baseAddress, buffer.count, flags) }) {
        case .success(0): return .closed
        // `recv` says nothing of a packet cut to the buffer: one that fills it is taken for one.
        case .success(let count) where count >= buffer.count: return .closed
        case .success(let count): return .packet(count: count)
        case .failure(let errno):
            return errno == .wouldBlock || errno == .resourceTemporarilyUnavailable ? .wouldBlock : .closed
        }
    }

    /// The user id of the process at the other end of the connection (`SO_PEERCRED`, `getpeereid` on Darwin).
    func peerUserID() -> Result<UInt32, Errno> {
        #if os(Linux) || os(Android)
        var uid: UInt32 = 0
        return valueOrErrno { cwormhole_peer_uid(rawValue, &uid) }.map { _ in uid }
        #else
        var uid: uid_t = 0
        var gid: gid_t = 0
        return valueOrErrno { getpeereid(rawValue, &uid, &gid) }.map { _ in UInt32(uid) }
        #endif
    }

    /// Closes the socket. Call it once; the value must not be used after.
    func close() {
        system_close(rawValue)
    }
}

/// Room for a number of packets, each whole (a longer one is refused, not cut), that
/// ``PacketSocket/receive(into:)-(PacketBatch)`` fills with one call. Made once per serving thread and reused: only the
/// pages that packets touch are ever backed by memory.
struct PacketBatch: ~Copyable {
    /// The number of packets one call can receive.
    let capacity: Int
    /// The bytes each packet has room for.
    let slotSize: Int
    fileprivate let storage: UnsafeMutableRawBufferPointer
    fileprivate let lengths: UnsafeMutablePointer<Int>

    init(capacity: Int, slotSize: Int) {
        precondition(capacity > 0 && capacity <= 64)
        self.capacity = capacity
        self.slotSize = slotSize
        storage = .allocate(byteCount: capacity * slotSize, alignment: 16)
        lengths = .allocate(capacity: capacity)
        lengths.initialize(repeating: 0, count: capacity)
    }

    deinit {
        storage.deallocate()
        lengths.deallocate()
    }

    /// The packet received at `index`, valid until the next receive into the batch.
    func packet(at index: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(rebasing: storage[index * slotSize..<index * slotSize + lengths[index]])
    }

    /// The packet received at `index` if it is whole and not empty, valid until the next receive into the batch.
    func wholePacket(at index: Int) -> UnsafeRawBufferPointer? {
        let length = lengths[index]
        guard length > 0, length <= slotSize else { return nil }
        return UnsafeRawBufferPointer(rebasing: storage[index * slotSize..<index * slotSize + length])
    }

    fileprivate func slot(_ index: Int) -> UnsafeMutableRawBufferPointer {
        UnsafeMutableRawBufferPointer(rebasing: storage[index * slotSize..<(index + 1) * slotSize])
    }
}

// The C calls under names of their own: inside `PacketSocket` its methods of the same names would hide them.

@inline(__always)
private func system_connect(_ socket: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 {
    connect(socket, address, length)
}

@inline(__always)
private func system_bind(_ socket: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 {
    bind(socket, address, length)
}

@inline(__always)
private func system_listen(_ socket: Int32, _ backlog: Int32) -> Int32 {
    listen(socket, backlog)
}

@inline(__always)
private func system_accept(_ socket: Int32) -> Int32 {
    accept(socket, nil, nil)
}

@inline(__always)
private func system_send(_ socket: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int {
    #if os(Linux) || os(Android)
    return send(socket, buffer, count, Int32(MSG_NOSIGNAL))
    #else
    return send(socket, buffer, count, 0)
    #endif
}

@inline(__always)
private func system_close(_ descriptor: Int32) {
    _ = close(descriptor)
}
