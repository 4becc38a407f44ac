import Foundation
import SystemPackage

/// Live messages and requests through Unix sockets in a directory's `.live` subdirectory.
///
/// Each endpoint is a socket served by a thread of its own: a listener of messages a `SOCK_DGRAM` socket
/// (``LiveMessageEndpoint``), which every sender's datagrams reach, a responder to requests a `SOCK_SEQPACKET` one
/// (``LiveEndpoint``), with a connection per request. Their names carry `m.` or `r.` after the identifier's hash, so
/// that a message never reaches a responder, nor a request a listener. `FORMAT.md` describes the names and packets.
final class DirectoryLiveTransport: LiveTransport {
    let path: String
    let options: FileTransiting.Options
    let sender: String
    /// The `.live` directory of sockets and its count of changes, opened on first use.
    private let live = Locked<LiveDirectory?>(nil)
    /// The connections live messages go out on, kept between sends.
    private let connections = Locked(LiveConnectionCache())
    /// The bytes before a message's payload, the same for every message this process sends.
    private let messageHead: [UInt8]

    init(path: String, options: FileTransiting.Options, sender: String) {
        self.path = path
        self.options = options
        self.sender = sender
        messageHead = LivePacket.head(kind: .message, sender: sender)
    }

    func send(_ payload: Data, identifier: String) throws(WormholeError) -> Int {
        let live = try liveDirectory()
        let directory = live.handle
        let head = messageHead
        // The listeners and their kept connections are looked up under the lock; the sends are made outside it, so
        // that a listener whose queue is full (a process stopped in a debugger) holds up only the sends to it.
        // (The targets are taken as they are, the cache's array shared, not copied: nothing is allocated per message.)
        let targets = try connections.withLock { (cache) throws(WormholeError) -> [LiveTarget] in
            try cache.refresh(directory, changes: live.changes)
            return cache.targets(of: identifier, naming: live.naming)
        }
        var reached = 0
        // Every listener is sent to without waiting first; those whose queue is full (a process stopped in a
        // debugger, or busy) are waited for after, so that each of the others has the message by then.
        var full: [(name: String, connection: LiveConnection)] = []
        for (index, target) in targets.enumerated() {
            // The last listener, when none before it was full, has nobody left to wait for it: its send may wait at
            // once (one call, where a send that found no room would take three).
            let mayWait = full.isEmpty && index == targets.count - 1
            // A kept connection first; a listener gone since (its process killed) fails it, and a fresh connect
            // then finds the socket dead and removes it.
            if let kept = target.connection {
                switch Self.transmit(head, payload, on: kept.socket, waiting: mayWait) {
                case .success:
                    reached += 1
                    continue
                case .failure(let errno) where Self.meansFull(errno):
                    full.append((target.name, kept))
                    continue
                case .failure:
                    connections.withLock { $0.drop(kept, to: target.name) }
                }
            }
            guard
                let socket = Self.connectSocket(directory, name: target.name, kind: .datagrams, changes: live.changes)
            else { continue }
            let connection = LiveConnection(socket)
            switch Self.transmit(head, payload, on: connection.socket, waiting: mayWait) {
            case .success:
                reached += 1
                connections.withLock { $0.keep(connection, to: target.name) }
            case .failure(let errno) where Self.meansFull(errno):
                connections.withLock { $0.keep(connection, to: target.name) }
                full.append((target.name, connection))
            case .failure:
                break
            }
        }
        // Then the full ones together: each as soon as its queue has room, none waiting behind another (a listener
        // only busy is not held up by one stopped in a debugger).
        var pause: Int32 = 1
        while !full.isEmpty {
            Self.waitForRoom(full.map(\.connection.socket.rawValue), milliseconds: pause)
            pause = min(pause * 2, 10)
            // The last one left may wait in its send (on Darwin, which fails it with `ENOBUFS`, the loop pauses).
            let mayWait = full.count == 1
            full.removeAll { (name, connection) in
                switch Self.transmit(head, payload, on: connection.socket, waiting: mayWait) {
                case .success:
                    reached += 1
                    return true
                case .failure(let errno) where Self.meansFull(errno):
                    return false
                case .failure:
                    // Its listener is gone (its socket closed): dropped, and the next send finds it dead.
                    connections.withLock { $0.drop(connection, to: name) }
                    return true
                }
            }
        }
        guard reached > 0 else { throw LiveErrors.notReachable(identifier) }
        return reached
    }

