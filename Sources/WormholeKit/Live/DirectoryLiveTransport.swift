#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

/// Live messages and requests through Unix `SOCK_SEQPACKET` sockets in a directory's `.live` subdirectory.
///
/// Each endpoint (a listener of messages or a responder to requests) is a socket served by a thread of its own
/// (``LiveEndpoint``); responders' socket names carry an `r.` after the identifier's hash, so that a message never
/// reaches a responder, nor a request a listener. `FORMAT.md` describes the names and packets.
final class DirectoryLiveTransport: LiveTransport {
    let path: String
    let options: FileTransiting.Options
    let sender: String
    /// The `.live` directory of sockets, opened on first use.
    private let live = Locked<DirectoryHandle?>(nil)
    /// The connections live messages go out on, kept between sends.
    private let connections = Locked(LiveConnectionCache())

    init(path: String, options: FileTransiting.Options, sender: String) {
        self.path = path
        self.options = options
        self.sender = sender
    }

    func send(_ payload: Data, identifier: String) throws(WormholeError) -> Int {
        let packet = LivePacket(kind: .message, sender: sender, payload: Array(payload)).encoded()
        let directory = try liveDirectory()
        let prefix = LiveSocket.prefix(for: identifier)
        let responders = LiveSocket.responderPrefix(for: identifier)
        let reached = try connections.withLock { (cache) throws(WormholeError) -> Int in
            try cache.refresh(directory)
            var reached = 0
            for name in cache.names where name.hasPrefix(prefix) && !name.hasPrefix(responders) {
                // A kept connection first; a listener gone since (its process killed) fails it, and a fresh connect
                // then finds the socket dead and removes it.
                if let socket = cache.sockets[name] {
                    if LiveSocket.send(socket, packet) {
                        reached += 1
                        continue
                    }
                    cache.drop(name)
                }
                guard let socket = Self.connectSocket(directory, name: name) else { continue }
                if LiveSocket.send(socket, packet) {
                    reached += 1
                    cache.sockets[name] = socket
                } else {
                    _ = close(socket)
                }
            }
            return reached
        }
        guard reached > 0 else { throw LiveErrors.notReachable(identifier) }
        return reached
    }

    func listen(
        identifier: String, handler: @escaping @Sendable (LiveMessage) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let endpoint = try LiveEndpoint(
            directory: try liveDirectory(), name: LiveSocket.prefix(for: identifier), identifier: identifier
        ) { packet, connection in
            // A request sent to a listener of messages (by an older version) gets no reply: closing tells the
            // requester at once.
            if let connection { _ = close(connection) }
            guard packet.kind == .message else { return }
            handler(LiveMessage(sender: packet.sender, payload: Data(packet.payload)))
        }
        return NotifierObservation { endpoint.stop() }
    }

    func request(_ payload: Data, identifier: String, timeout: Duration) -> Result<Data, WormholeError> {
        do throws(WormholeError) {
            guard let socket = try connectResponder(identifier: identifier) else {
                throw LiveErrors.notReachable(identifier)
            }
            defer { _ = close(socket) }
            let packet = LivePacket(kind: .request, sender: sender, payload: Array(payload)).encoded()
            guard LiveSocket.send(socket, packet) else {
                throw WormholeError(
                    .remoteFailure, "The responder closed the connection before taking the request.",
                    identifier: identifier)
            }
            let (seconds, attoseconds) = timeout.components
            let milliseconds = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000)
            guard LiveSocket.waitReadable(socket, milliseconds: max(milliseconds, 0)) else {
                throw WormholeError(.timedOut, "No reply within \(timeout).", identifier: identifier)
            }
            guard let bytes = LiveSocket.receive(socket), let reply = LivePacket(bytes) else {
                throw WormholeError(
                    .remoteFailure,
                    "The responder's process ended, or closed the connection, before replying.",
                    identifier: identifier)
            }
            guard reply.kind == .reply else {
                throw WormholeError(
                    .remoteFailure,
                    "The responder (\(reply.sender)) failed: \(String(decoding: reply.payload, as: UTF8.self))",
                    identifier: identifier)
            }
            return .success(Data(reply.payload))
        } catch {
            return .failure(error)
        }
    }

    func respond(
        identifier: String, handler: @escaping @Sendable (LiveRequest) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let sender = self.sender
        let endpoint = try LiveEndpoint(
            directory: try liveDirectory(), name: LiveSocket.responderPrefix(for: identifier), identifier: identifier
        ) { packet, connection in
            guard let connection else { return }  // a message sent to a responder: nothing to answer
            guard packet.kind == .request else {
                _ = close(connection)
                return
            }
            handler(
                LiveRequest(sender: packet.sender, payload: Data(packet.payload)) { answer in
                    defer { _ = close(connection) }
                    let reply: LivePacket
                    switch answer {
                    case .reply(let bytes) where bytes.count <= LiveSocket.maximumMessageSize - 256:
                        reply = LivePacket(kind: .reply, sender: sender, payload: Array(bytes))
                    case .reply:
                        reply = LivePacket(
                            kind: .failure, sender: sender, payload: Array("the reply is larger than 64 KiB".utf8))
                    case .failure(let description):
                        reply = LivePacket(kind: .failure, sender: sender, payload: Array(description.utf8.prefix(4096)))
                    }
                    _ = LiveSocket.send(connection, reply.encoded())
                })
        }
        return NotifierObservation { endpoint.stop() }
    }

    // MARK: Plumbing

    /// Connects to one responder socket of `identifier`. Removes sockets whose process is gone.
    private func connectResponder(identifier: String) throws(WormholeError) -> Int32? {
        let directory = try liveDirectory()
        let prefix = LiveSocket.responderPrefix(for: identifier)
        for name in try directory.entries().filter({ $0.hasPrefix(prefix) }).shuffled() {
            if let socket = Self.connectSocket(directory, name: name) { return socket }
        }
        return nil
    }

    /// Connects to the socket file `name`; nil when it is not a trusted socket or nobody answers (a socket whose
    /// process is gone is removed).
    static func connectSocket(_ directory: DirectoryHandle, name: String) -> Int32? {
        // A socket file planted by another user is not one of ours.
        var status = stat()
        guard fstatat(directory.rawDescriptor, name, &status, AT_SYMLINK_NOFOLLOW) == 0,
            status.st_mode & S_IFMT == S_IFSOCK,
            directory.trustsOtherOwners || UInt32(status.st_uid) == ProcessFacts.effectiveUserID,
            let address = LiveSocket.address(directoryDescriptor: directory.rawDescriptor, name: name)
        else { return nil }
        let socket = LiveSocket.makeSocket()
        guard socket >= 0 else { return nil }
        if LiveSocket.withAddress(address, { connect(socket, $0, $1) }) == 0 { return socket }
        if errno == ECONNREFUSED { _ = unlinkat(directory.rawDescriptor, name, 0) }  // its process is gone
        _ = close(socket)
        return nil
    }

    func liveDirectory() throws(WormholeError) -> DirectoryHandle {
        try live.withLock { (cached) throws(WormholeError) -> DirectoryHandle in
            if let cached { return cached }
            let handle = try DirectoryHandle.open(
                path: path + "/" + LiveSocket.subdirectoryName, create: true, options: options)
            cached = handle
            return handle
        }
    }
}

/// The errors live messages share across engines.
enum LiveErrors {
    static func notReachable(_ identifier: String) -> WormholeError {
        WormholeError(
            .notReachable, "No process is listening for \"\(identifier)\" right now; nothing was sent.",
            identifier: identifier)
    }
}
