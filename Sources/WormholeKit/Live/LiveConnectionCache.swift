/// A kept connection to a live listener, closed when the last sender using it lets go: a send under way on one thread
/// never meets a descriptor that another thread closed (and that the system may have given to another file).
final class LiveConnection: Sendable {
    let socket: PacketSocket

    init(_ socket: PacketSocket) { self.socket = socket }

    deinit { socket.close() }
}

/// One listener's socket as a sender finds it: its file's name, and the connection kept to it, if any.
///
/// Never changed once made: keeping or dropping a connection makes new targets, so that a sender may use the ones it
/// looked up outside the cache's lock.
final class LiveTarget: Sendable {
    let name: String
    let connection: LiveConnection?

    init(name: String, connection: LiveConnection?) {
        self.name = name
        self.connection = connection
    }
}

/// The connections ``Wormhole/sendMessageData(_:identifier:)`` keeps to live listeners, and the `.live` directory's
/// names as last read: a message costs one `send` per listener and a look at the directory's count of changes
/// (``LiveChangeCounter``, a load from memory; an `fstat` of the directory where the count cannot be shared), and the
/// directory is read again only when it changed.
///
/// Used under a lock held only to look things up and to keep or drop a connection: sends happen outside it, so that
/// a listener that stopped reading holds up only the sends to it. A send to one of the last few identifiers looks
/// nothing up by name (no string is hashed): the targets found for them are kept until the directory or a connection
/// changes.
///
/// Its properties are checked for exclusive access at compile time only (`@exclusivity(unchecked)`): the lock that
/// holds the cache serialises every call, and the run-time check cost more than the lookup it guarded.
final class LiveConnectionCache {
    /// The socket files of `.live` as last read.
    @exclusivity(unchecked) private var names: [String] = []
    /// Connected sockets by socket file name.
    @exclusivity(unchecked) private var sockets: [String: LiveConnection] = [:]
    /// The directory's modification time when it was last read, in nanoseconds since 1970 (without a count).
    @exclusivity(unchecked) private var modified: Int64?
    /// The directory's count of changes when it was last read.
    @exclusivity(unchecked) private var countedChanges: UInt64?
    /// The targets of each identifier's listeners among ``names``, found on the first send after a change.
    @exclusivity(unchecked) private var targetsByIdentifier: [String: [LiveTarget]] = [:]
    /// The identifiers of the last lookups and what they found, the latest last: most senders send to one identifier
    /// or a few (a ping and a pong) over and over.
    @exclusivity(unchecked) private var recentLookups: [(identifier: String, targets: [LiveTarget])] = []
    private static let recentLookupsKept = 4

    /// Reads the directory again if it changed since it was last read (a listener came or went), and drops the
    /// connections of sockets that are gone. With `changes`, the count tells; without, the modification time.
    func refresh(_ directory: DirectoryHandle, changes: LiveChangeCounter?) throws(WormholeError) {
        if let changes {
            // Read before the directory: a change made while it is read leaves another count, seen next time.
            let count = changes.value
            if count == countedChanges { return }
            try read(directory)
            countedChanges = count
            return
        }
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
        try read(directory)
        modified = stamp
    }

    private func read(_ directory: DirectoryHandle) throws(WormholeError) {
        names = try directory.entries().shuffled()
        forgetTargets()
        let present = Set(names)
        for name in sockets.keys where !present.contains(name) { sockets[name] = nil }
    }

    /// The listeners of `identifier` (not its responders), as last read, each with its kept connection.
    func targets(of identifier: String, naming: LiveSocketNaming) -> [LiveTarget] {
        // Equal strings of the same storage compare without reading their bytes.
        for lookup in recentLookups where lookup.identifier == identifier { return lookup.targets }
        let found: [LiveTarget]
        if let known = targetsByIdentifier[identifier] {
            found = known
        } else {
            let prefix = naming.listenerPrefix(for: identifier)
            found = names.filter { $0.hasPrefix(prefix) }.map { LiveTarget(name: $0, connection: sockets[$0]) }
            // Bounded: a process that sends to ever new identifiers keeps only the recent ones.
            if targetsByIdentifier.count >= 1024 { targetsByIdentifier.removeAll(keepingCapacity: true) }
            targetsByIdentifier[identifier] = found
        }
        if recentLookups.count >= Self.recentLookupsKept { recentLookups.removeFirst() }
        recentLookups.append((identifier, found))
        return found
    }

    /// Keeps `connection` to the socket file `name` for the sends that follow (one kept meanwhile by another thread
    /// closes once unused).
    func keep(_ connection: LiveConnection, to name: String) {
        sockets[name] = connection
        forgetTargets()
    }

    /// Forgets the connection to `name` if it is still `connection` (closed once no send uses it).
    func drop(_ connection: LiveConnection, to name: String) {
        guard sockets[name] === connection else { return }
        sockets[name] = nil
        forgetTargets()
    }

    private func forgetTargets() {
        targetsByIdentifier.removeAll(keepingCapacity: true)
        recentLookups.removeAll(keepingCapacity: true)
    }
}