    /// Sends a message's head and payload as one packet, neither copied.
    private static func transmit(
        _ head: [UInt8],
        _ payload: Data,
        on socket: PacketSocket,
        waiting: Bool
    ) -> Result<Void, Errno> {
        head.withUnsafeBytes { head in
            payload.withUnsafeBytes { body in socket.send(head: head, body: body, waiting: waiting) }
        }
    }

    /// Whether a send failed only for want of room in the listener's queue.
    private static func meansFull(_ errno: Errno) -> Bool {
        errno == .resourceTemporarilyUnavailable || errno == .wouldBlock || errno == .noBufferSpace
    }

    /// Waits until one of `sockets` may have room in its listener's queue, or `milliseconds` pass. Linux says when
    /// a connected datagram socket's peer has room (`POLLOUT`); Darwin does not (a send to a full receiver fails with
    /// `ENOBUFS`, and the socket always looks writable), so there this is a pause.
    private static func waitForRoom(_ sockets: [Int32], milliseconds: Int32) {
        #if os(Linux) || os(Android)
        PollSet.waitWritable(sockets, milliseconds: milliseconds)
        #else
        usleep(UInt32(milliseconds) * 1000)
        #endif
    }

    func listen(
        identifier: String,
        handler: @escaping @Sendable (LiveMessage) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let live = try liveDirectory()
        let endpoint = try LiveMessageEndpoint(
            directory: live.handle,
            naming: live.naming,
            changes: live.changes,
            identifier: identifier
        ) {
            packet in
            handler(LiveMessage(sender: packet.sender, payload: packet.payload))
        }
        return NotifierObservation { endpoint.stop() }
    }

    func request(_ payload: Data, identifier: String, timeout: Duration) -> Result<Data, WormholeError> {
        let start = ContinuousClock.now
        let timedOut = WormholeError(.timedOut, "No reply within \(timeout).", identifier: identifier)
        do throws(WormholeError) {
            // The connection and the send wait at most the time-out: a responder that stopped reading fills its
            // backlog, then its buffer.
            guard let socket = try connectResponder(identifier: identifier, timeout: timeout, from: start) else {
                throw start.duration(to: .now) >= timeout ? timedOut : LiveErrors.notReachable(identifier)
            }
            defer { socket.close() }
            let packet = LivePacket(kind: .request, sender: sender, payload: payload).encoded()
            switch socket.send(packet) {
            case .success: break
            case .failure(.resourceTemporarilyUnavailable): throw timedOut
            case .failure:
                throw WormholeError(
                    .remoteFailure,
                    "The responder closed the connection before taking the request.",
                    identifier: identifier
                )
            }
            guard case .success(true) = PollSet.waitReadable(socket.rawValue, for: timeout, from: start) else {
                throw timedOut
            }
            guard let reply = Self.receiveReply(socket) else {
                throw WormholeError(
                    .remoteFailure,
                    "The responder's process ended, or closed the connection, before replying.",
                    identifier: identifier
                )
            }
            guard reply.kind == .reply else {
                throw WormholeError(
                    .remoteFailure,
                    "The responder (\(reply.sender)) failed: \(String(decoding: reply.payload, as: UTF8.self))",
                    identifier: identifier
                )
            }
            return .success(reply.payload)
        } catch {
            return .failure(error)
        }
    }

    func respond(
        identifier: String,
        handler: @escaping @Sendable (LiveRequest) -> Void
    ) throws(WormholeError) -> NotifierObservation {
        let sender = self.sender
        let live = try liveDirectory()
        let endpoint = try LiveEndpoint(
            directory: live.handle,
            naming: live.naming,
            name: live.naming.responderPrefix(for: identifier),
            identifier: identifier,
            batchCapacity: 1
        ) { packet, connection in
            guard let connection else { return }  // a message sent to a responder: nothing to answer
            guard packet.kind == .request else {
                connection.close()
                return
            }
            handler(
                LiveRequest(sender: packet.sender, payload: packet.payload) { answer in
                    defer { connection.close() }
                    let reply: LivePacket
                    switch answer {
                    // The same room as a request has: the packet's framing and the sender's name count too.
                    case .reply(let bytes)
                    where bytes.count <= LiveSocket.maximumMessageSize - 256 - sender.utf8.count:
                        reply = LivePacket(kind: .reply, sender: sender, payload: bytes)
                    case .reply:
                        reply = LivePacket(
                            kind: .failure,
                            sender: sender,
                            payload: Data("the reply is larger than 64 KiB".utf8)
                        )
                    case .failure(let description):
                        reply = LivePacket(
                            kind: .failure,
                            sender: sender,
                            payload: Data(description.utf8.prefix(4096))
                        )
                    }
                    _ = connection.send(reply.encoded())
                }
            )
        }
        return NotifierObservation { endpoint.stop() }
    }

