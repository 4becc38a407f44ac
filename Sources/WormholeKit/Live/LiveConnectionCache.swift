/// A kept connection to a live listener, closed when the last sender using it lets go: a send under way on one thread
/// never meets a descriptor that another thread closed (and that the system may have given to another file).
final class LiveConnection: Sendable {
    let socket: PacketSocket

    init(_ socket: PacketSocket) { self.socket = socket }

    deinit { socket.close() }
}

/// The connections ``Wormhole/sendMessageData(_:identifier:)`` keeps to live listeners, and the `.live` directory's
/// names as last read: a message costs an `fstat` and one `send` per listener, and the directory is read again only
/// when it may have changed.
///
/// Used under a lock held only to look things up and to keep or drop a connection: sends happen outside it, so that
/// a listener that stopped reading holds up only the sends to it.
final class LiveConnectionCache {
    /// The socket files of `.live` as last read.
    private(set) var names: [String] = []
    /// Connected sockets by socket file name.
    var sockets: [String: LiveConnection] = [:]
    /// The directory's modification time when it was last read, in nanoseconds since 1970.
    private var modified: Int64?
    /// The socket files of each identifier's listeners among ``names``, found on the first send after a read.
    private var listenersByIdentifier: [String: [String]] = [:]

    /// Reads the directory again if it changed since it was last read (a listener came or went), and drops the
    /// connections of sockets that are gone.
    func refresh(_ directory: DirectoryHandle) throws(WormholeError) {
        let stamp: Int64
        switch directory.modificationTime() {
        case .success(let value): stamp = value
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "inspect the live directory", path: directory.path)
        }
        // Timestamps are coarse (a clock tick): a listener that came in the tick of the last read would leave the
        // same stamp. Only a stamp older than that tick is trusted to mean "nothing came since".
        if let modified, modified == stamp, ProcessFacts.wallClockNanoseconds() - stamp > 50_000_000 {
            return
        }
        names = try directory.entries().shuffled()
        modified = stamp
        listenersByIdentifier.removeAll(keepingCapacity: true)
        let present = Set(names)
        for name in sockets.keys where !present.contains(name) { drop(name) }
    }

    /// The socket files of the listeners of `identifier` (not its responders'), as last read.
    func listeners(of identifier: String) -> [String] {
        if let known = listenersByIdentifier[identifier] { return known }
        let prefix = LiveSocket.prefix(for: identifier)
        let responders = LiveSocket.responderPrefix(for: identifier)
        let found = names.filter { $0.hasPrefix(prefix) && !$0.hasPrefix(responders) }
        // Bounded: a process that sends to ever new identifiers keeps only the recent ones.
        if listenersByIdentifier.count >= 1024 { listenersByIdentifier.removeAll(keepingCapacity: true) }
        listenersByIdentifier[identifier] = found
        return found
    }

    /// Forgets the connection to `name` (closed once no send uses it).
    func drop(_ name: String) {
        sockets[name] = nil
    }
}
