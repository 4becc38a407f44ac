#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import Synchronization

/// A listening socket for one identifier, and the thread that accepts its connections.
///
/// The thread waits in `poll(2)` on the socket and on a pipe that wakes it to stop; each accepted connection's packet
/// is handed to `handle` on the endpoint's scheduler. Connections from another user are refused (`SO_PEERCRED`).
final class LiveEndpoint: Sendable {
    private let directory: DirectoryHandle
    private let name: String
    private let listening: Int32
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let stopped = Atomic<Bool>(false)

    init(
        directory: DirectoryHandle,
        identifier: String,
        schedule: @escaping @Sendable (@escaping @Sendable () -> Void) -> Void,
        handle: @escaping @Sendable (LivePacket, _ connection: Int32) -> Void
    ) throws(WormholeError) {
        self.directory = directory
        name = LiveSocket.prefix(for: identifier) + "\(ProcessFacts.processID).\(UInt32.random(in: 0...UInt32.max))"
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
            acceptLoop(trustsOthers: trustsOthers, schedule: schedule, handle: handle)
        }.start()
    }

    /// Stops accepting and removes the socket file. Idempotent.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = unlinkat(directory.rawDescriptor, name, 0)
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    deinit { stop() }

    private func acceptLoop(
        trustsOthers: Bool,
        schedule: @escaping @Sendable (@escaping @Sendable () -> Void) -> Void,
        handle: @escaping @Sendable (LivePacket, Int32) -> Void
    ) {
        defer {
            _ = close(listening)
            _ = close(wakeRead)
            _ = close(wakeWrite)
        }
        var descriptors = [
            pollfd(fd: listening, events: Int16(POLLIN), revents: 0),
            pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0),
        ]
        while !stopped.load(ordering: .acquiring) {
            let ready = poll(&descriptors, 2, -1)
            if ready < 0 {
                if errno == EINTR { continue }
                return
            }
            if descriptors[1].revents != 0 { return }
            guard descriptors[0].revents != 0 else { continue }
            let connection = accept(listening, nil, nil)
            guard connection >= 0 else { continue }
            _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
            // Another user's process is refused, as a private wormhole's files are.
            if !trustsOthers, LiveSocket.peerUserID(connection) != ProcessFacts.effectiveUserID {
                _ = close(connection)
                continue
            }
            // The packet is read on the handler's side, so that one slow peer does not hold up the others.
            schedule {
                guard LiveSocket.waitReadable(connection, milliseconds: 5000), let bytes = LiveSocket.receive(connection),
                    let packet = LivePacket(bytes)
                else {
                    _ = close(connection)
                    return
                }
                handle(packet, connection)
            }
        }
    }
}

/// A process listening for live messages or answering requests; it stops when cancelled or released.
public final class LiveListener: Sendable {
    /// The identifier listened to.
    public let identifier: String
    private let endpoint: LiveEndpoint

    init(identifier: String, endpoint: LiveEndpoint) {
        self.identifier = identifier
        self.endpoint = endpoint
    }

    /// Stops listening: senders no longer reach this process. A message being handled finishes.
    public func cancel() { endpoint.stop() }

    deinit { cancel() }
}