    // MARK: Plumbing

    /// Connects to one responder socket of `identifier`, each connection and send waiting at most what is left of
    /// `timeout` from `start`. Removes sockets whose process is gone.
    private func connectResponder(
        identifier: String,
        timeout: Duration,
        from start: ContinuousClock.Instant
    ) throws(WormholeError) -> PacketSocket? {
        let live = try liveDirectory()
        let directory = live.handle
        let prefix = live.naming.responderPrefix(for: identifier)
        for name in try directory.entries().filter({ $0.hasPrefix(prefix) }).shuffled() {
            let left = timeout - start.duration(to: .now)
            guard left > .zero else { return nil }
            if let socket = Self.connectSocket(directory, name: name, sendTimeout: left) { return socket }
        }
        return nil
    }

    /// Connects to the socket file `name`; nil when it is not a trusted socket or nobody answers (a socket whose
    /// process is gone is removed, and `changes`, if given, counts it). With a `sendTimeout`, the connection and its
    /// sends wait at most that long.
    static func connectSocket(
        _ directory: DirectoryHandle,
        name: String,
        kind: PacketSocket.Kind = .sequencedPackets,
        changes: LiveChangeCounter? = nil,
        sendTimeout: Duration? = nil
    ) -> PacketSocket? {
        // A socket file planted by another user is not one of ours.
        guard case .success(let status) = directory.status(ofEntry: name), status.isSocket,
            directory.trustsOtherOwners || status.ownerID == ProcessFacts.effectiveUserID,
            let address = UnixSocketAddress(directory: directory, name: name)
        else { return nil }
        switch PacketSocket.connected(to: address, kind: kind, sendTimeout: sendTimeout) {
        case .success(let socket): return socket
        case .failure(.connectionRefused):
            // Its process is gone. Counted as a change, so that every sender reads the directory again.
            if case .success = directory.removeFile(named: name) { changes?.increment() }
            return nil
        case .failure: return nil
        }
    }

    /// Receives a reply that ``PollSet/waitReadable(_:for:from:)`` found waiting; nil when the connection
    /// closed instead, or the packet is not one.
    private static func receiveReply(_ socket: PacketSocket) -> LivePacket? {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: LiveSocket.receiveBufferSize, alignment: 8)
        defer { buffer.deallocate() }
        guard case .packet(let count) = socket.receive(into: buffer, blocking: true) else { return nil }
        return LivePacket(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
    }

    /// The directory of the sockets (``LiveSocketPlacement``: the wormhole's `.live` on Linux), how they are named
    /// there, and, where it can be shared through a mapping, its count of changes.
    struct LiveDirectory {
        let handle: DirectoryHandle
        let naming: LiveSocketNaming
        let changes: LiveChangeCounter?
    }

    func liveDirectory() throws(WormholeError) -> LiveDirectory {
        try live.withLock { (cached) throws(WormholeError) -> LiveDirectory in
            if let cached { return cached }
            let placement = LiveSocketPlacement.forWormhole(at: path)
            let handle: DirectoryHandle
            do throws(WormholeError) {
                handle = try DirectoryHandle.open(path: placement.directory, create: true, options: options)
            } catch {
                guard !placement.isWormholesOwn else { throw error }
                throw WormholeError(
                    error.code,
                    "Live messages and requests need their sockets' addresses to fit in 104 bytes, which this "
                        + "wormhole's path does not leave room for, and the directory they would go in instead cannot "
                        + "be used: \(error.message) Use a wormhole directory with a path of 75 bytes or less.",
                    path: placement.directory,
                    underlyingError: error
                )
            }
            // Not kept when the count cannot be opened: the next call tries again.
            let opened = LiveDirectory(
                handle: handle,
                naming: placement.naming,
                changes: try LiveChangeCounter.open(in: handle)
            )
            cached = opened
            return opened
        }
    }
}

/// The errors live messages share across engines.
enum LiveErrors {
    static func notReachable(_ identifier: String) -> WormholeError {
        WormholeError(
            .notReachable,
            "No process is listening for \"\(identifier)\" right now; nothing was sent.",
            identifier: identifier
        )
    }
}
