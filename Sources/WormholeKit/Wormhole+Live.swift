#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

extension Wormhole {
    // MARK: Live messages

    /// Sends a message to every process listening for `identifier` right now; nothing is stored.
    ///
    /// This is WatchConnectivity's `sendMessage` between processes: a message for whoever is there. When nobody is
    /// listening, it fails at once with ``WormholeError/Code/notReachable``; for a message that must wait for its
    /// reader, pass it to a mailbox or a queue instead.
    ///
    /// The connection to each listener is kept for the next message, so a message costs an `fstat` of the directory
    /// and one `send`. A listener that falls behind holds its messages in its socket's buffer; when that is full,
    /// sending waits for it.
    ///
    /// - Returns: How many processes it reached.
    @discardableResult
    public func sendMessage<Message: Encodable>(_ message: Message, identifier: String) throws(WormholeError) -> Int {
        try sendMessageData(try encode(message, identifier: identifier), identifier: identifier)
    }

    /// Sends bytes as they are to every process listening for `identifier` right now.
    @discardableResult
    public func sendMessageData(_ payload: Data, identifier: String) throws(WormholeError) -> Int {
        try MessageIdentifier.validate(identifier)
        try checkLiveSize(payload, identifier: identifier)
        let packet = LivePacket(kind: .message, sender: sender, payload: Array(payload)).encoded()
        let directory = try liveDirectory()
        let prefix = LiveSocket.prefix(for: identifier)
        let reached = try liveConnections.withLock { (cache) throws(WormholeError) -> Int in
            try cache.refresh(directory)
            var reached = 0
            for name in cache.names where name.hasPrefix(prefix) {
                // A kept connection first; a listener gone since (its process killed) fails it, and a fresh connect
                // then finds the socket dead and removes it.
                if let socket = cache.sockets[name] {
                    if LiveSocket.send(socket, packet) {
                        reached += 1
                        continue
                    }
                    cache.drop(name)
                }
                guard let socket = connectLive(directory, name: name) else { continue }
                if LiveSocket.send(socket, packet) {
                    reached += 1
                    cache.sockets[name] = socket
                } else {
                    _ = close(socket)
                }
            }
            return reached
        }
        guard reached > 0 else { throw notReachable(identifier) }
        return reached
    }

    /// Calls `listener` with each live message sent to `identifier` while this listener lives.
    ///
    /// - Throws: ``WormholeError`` when the listening socket cannot be created.
    public func listenForLiveMessages<Message: Decodable & Sendable>(
        withIdentifier identifier: String,
        as type: Message.Type = Message.self,
        on execution: CallbackExecution = .serialQueue,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        listener: @escaping @Sendable (Message) -> Void
    ) throws(WormholeError) -> LiveListener {
        try listenForLiveMessageData(withIdentifier: identifier, on: execution) { [self] payload in
            do throws(WormholeError) {
                listener(try decodeLive(type, payload, identifier: identifier))
            } catch {
                report(error, to: errorHandler)
            }
        }
    }

    /// Calls `listener` with the bytes of each live message sent to `identifier` while this listener lives, as
    /// ``sendMessageData(_:identifier:)`` sent them.
    ///
    /// - Throws: ``WormholeError`` when the listening socket cannot be created.
    public func listenForLiveMessageData(
        withIdentifier identifier: String,
        on execution: CallbackExecution = .serialQueue,
        listener: @escaping @Sendable (Data) -> Void
    ) throws(WormholeError) -> LiveListener {
        try MessageIdentifier.validate(identifier)
        let endpoint = try LiveEndpoint(
            directory: try liveDirectory(), identifier: identifier,
            schedule: execution.makeScheduler(label: "wormhole.live.\(identifier)")
        ) { packet, connection in
            // A request sent to a listener of messages gets no reply: closing tells the requester at once.
            if let connection { _ = close(connection) }
            guard packet.kind == .message else { return }
            listener(Data(packet.payload))
        }
        return LiveListener(identifier: identifier, endpoint: endpoint)
    }

    // MARK: Requests and replies

