#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import Synchronization

/// A listening socket for one identifier, and the thread that serves its connections.
///
/// The thread waits in `poll(2)` on the listening socket, on a pipe that wakes it to stop, and on every connection it
/// accepted. A sender keeps its connection for the messages that follow (``DirectoryLiveTransport`` caches it), so a
/// message costs one `send` and one wake-up, not a connection. Packets are read without blocking, so a slow or silent
/// peer holds up nobody; each message is handed to `handle` on the endpoint's thread, with no connection. A request
/// hands its connection over to `handle`, which replies on it and closes it. Connections from
/// another user are refused (`SO_PEERCRED`) unless the directory is shared.
final class LiveEndpoint: Sendable {
    private let directory: DirectoryHandle
    private let name: String
    private let listening: Int32
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let stopped = Atomic<Bool>(false)

    /// - Parameters:
    ///   - prefix: The socket file's name prefix (``LiveSocket/prefix(for:)`` for a listener,
    ///     ``LiveSocket/responderPrefix(for:)`` for a responder).
    ///   - handle: Called on the endpoint's thread with each packet; `connection` is nil for a message (the endpoint
    ///     keeps the connection), and for a request the connection to reply on, which `handle` must close.
    init(
        directory: DirectoryHandle,
        name prefix: String,
        identifier: String,
        handle: @escaping @Sendable (LivePacket, _ connection: Int32?) -> Void
    ) throws(WormholeError) {
        self.directory = directory
        name = prefix + "\(ProcessFacts.processID).\(UInt32.random(in: 0...UInt32.max))"
        let socket = LiveSocket.makeSocket()
        guard socket >= 0 else { throw WormholeError.fileSystem(currentErrno, "create a socket", identifier: identifier, path: nil) }
        guard let address = LiveSocket.address(directoryDescriptor: directory.rawDescriptor, name: name) else {
            _ = close(socket)
            throw WormholeError(.ioFailure, "The socket address is too long.", identifier: identifier)
        }
        let bound = LiveSocket.withAddress(address) { bind(socket, $0, $1) }
        guard bound == 0, fchmodat(directory.rawDescriptor, name, directory.filePermissions, 0) == 0,
            listen(socket, 128) == 0
        else {
            let errno = currentErrno
            _ = close(socket)
            _ = unlinkat(directory.rawDescriptor, name, 0)
            throw WormholeError.fileSystem(errno, "listen on a socket", identifier: identifier, path: directory.filePath(name))
        }
        if let group = directory.group { _ = fchownat(directory.rawDescriptor, name, uid_t.max, group, 0) }
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else {
            _ = close(socket)
            _ = unlinkat(directory.rawDescriptor, name, 0)
            throw WormholeError.fileSystem(currentErrno, "create a pipe", identifier: identifier, path: nil)
        }
        listening = socket
        wakeRead = pipeEnds[0]
        wakeWrite = pipeEnds[1]
        let trustsOthers = directory.trustsOtherOwners
        Thread { [self] in
            nameCurrentThread("wh-live")
            serve(trustsOthers: trustsOthers, handle: handle)
        }.start()
    }

    /// Stops accepting, closes the connections and removes the socket file. Idempotent.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = unlinkat(directory.rawDescriptor, name, 0)
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    deinit { stop() }

    private func serve(
        trustsOthers: Bool,
        handle: @escaping @Sendable (LivePacket, Int32?) -> Void
    ) {
        var connections: [Int32] = []
        // One buffer for every packet: a packet is copied out of it before the next is read.
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: LiveSocket.maximumMessageSize + 4096, alignment: 8)
        defer {
            buffer.deallocate()
            // Senders see their cached connection closed and drop it.
            for connection in connections { _ = close(connection) }
            _ = close(listening)
            _ = close(wakeRead)
            _ = close(wakeWrite)
        }
        while !stopped.load(ordering: .acquiring) {
            var descriptors = [
                pollfd(fd: listening, events: Int16(POLLIN), revents: 0),
                pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0),
            ] + connections.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            let ready = poll(&descriptors, nfds_t(descriptors.count), -1)
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            if descriptors[1].revents != 0 { return }
            var kept: [Int32] = []
            for entry in descriptors.dropFirst(2) {
                guard entry.revents != 0 else {
                    kept.append(entry.fd)
                    continue
                }
                switch drain(entry.fd, into: buffer, handle: handle) {
                case .open: kept.append(entry.fd)
                case .closed: _ = close(entry.fd)
                case .handedOver: break
                }
            }
            connections = kept
            if descriptors[0].revents != 0, let connection = accept(trustsOthers: trustsOthers) {
                connections.append(connection)
            }
        }
    }

    private func accept(trustsOthers: Bool) -> Int32? {
        let connection = Glibc_accept(listening)
        guard connection >= 0 else { return nil }
        _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
        // Another user's process is refused, as a private wormhole's files are.
        if !trustsOthers, LiveSocket.peerUserID(connection) != ProcessFacts.effectiveUserID {
            _ = close(connection)
            return nil
        }
        return connection
    }

    private enum ConnectionState { case open, closed, handedOver }

    /// Reads every packet waiting on a connection, without blocking, and hands each over.
    private func drain(
        _ connection: Int32, into buffer: UnsafeMutableRawBufferPointer,
        handle: @escaping @Sendable (LivePacket, Int32?) -> Void
    ) -> ConnectionState {
        while true {
            let count = recv(connection, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT))
            if count < 0 { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? .open : .closed }
            if count == 0 { return .closed }  // the sender closed it
            guard let packet = LivePacket(Array(UnsafeRawBufferPointer(rebasing: buffer[..<count]))) else { return .closed }
            if packet.kind == .request {
                // The reply goes back on this connection: the handler owns it from here.
                handle(packet, connection)
                return .handedOver
            }
            handle(packet, nil)
        }
    }
}

@inline(__always)
private func Glibc_accept(_ socket: Int32) -> Int32 {
    accept(socket, nil, nil)
}
