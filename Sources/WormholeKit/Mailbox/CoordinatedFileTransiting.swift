import Foundation

/// A ``FileTransiting`` whose readers and writers are coordinated across processes by a directory-wide lock.
///
/// `NSFileCoordinator` does not exist on Linux; this is its counterpart for a wormhole. Every operation takes a
/// `flock` lock on the hidden file `.coordination.lock` in the directory: reads take it shared, writes and
/// deletions exclusive. So writers from many processes serialise in one order, and a reader never sees a
/// ``deleteAllMessages()`` in progress: it sees every mailbox before the clearing or after it (where a mailbox that
/// could not be cleared, of another format version say, is as it was).
/// ``snapshot()`` reads all mailboxes under one shared lock.
///
/// The price is one more `open`, `flock` and `close` per operation, and writers to different identifiers wait
/// for each other; use ``FileTransiting`` when each message stands alone.
public final class CoordinatedFileTransiting: Transiting {
    static let lockFileName = ".coordination.lock"

    /// The transiting that does the file work once the lock is held.
    public let files: FileTransiting
    /// The directory that holds the mailbox files.
    public var directory: String { files.directory }

    /// Opens (and by default creates) a directory of mailboxes with coordinated access.
    ///
    /// - Throws: as ``FileTransiting/init(directory:options:createDirectory:)``.
    public init(
        directory: String,
        options: FileTransiting.Options = .init(),
        createDirectory: Bool = true
    ) throws(WormholeError) {
        self.files = try FileTransiting(directory: directory, options: options, createDirectory: createDirectory)
    }

    /// Runs `body` while holding the directory's lock: shared lets other readers in, exclusive lets nobody in.
    ///
    /// Use it to make several operations on ``files`` one step for every other coordinated process. The lock is held
    /// while `body` runs, so keep it short; while this process's wormholes are suspended (``Wormhole/suspend()``) it
    /// throws ``WormholeError/Code/suspended`` and runs nothing, since iOS ends a suspended app that holds a lock in
    /// a shared container.
    public func coordinate<T>(
        exclusive: Bool,
        _ body: () throws(WormholeError) -> T
    ) throws(WormholeError) -> T {
        let path = files.handle.filePath(Self.lockFileName)
        // The lock is held while `body` runs: the permit is too, so that ``Wormhole/suspend()`` refuses new
        // coordination and can tell when the last one ends.
        return try SuspensionGate.withPermit(toDo: "take the coordination lock", path: path) {
            () throws(WormholeError) -> T in try coordinate(exclusive: exclusive, lockPath: path, body)
        }
    }

    private func coordinate<T>(
        exclusive: Bool,
        lockPath path: String,
        _ body: () throws(WormholeError) -> T
    ) throws(WormholeError) -> T {
        let lock: OwnedDescriptor
        do {
            lock = try files.handle.openFile(named: Self.lockFileName, flags: O_RDWR | O_CREAT)
        } catch {
            throw WormholeError.fileSystem(error, "open the coordination lock", path: path)
        }
        // A fresh open file description per call: flock locks held through one description do not exclude
        // each other, so threads of this process must not share one.
        try lock.descriptor.lock(
            exclusive: exclusive,
            waitingAtMost: files.options.lockWaitLimit,
            toDo: "take the coordination lock",
            path: path
        )
        return try body()
    }

    /// Every non-empty mailbox and its message, read as one consistent view.
    public func snapshot() throws(WormholeError) -> [String: Envelope] {
        try coordinate(exclusive: false) { () throws(WormholeError) in
            var messages: [String: Envelope] = [:]
            for identifier in try files.mailboxFileIdentifiers() {
                if let envelope = try files.readMessage(identifier: identifier) { messages[identifier] = envelope }
            }
            return messages
        }
    }

    public func writeMessage(_ payload: Data, sender: String, identifier: String) throws(WormholeError) -> Envelope {
        try MessageIdentifier.validate(identifier)
        return try coordinate(exclusive: true) { () throws(WormholeError) in
            try files.writeMessage(payload, sender: sender, identifier: identifier)
        }
    }

    public func readMessage(identifier: String) throws(WormholeError) -> Envelope? {
        try MessageIdentifier.validate(identifier)
        return try coordinate(exclusive: false) { () throws(WormholeError) in
            try files.readMessage(identifier: identifier)
        }
    }

    public func deleteMessage(identifier: String) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        try coordinate(exclusive: true) { () throws(WormholeError) in try files.deleteMessage(identifier: identifier) }
    }

    public func deleteAllMessages() throws(WormholeError) {
        try coordinate(exclusive: true) { () throws(WormholeError) in try files.deleteAllMessages() }
    }

    public func identifiers() throws(WormholeError) -> [String] {
        try coordinate(exclusive: false) { () throws(WormholeError) in try files.identifiers() }
    }
}