    /// Sends a request to one process answering `identifier` and waits for its reply.
    ///
    /// ```swift
    /// let answer = try await wormhole.request(Query(term: "swift"), identifier: "lookup", as: Answer.self,
    ///                                         timeout: .seconds(1))
    /// ```
    ///
    /// The waiting happens on a thread of its own, never on the cooperative thread pool.
    ///
    /// - Throws: ``WormholeError/Code/notReachable`` when no process answers `identifier`,
    ///   ``WormholeError/Code/timedOut`` after `timeout`, ``WormholeError/Code/remoteFailure`` when the responder
    ///   threw (its error's description is in the message) or its process ended before replying (at once, not at the
    ///   time-out), ``WormholeError/Code/decodingFailed`` for a reply of another type.
    public func request<Query: Encodable, Answer: Decodable & Sendable>(
        _ query: Query, identifier: String, as type: Answer.Type = Answer.self, timeout: Duration = .seconds(5)
    ) async throws(WormholeError) -> Answer {
        let reply = try await requestData(try encode(query, identifier: identifier), identifier: identifier, timeout: timeout)
        return try decodeLive(type, reply, identifier: identifier)
    }

    /// Sends bytes as a request and returns the reply's bytes; see ``request(_:identifier:as:timeout:)``.
    public func requestData(_ payload: Data, identifier: String, timeout: Duration = .seconds(5)) async throws(WormholeError) -> Data {
        try MessageIdentifier.validate(identifier)
        try checkLiveSize(payload, identifier: identifier)
        // A thread of its own: the wait must block neither the cooperative pool nor Dispatch's shared threads,
        // which grow slowly when many requests wait at once.
        let result: Result<Data, WormholeError> = await withCheckedContinuation { continuation in
            Thread { [self] in
                continuation.resume(returning: performRequest(payload, identifier: identifier, timeout: timeout))
            }.start()
        }
        return try result.get()
    }

    /// Answers each request sent to `identifier` with what `responder` returns; an error it throws goes back to the
    /// requester as ``WormholeError/Code/remoteFailure``.
    ///
    /// Any number of processes may answer one identifier; each request goes to one of them.
    public func respondToRequests<Query: Decodable & Sendable, Answer: Encodable & Sendable>(
        withIdentifier identifier: String,
        as type: Query.Type = Query.self,
        on execution: CallbackExecution = .serialQueue,
        responder: @escaping @Sendable (Query) throws -> Answer
    ) throws(WormholeError) -> LiveListener {
        try respondToRequestData(withIdentifier: identifier, on: execution) { [self] payload in
            let query = try decodeLive(type, payload, identifier: identifier)
            return try coder.encode(try responder(query))
        }
    }

    /// Answers each request sent to `identifier` with bytes; see ``respondToRequests(withIdentifier:as:on:responder:)``.
    public func respondToRequestData(
        withIdentifier identifier: String,
        on execution: CallbackExecution = .serialQueue,
        responder: @escaping @Sendable (Data) throws -> Data
    ) throws(WormholeError) -> LiveListener {
        try MessageIdentifier.validate(identifier)
        let endpoint = try LiveEndpoint(
            directory: try liveDirectory(), identifier: identifier,
            schedule: execution.makeScheduler(label: "wormhole.respond.\(identifier)")
        ) { [self] packet, connection in
            guard let connection else { return }  // a message sent to a responder: nothing to answer
            defer { _ = close(connection) }
            guard packet.kind == .request else { return }
            let reply: LivePacket
            do {
                let answer = try responder(Data(packet.payload))
                reply = answer.count <= LiveSocket.maximumMessageSize
                    ? LivePacket(kind: .reply, sender: sender, payload: Array(answer))
                    : LivePacket(kind: .failure, sender: sender, payload: Array("the reply is larger than 64 KiB".utf8))
            } catch {
                reply = LivePacket(kind: .failure, sender: sender, payload: Array("\(error)".utf8))
            }
            _ = LiveSocket.send(connection, reply.encoded())
        }
        return LiveListener(identifier: identifier, endpoint: endpoint)
    }

    // MARK: Plumbing

    private func performRequest(_ payload: Data, identifier: String, timeout: Duration) -> Result<Data, WormholeError> {
        do throws(WormholeError) {
            guard let socket = try connectLive(identifier: identifier) else {
                throw notReachable(identifier)
            }
            defer { _ = close(socket) }
            guard LiveSocket.send(socket, LivePacket(kind: .request, sender: sender, payload: Array(payload)).encoded())
            else {
                throw WormholeError(.remoteFailure, "The responder closed the connection before taking the request.", identifier: identifier)
            }
            let (seconds, attoseconds) = timeout.components
            let milliseconds = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000)
            guard LiveSocket.waitReadable(socket, milliseconds: max(milliseconds, 0)) else {
                throw WormholeError(.timedOut, "No reply within \(timeout).", identifier: identifier)
            }
            guard let bytes = LiveSocket.receive(socket), let reply = LivePacket(bytes) else {
                throw WormholeError(
                    .remoteFailure,
                    "The responder's process ended, or closed the connection, before replying.", identifier: identifier)
            }
            guard reply.kind == .reply else {
                throw WormholeError(
                    .remoteFailure, "The responder (\(reply.sender)) failed: \(String(decoding: reply.payload, as: UTF8.self))",
                    identifier: identifier)
            }
            return .success(Data(reply.payload))
        } catch {
            return .failure(error)
        }
    }

    /// Connects to one socket of `identifier` that answers, for a request. Removes sockets whose process is gone.
    private func connectLive(identifier: String) throws(WormholeError) -> Int32? {
        let directory = try liveDirectory()
        let prefix = LiveSocket.prefix(for: identifier)
        for name in try directory.entries().filter({ $0.hasPrefix(prefix) }).shuffled() {
            if let socket = connectLive(directory, name: name) { return socket }
        }
        return nil
    }

    /// Connects to the socket file `name`; nil when it is not a trusted socket or nobody answers (a socket whose
    /// process is gone is removed).
    func connectLive(_ directory: DirectoryHandle, name: String) -> Int32? {
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

    private func liveDirectory() throws(WormholeError) -> DirectoryHandle {
        guard let path = directory else {
            throw WormholeError(
                .directoryUnavailable, "Live messages need a directory; this wormhole was made with a custom transiting.")
        }
        return try live.withLock { (cached) throws(WormholeError) -> DirectoryHandle in
            if let cached { return cached }
            let handle = try DirectoryHandle.open(
                path: path + "/" + LiveSocket.subdirectoryName, create: true, options: fileOptions)
            cached = handle
            return handle
        }
    }

    private func checkLiveSize(_ payload: Data, identifier: String) throws(WormholeError) {
        guard payload.count <= LiveSocket.maximumMessageSize - 256 - sender.utf8.count else {
            throw WormholeError(
                .messageTooLarge,
                "Live messages and requests carry up to 64 KiB; this one is \(payload.count) bytes. Use a queue or a "
                    + "file transfer for more.", identifier: identifier)
        }
    }

    private func notReachable(_ identifier: String) -> WormholeError {
        WormholeError(
            .notReachable, "No process is listening for \"\(identifier)\" right now; nothing was sent.",
            identifier: identifier)
    }

    func encode<Message: Encodable>(_ message: Message, identifier: String) throws(WormholeError) -> Data {
        try coder.encodeMessage(message, identifier: identifier)
    }

    private func decodeLive<Message: Decodable>(
        _ type: Message.Type, _ payload: Data, identifier: String
    ) throws(WormholeError) -> Message {
        do {
            return try coder.decode(type, from: payload)
        } catch {
            throw WormholeError(
                .decodingFailed, "The live message is not a \(Message.self): \(error).", identifier: identifier,
                underlyingError: error)
        }
    }
}

/// The connections ``Wormhole/sendMessageData(_:identifier:)`` keeps to live listeners, and the `.live` directory's
/// names as last read: a message costs an `fstat` and one `send`, and the directory is read again only when it may
/// have changed.
final class LiveConnectionCache {
    /// The socket files of `.live` as last read.
    private(set) var names: [String] = []
    /// Connected sockets by socket file name.
    var sockets: [String: Int32] = [:]
    private var modified: timespec?

    /// Reads the directory again if it changed since it was last read (a listener came or went), and drops the
    /// connections of sockets that are gone.
    func refresh(_ directory: DirectoryHandle) throws(WormholeError) {
        var status = stat()
        guard fstat(directory.rawDescriptor, &status) == 0 else {
            throw WormholeError.fileSystem(currentErrno, "inspect the live directory", path: directory.path)
        }
        let stamp = status.st_mtim
        // Timestamps are coarse (a clock tick): a listener that came in the tick of the last read would leave the
        // same stamp. Only a stamp older than that tick is trusted to mean "nothing came since".
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let age = (now.tv_sec - stamp.tv_sec) * 1_000_000_000 + (now.tv_nsec - stamp.tv_nsec)
        if let modified, modified.tv_sec == stamp.tv_sec, modified.tv_nsec == stamp.tv_nsec, age > 50_000_000 {
            return
        }
        names = try directory.entries().shuffled()
        modified = stamp
        let present = Set(names)
        for name in sockets.keys where !present.contains(name) { drop(name) }
    }

    func drop(_ name: String) {
        if let socket = sockets.removeValue(forKey: name) { _ = close(socket) }
    }

    deinit { for socket in sockets.values { _ = close(socket) } }
}
