import Foundation
import SystemPackage

/// The default transiting: one file per identifier in a directory, written in place, never torn.
///
/// Each mailbox is a file `IDENTIFIER.msg` with two checksummed slots (see `FORMAT.md`). A writer takes the
/// file's `flock` lock, writes the new message into the slot that does not hold the newest one with a single
/// `pwrite`, and lets go; a reader takes no lock and keeps the newest record whose checksum matches. So readers
/// see the previous message or the new one, whole, and a write costs no rename (about 150 µs on ext4) but one
/// in-place write. A new mailbox, one whose message outgrows its slots, and the first message of a file that a
/// listener made empty, are written to a hidden file and renamed into place: a file is never visible half made. On a
/// ``DirectoryEngine`` that in-place write is also what wakes the mailbox's listeners, who watch the file.
///
/// Files are created with mode 0600 and opened relative to the directory with `O_NOFOLLOW`; a symbolic link, a
/// hard link, a FIFO or a file of another user planted in the directory is refused with
/// ``WormholeError/Code/untrustedFile``, never followed.
///
/// ```swift
/// let transiting = try FileTransiting(directory: "/run/user/1000/my-group/wormhole")
/// let wormhole = Wormhole(transiting: transiting, notifier: try DirectoryNotifier(directory: transiting.directory))
/// ```
public final class FileTransiting: Transiting {
    /// How a ``FileTransiting`` treats its files.
    public struct Options: Sendable {
        /// Whether each write is flushed to stable storage with `fsync` before it returns; off by default, as in
        /// MMWormhole: the other processes see the message at once either way, `fsync` only matters if the
        /// machine loses power.
        ///
        /// What each setting promises across a power cut (on ext4's default mode; see "A power cut" in the
        /// documentation, and RELIABILITY.md for what was checked):
        ///
        /// - On: every call that returned is on the disk: a passed message (or a later one) is in its mailbox, an
        ///   enqueued message in its queue, an acknowledgement stored (that message never comes again), a suite
        ///   update applied whole, a sent file staged and a received one in its destination. It costs an `fsync`
        ///   per write, and per acknowledgement two, and a directory's on each file created or renamed.
        /// - Off: the latest calls may be lost, never torn into something else. A queue keeps a prefix of each
        ///   producer's messages, in order, and never delivers a damaged record; a consumer may get messages
        ///   again, and never skips one. A mailbox holds a whole message that was passed to it (not always the
        ///   last), or no message when the pass that made it did not reach the disk, or reports
        ///   ``WormholeError/Code/corruptMessage`` or ``WormholeError/Code/truncatedMessage`` until the next pass
        ///   replaces it. A suite holds a whole earlier version (its log, a run of whole updates). Sent files are
        ///   flushed either way.
        public var synchronizesWrites: Bool
        /// The mode of the files it creates; 0600 by default.
        public var filePermissions: UInt16
        /// The mode of the directories it creates; 0700 by default.
        public var directoryPermissions: UInt16
        /// Whether files and directories of other users are accepted: set it, with group-readable permissions,
        /// only for a directory shared on purpose between users of one Unix group.
        public var trustsOtherOwners: Bool
        /// The largest payload accepted, in bytes; 16 MiB by default, and at most 1 GiB whatever it says. Mailboxes
        /// are for small messages.
        public var maximumMessageSize: Int
        /// The Unix group given to the files and directories the wormhole creates; nil (the default) leaves them
        /// the creating user's group. See ``shared(withGroup:synchronizesWrites:)``.
        public var group: UInt32?
        /// How long a write waits for another process to let go of a file's lock (a mailbox's, a suite's, or the
        /// coordination lock); 5 seconds by default. While the kernel names a holder that runs (on Linux, other
        /// writers taking it one after the other), the wait goes on up to three times as long.
        ///
        /// Writers hold these locks for one write, microseconds; a longer wait means the holder is stuck: stopped by
        /// a signal or a debugger, frozen in a cgroup, or suspended. The write then fails with
        /// ``WormholeError/Code/timedOut``, naming the file and, where the kernel tells it (`/proc/locks` on Linux),
        /// the process that holds the lock; nothing is written, so the call can be made again.
        public var lockWaitLimit: Duration

        /// Creates options; every parameter has the default described on its property.
        public init(
            synchronizesWrites: Bool = false,
            filePermissions: UInt16 = 0o600,
            directoryPermissions: UInt16 = 0o700,
            trustsOtherOwners: Bool = false,
            maximumMessageSize: Int = 16 << 20,
            group: UInt32? = nil,
            lockWaitLimit: Duration = .seconds(5)
        ) {
            self.synchronizesWrites = synchronizesWrites
            self.filePermissions = filePermissions
            self.directoryPermissions = directoryPermissions
            self.trustsOtherOwners = trustsOtherOwners
            self.maximumMessageSize = maximumMessageSize
            self.group = group
            self.lockWaitLimit = lockWaitLimit
        }

        /// Options for a directory shared on purpose by the processes of several users of one Unix group: daemons
        /// and the tools that talk to them, say.
        ///
        /// Directories are created with mode 2770 (setgid, so that everything created in them gets the group) and
        /// files with mode 0660, both given to `group` and set with `fchmod` after creation, so that the creating
        /// process's umask cannot take the group's access away. Files of the group's other users are accepted;
        /// users outside the group can neither read, write nor list the directory. Every process that shares the
        /// directory must use the same options, and its user must be a member of `group`.
        ///
        /// ```swift
        /// let staff = getgrnam("wormhole-users")!.pointee.gr_gid
        /// var configuration = Wormhole.Configuration()
        /// configuration.fileOptions = .shared(withGroup: staff)
        /// let wormhole = try Wormhole(directory: "/run/my-daemon/wormhole", configuration: configuration)
        /// ```
        public static func shared(withGroup group: UInt32, synchronizesWrites: Bool = false) -> Options {
            Options(
                synchronizesWrites: synchronizesWrites,
                filePermissions: 0o660,
                directoryPermissions: 0o2770,
                trustsOtherOwners: true,
                group: group
            )
        }
    }

    /// The directory that holds the mailbox files.
    public var directory: String { handle.path }
    /// The options it was made with.
    public let options: Options
    let handle: DirectoryHandle
    /// Mailbox files kept open, by identifier.
    private let openFiles = OpenFileCache(fileName: FileTransiting.fileName)

    /// Opens (and by default creates, mode 0700) a directory of mailboxes, and removes the hidden files that a
    /// process killed before its rename left there (`FORMAT.md` gives the rule).
    ///
    /// - Parameters:
    ///   - directory: The directory's path.
    ///   - options: File modes, `fsync` and size limits.
    ///   - createDirectory: Whether to create the directory and its missing parents.
    /// - Throws: ``WormholeError/Code/directoryUnavailable`` when the directory is missing (and not to be
    ///   created) or not writable; ``WormholeError/Code/untrustedFile`` when it is a link or another user's.
    public init(directory: String, options: Options = Options(), createDirectory: Bool = true) throws(WormholeError) {
        self.options = options
        self.handle = try DirectoryHandle.open(path: directory, create: createDirectory, options: options)
        // Mailbox and suite files made or replaced by a process killed before its rename.
        handle.removeAbandonedTemporaryFiles()
    }

    static func fileName(_ identifier: String) -> String { identifier + MailboxFormat.fileSuffix }

    /// The largest payload a mailbox file holds, whatever ``Options/maximumMessageSize`` says: its slots' capacity is
    /// stored in 32 bits, and a power of two at least as large as the record.
    static let largestMessageSize = 1 << 30

    // MARK: Transiting

    public func writeMessage(_ payload: Data, sender: String, identifier: String) throws(WormholeError) -> Envelope {
        try MessageIdentifier.validate(identifier)
        guard payload.count <= min(options.maximumMessageSize, Self.largestMessageSize) else {
            let limit =
                payload.count <= options.maximumMessageSize
                ? "a mailbox file holds up to 1 GiB, whatever FileTransiting.Options.maximumMessageSize says. Send a "
                    + "file instead (Wormhole.transfers)."
                : "this wormhole accepts up to \(options.maximumMessageSize). Raise "
                    + "FileTransiting.Options.maximumMessageSize, or pass a path to a file instead."
            throw WormholeError(
                .messageTooLarge,
                "The message is \(payload.count) bytes; " + limit,
                identifier: identifier
            )
        }
        let outgoing = Outgoing(
            timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
            isCleared: false,
            sender: sender,
            payload: payload
        )
        guard let stored = try update(identifier: identifier, createIfMissing: true, outgoing: outgoing) else {
            fatalError("update(createIfMissing: true) always stores a record")
        }
        return Envelope(
            sequence: stored.sequence,
            generation: stored.generation,
            sender: sender,
            timestampNanoseconds: outgoing.timestampNanoseconds,
            payload: payload
        )
    }

    public func readMessage(identifier: String) throws(WormholeError) -> Envelope? {
        try MessageIdentifier.validate(identifier)
        return try readFile(identifier: identifier, woken: false)
    }

    /// ``readMessage(identifier:)`` for a listener's handler, of an identifier validated when listening began.
    ///
    /// Run by a handler of the inotify monitor while this process watches the file, it reads a descriptor checked
    /// since the monitor last said the file may have changed (`OpenFileCache.Entry.isTrustedWhileWatched`) with one
    /// `pread` and no `fstat`, the file's size being what the read gets: its checks (one link, a regular file, this
    /// user's) can only have changed through an event that the monitor reads before it runs this handler again. Run
    /// anywhere else (a handler of the polling monitor, say), it checks the descriptor, as such an event may still
    /// be on its way.
    public func readMessageOnWake(identifier: String) throws(WormholeError) -> Envelope? {
        // Public, so checked again: a few instructions over the identifier's bytes.
        try MessageIdentifier.validate(identifier)
        #if os(Linux) || os(Android)
        return try readFile(identifier: identifier, woken: InotifyMonitor.isRunningHandler)
        #else
        return try readFile(identifier: identifier, woken: false)
        #endif
    }

    /// The cache entry of a mailbox's file, for a watch of it to mark its descriptor untrusted.
    func openEntry(_ identifier: String) -> OpenFileCache.Entry {
        openFiles.entry(identifier)
    }

    private func readFile(identifier: String, woken: Bool) throws(WormholeError) -> Envelope? {
        let entry = openFiles.entry(identifier)
        let name = entry.name
        return try entry.descriptor.withLock { (cached) throws(WormholeError) -> Envelope? in
            for _ in 0..<1000 {
                if cached < 0 {
                    do throws(Errno) {
                        cached = try handle.openFile(named: name, flags: O_RDWR).release()
                        entry.opened()
                    } catch .noSuchFileOrDirectory {
                        return nil
                    } catch .permissionDenied {
                        // A shared directory may give this user read access only: read without caching.
                        return try readUncached(name: name, identifier: identifier)
                    } catch {
                        throw openError(error, identifier: identifier)
                    }
                }
                do throws(WormholeError) {
                    let file = Descriptor(rawValue: cached)
                    if woken, entry.isTrustedWhileWatched,
                        let found = try envelopeOfSmallFile(file, identifier: identifier, sender: entry.senderText)
                    {
                        return found
                    }
                    let beforeCheck = woken ? entry.beforeCheck() : 0
                    guard let status = try handle.trustedStatus(of: file, name: name, identifier: identifier) else {
                        closeCached(&cached)  // replaced or removed: open the file that has the name now
                        continue
                    }
                    if beforeCheck != 0, status.size >= ScratchMemory.keptByteCount {
                        // Past what a trusted read reads whole: checked each time, with no read wasted before.
                        entry.checked(0)
                    } else if beforeCheck != 0 {
                        // Trusted only as the file at the path, which is the one watched: a file renamed away keeps
                        // its link, and no watch would see it change hands.
                        guard case .success(let atPath) = handle.status(ofEntry: name),
                            atPath.device == status.device, atPath.inode == status.inode
                        else {
                            closeCached(&cached)
                            continue
                        }
                        entry.checked(beforeCheck)
                    }
                    return try envelope(in: file, size: status.size, identifier: identifier, sender: entry.senderText)
                } catch {
                    closeCached(&cached)
                    throw error
                }
            }
            throw keptBeingReplaced(identifier)
        }
    }

    private func readUncached(name: String, identifier: String) throws(WormholeError) -> Envelope? {
        let file: OwnedDescriptor
        do {
            file = try handle.openFile(named: name, flags: O_RDONLY)
        } catch .noSuchFileOrDirectory {
            return nil
        } catch {
            throw openError(error, identifier: identifier)
        }
        guard let status = try handle.trustedStatus(of: file.descriptor, name: name, identifier: identifier) else {
            return nil
        }
        return try envelope(in: file.descriptor, size: status.size, identifier: identifier) {
            String(decoding: $0, as: UTF8.self)
        }
    }

    /// The newest message of a mailbox file, or nil when it holds none (or was cleared); throws what is wrong with
    /// a damaged file.
    /// `sender` makes the text of the sender's bytes.
    private func envelope(
        in file: Descriptor,
        size: Int,
        identifier: String,
        sender: (UnsafeRawBufferPointer) -> String
    ) throws(WormholeError) -> Envelope? {
        try withNewestRecord(of: file, size: size, identifier: identifier) { (found) throws(WormholeError) in
            try envelope(of: found, identifier: identifier, sender: sender)
        }
    }

    /// The envelope of what ``MailboxFormat`` found in a file: nil when the file holds no message (or was cleared);
    /// throws what is wrong with a damaged file.
    private func envelope(
        of found: Result<MailboxFormat.Found, MailboxFormat.FileProblem>,
        identifier: String,
        sender: (UnsafeRawBufferPointer) -> String
    ) throws(WormholeError) -> Envelope? {
        switch found {
        case .failure(let problem):
            throw MailboxFormat.error(
                for: problem,
                identifier: identifier,
                path: handle.filePath(Self.fileName(identifier))
            )
        case .success(let found):
            guard let (_, record, bytes) = found.newest, !record.isCleared else { return nil }
            return Envelope(
                sequence: record.sequence,
                generation: found.header.generation,
                sender: sender(UnsafeRawBufferPointer(rebasing: bytes[record.sender])),
                timestampNanoseconds: record.timestampNanoseconds,
                payload: Data(UnsafeRawBufferPointer(rebasing: bytes[record.payload]))
            )
        }
    }

    /// The newest message of a file read whole into memory that can hold ``ScratchMemory/keptByteCount`` bytes, its
    /// size being what the read got: `.some(nil)` when it holds none, nil when it may be larger (read it knowing its
    /// size then).
    private func envelopeOfSmallFile(
        _ file: Descriptor,
        identifier: String,
        sender: (UnsafeRawBufferPointer) -> String
    ) throws(WormholeError) -> Envelope?? {
        try MailboxFormat.withNewestRecordOfSmallFile { (buffer, offset) throws(WormholeError) in
            // One `pread`: fewer bytes than asked for mean the file's end (a second call would only say so again).
            try read(file, into: buffer, at: offset, once: true, identifier: identifier)
        } _: { (found) throws(WormholeError) in
            try envelope(of: found, identifier: identifier, sender: sender)
        }
    }

    private func keptBeingReplaced(_ identifier: String) -> WormholeError {
        WormholeError(
            .ioFailure,
            "The mailbox file kept being replaced while in use; is another program rewriting it?",
            identifier: identifier,
            path: handle.filePath(Self.fileName(identifier))
        )
    }

    /// Empties a mailbox by writing a "cleared" record: the file stays, so its sequence keeps growing and a
    /// listener never mistakes the next message for an old one.
    public func deleteMessage(identifier: String) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        let outgoing = Outgoing(
            timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
            isCleared: true,
            sender: "\(ProcessFacts.processName)[\(ProcessFacts.processID)]",
            payload: Data()
        )
        _ = try update(identifier: identifier, createIfMissing: false, outgoing: outgoing)
    }

    public func deleteAllMessages() throws(WormholeError) {
        // Every mailbox that can be cleared is, one that cannot (of another format version, say) is kept, and the
        // first failure is thrown after: a clear that stopped half-way would leave the later mailboxes as they were.
        // What would fail every mailbox alike (suspension, the directory, a full disk) is thrown at once.
        let identifiers = try mailboxFileIdentifiers()
        var failures: [WormholeError] = []
        for identifier in identifiers {
            do throws(WormholeError) {
                try deleteMessage(identifier: identifier)
            } catch  where error.code == .suspended || error.code == .directoryUnavailable || error.code == .diskFull {
                throw error
            } catch {
                failures.append(error)
            }
        }
        guard let first = failures.first else { return }
        guard failures.count > 1 else { throw first }
        throw WormholeError(
            first.code,
            "\(failures.count) of \(identifiers.count) mailboxes could not be cleared (the others were); the first: "
                + first.message,
            identifier: first.identifier,
            path: first.path,
            underlyingError: first.underlyingError ?? first
        )
    }

    public func identifiers() throws(WormholeError) -> [String] {
        var result: [String] = []
        for identifier in try mailboxFileIdentifiers() {
            do {
                if try readMessage(identifier: identifier) != nil { result.append(identifier) }
            } catch
                where error.code == .corruptMessage || error.code == .truncatedMessage
                || error.code == .unsupportedFormatVersion
            {
                // A damaged mailbox still holds something: list it so that it can be read (and fail) or cleared.
                result.append(identifier)
            } catch  where error.code == .untrustedFile {
                continue
            }
        }
        return result
    }

    /// A record to store; its sequence is the mailbox's next.
    private struct Outgoing {
        var timestampNanoseconds: Int64
        var isCleared: Bool
        var sender: String
        var payload: Data

        /// The sender's UTF-8 bytes as stored: at most 65,535 of them.
        private func withSenderBytes<Value>(_ body: (UnsafeRawBufferPointer) -> Value) -> Value {
            var sender = sender
            return sender.withUTF8 {
                body(UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: $0.prefix(Int(UInt16.max)))))
            }
        }

        var encodedSize: Int {
            MailboxFormat.recordSize(senderSize: min(sender.utf8.count, Int(UInt16.max)), payloadSize: payload.count)
        }

        /// The record, as arrays: for a new or replaced file.
        func record(sequence: UInt64) -> MailboxFormat.Record {
            MailboxFormat.Record(
                sequence: sequence,
                timestampNanoseconds: timestampNanoseconds,
                isCleared: isCleared,
                sender: withSenderBytes { Array($0) },
                payload: Array(payload)
            )
        }

        /// The record's bytes, encoded into temporary memory: a pass in place builds no array.
        func withEncodedBytes<Value>(
            sequence: UInt64,
            _ body: (UnsafeRawBufferPointer) -> Value
        ) -> Value {
            withSenderBytes { sender in
                payload.withUnsafeBytes { payload in
                    let size = MailboxFormat.recordSize(senderSize: sender.count, payloadSize: payload.count)
                    return withUnsafeTemporaryAllocation(byteCount: size, alignment: 16) { buffer in
                        MailboxFormat.encodeRecord(
                            sequence: sequence,
                            timestampNanoseconds: timestampNanoseconds,
                            isCleared: isCleared,
                            sender: sender,
                            payload: payload,
                            into: buffer.baseAddress!
                        )
                        return body(UnsafeRawBufferPointer(buffer))
                    }
                }
            }
        }
    }

    /// The identifiers that have a mailbox file, empty or not.
    func mailboxFileIdentifiers() throws(WormholeError) -> [String] {
        try handle.entries().compactMap { name in
            guard name.hasSuffix(MailboxFormat.fileSuffix) else { return nil }
            let identifier = String(name.dropLast(MailboxFormat.fileSuffix.count))
            return MessageIdentifier.isValid(identifier) ? identifier : nil
        }.sorted()
    }

    // MARK: Waking listeners

    /// Creates the mailbox file of `identifier` holding no message, unless there is a file of that name: listeners
    /// watch the mailbox file, whose writes are what wake them (`FORMAT.md`, "Notifications").
    ///
    /// Both slots are empty; the first message replaces the file whole, as a new mailbox's does, so that no reader
    /// ever meets it half written with nothing else to fall back on. A file made meanwhile by another process is
    /// kept. Returns why the file could not be made, or nil when there is one now.
    @discardableResult
    package func createEmptyMailbox(identifier: String) -> Errno? {
        let name = Self.fileName(identifier)
        if case .success = handle.status(ofEntry: name) { return nil }
        let header = MailboxFormat.Header(
            slotCapacity: MailboxFormat.minimumSlotCapacity,
            generation: UInt64.random(in: 1...UInt64.max)
        )
        switch handle.createFile(
            named: name,
            bytes: MailboxFormat.encodeEmptyFile(header: header),
            replacing: false,
            synchronize: options.synchronizesWrites
        ) {
        case .success, .failure(.fileExists): return nil
        case .failure(let errno): return errno
        }
    }

    /// What a poller of the mailbox `identifier` compares from one poll to the next: the file's header and the heads
    /// of its two slots, which hold each record's checksum and sequence; nil when there is no file to read.
    ///
    /// Every pass and every clearing writes a slot head, and a replaced file has a new generation or sequence, so the
    /// token changes with each of them; reading the heads costs the same whatever the message's size. They are read
    /// under a shared lock, so never while a writer is copying a record behind its new head; while a writer holds
    /// the lock, the token is fresh bytes, so that the listener is woken and the next poll looks again.
    /// A file that cannot be opened for another reason than not being there (a planted link, no permission) gives
    /// fresh bytes, so that the listener reads the mailbox and reports why.
    func changeToken(identifier: String) -> [UInt8]? {
        do {
            let file = try handle.openFile(named: Self.fileName(identifier), flags: O_RDONLY)
            return Self.changeToken(of: file.descriptor)
        } catch .noSuchFileOrDirectory {
            return nil
        } catch {
            return PollingMonitor.freshToken()
        }
    }

    private static func changeToken(of file: Descriptor) -> [UInt8]? {
        // Suspended, or locked by a writer: fresh bytes, and the listener reads the mailbox (reads take no lock).
        guard SuspensionGate.enter() else { return PollingMonitor.freshToken() }
        defer { SuspensionGate.leave() }
        guard file.tryLockShared() else { return PollingMonitor.freshToken() }
        defer { file.unlock() }
        guard case .success(var token) = file.read(count: MailboxFormat.headerSize, at: 0) else { return nil }
        if case .success(let header) = MailboxFormat.decodeHeader(token[...]) {
            for slot in 0..<2 {
                let head = file.read(count: MailboxFormat.recordHeaderSize, at: header.slotOffset(slot))
                if case .success(let bytes) = head { token += bytes }
            }
        }
        return token
    }

    // MARK: Writing

    /// Stores `outgoing` with the next sequence, under the file's exclusive lock.
    ///
    /// Returns the stored record's sequence and the mailbox's generation, or nil when the mailbox did not exist (or
    /// was already empty) and `createIfMissing` is false.
    private func update(
        identifier: String,
        createIfMissing: Bool,
        outgoing: Outgoing
    ) throws(WormholeError) -> Stored? {
        let entry = openFiles.entry(identifier)
        let name = entry.name
        return try SuspensionGate.withPermit(toDo: "write the mailbox", identifier: identifier) {
            () throws(WormholeError) -> Stored? in
            try update(
                entry: entry,
                name: name,
                identifier: identifier,
                createIfMissing: createIfMissing,
                outgoing: outgoing
            )
        }
    }

    private func update(
        entry: OpenFileCache.Entry,
        name: String,
        identifier: String,
        createIfMissing: Bool,
        outgoing: Outgoing
    ) throws(WormholeError) -> Stored? {
        try entry.descriptor.withLock { (cached) throws(WormholeError) -> Stored? in
            // A few rounds at most: each retry means another process created or replaced the file meanwhile.
            for _ in 0..<1000 {
                if cached < 0 {
                    do throws(Errno) {
                        cached = try handle.openFile(named: name, flags: O_RDWR).release()
                        entry.opened()
                    } catch .noSuchFileOrDirectory {
                        guard createIfMissing else { return nil }
                        if let created = try create(name: name, identifier: identifier, outgoing: outgoing) {
                            return created
                        }
                        continue  // another process created it first: write into theirs
                    } catch {
                        throw openError(error, identifier: identifier)
                    }
                }
                let file = Descriptor(rawValue: cached)
                do throws(WormholeError) {
                    try file.lock(
                        exclusive: true,
                        waitingAtMost: options.lockWaitLimit,
                        toDo: "lock the mailbox file",
                        identifier: identifier,
                        path: handle.filePath(name)
                    )
                } catch {
                    // A descriptor that cannot be locked at all is not kept; one whose holder is stuck is.
                    if error.code != .timedOut { closeCached(&cached) }
                    throw error
                }
                let outcome: Result<(stored: Stored?, replaced: Bool)?, WormholeError>
                do throws(WormholeError) {
                    // The file may have been replaced or removed while this process waited for the lock.
                    if let status = try handle.trustedStatus(of: file, name: name, identifier: identifier) {
                        outcome = .success(
                            try update(
                                locked: file,
                                size: status.size,
                                name: name,
                                identifier: identifier,
                                createIfMissing: createIfMissing,
                                outgoing: outgoing
                            )
                        )
                    } else {
                        outcome = .success(nil)
                    }
                } catch {
                    outcome = .failure(error)
                }
                // Unlock before closing: once closed, the descriptor's number may belong to another open file.
                file.unlock()
                switch outcome {
                case .success(nil):
                    closeCached(&cached)
                case .success(let done?):
                    if done.replaced { closeCached(&cached) }
                    return done.stored
                case .failure(let error):
                    closeCached(&cached)
                    throw error
                }
            }
            throw keptBeingReplaced(identifier)
        }
    }

    /// A stored record's sequence, and its mailbox's generation.
    private typealias Stored = (sequence: UInt64, generation: UInt64)

    /// Creates a new mailbox holding its first record; nil when another process created it first.
    private func create(name: String, identifier: String, outgoing: Outgoing) throws(WormholeError) -> Stored? {
        let record = outgoing.record(sequence: 1)
        let header = MailboxFormat.Header(
            slotCapacity: MailboxFormat.slotCapacity(forRecordSize: record.encodedSize),
            generation: UInt64.random(in: 1...UInt64.max)
        )
        switch handle.createFile(
            named: name,
            bytes: MailboxFormat.encodeFile(header: header, record: record),
            replacing: false,
            synchronize: options.synchronizesWrites
        )
        {
        case .success: return (record.sequence, header.generation)
        case .failure(.fileExists): return nil
        case .failure(let errno):
            throw WormholeError.fileSystem(
                errno,
                "create the mailbox file",
                identifier: identifier,
                path: handle.filePath(name)
            )
        }
    }

    /// Stores the next record in a locked file. `replaced` says the file was replaced by a new one, so that the
    /// cached descriptor is stale.
    private func update(
        locked file: Descriptor,
        size: Int,
        name: String,
        identifier: String,
        createIfMissing: Bool,
        outgoing: Outgoing
    ) throws(WormholeError) -> (stored: Stored?, replaced: Bool) {
        // What a writer needs of the file: its header, and the slot and sequence of its newest valid record.
        let found = try withNewestRecord(of: file, size: size, identifier: identifier) { found in
            found.map { found in
                (header: found.header, newest: found.newest.map { (slot: $0.slot, record: $0.record) })
            }
        }
        let contents: (header: MailboxFormat.Header, newest: (slot: Int, record: MailboxFormat.RecordView)?)
        switch found {
        case .success(let decoded):
            contents = decoded
        case .failure(.header(.unsupportedVersion(let version))):
            // A newer writer's file is not damaged: replacing it would lose its message for the processes that read
            // that version. Say so, and keep it.
            throw MailboxFormat.error(
                for: .header(.unsupportedVersion(version)),
                identifier: identifier,
                path: handle.filePath(name)
            )
        case .failure:
            // A damaged file holds nothing to keep: replace it with a fresh mailbox of a new generation, so
            // listeners accept the new message whatever sequence the damaged file claimed.
            guard createIfMissing else {
                if case .failure(let errno) = handle.removeFile(named: name) {
                    throw WormholeError.fileSystem(
                        errno,
                        "remove the damaged mailbox file",
                        identifier: identifier,
                        path: handle.filePath(name)
                    )
                }
                if options.synchronizesWrites, case .failure(let errno) = handle.synchronizeEntries() {
                    throw WormholeError.fileSystem(
                        errno,
                        "flush the directory",
                        identifier: identifier,
                        path: handle.path
                    )
                }
                return (nil, true)
            }
            let record = outgoing.record(sequence: 1)
            let header = MailboxFormat.Header(
                slotCapacity: MailboxFormat.slotCapacity(forRecordSize: record.encodedSize),
                generation: UInt64.random(in: 1...UInt64.max)
            )
            try replace(name: name, identifier: identifier, header: header, record: record)
            return ((record.sequence, header.generation), true)
        }
        if !createIfMissing, contents.newest == nil || contents.newest?.record.isCleared == true { return (nil, false) }
        let sequence = (contents.newest?.record.sequence ?? 0) + 1
        let header = contents.header
        guard outgoing.encodedSize <= header.slotCapacity, contents.newest != nil else {
            // A new file, same generation, renamed into place: for a message that outgrew the slots (larger ones),
            // and for the first record of a file that holds none (a listener's, made empty), which must arrive whole,
            // as a new mailbox's first message does: written in place, a reader could meet it half written with no
            // other record to keep.
            let record = outgoing.record(sequence: sequence)
            let grown = MailboxFormat.Header(
                slotCapacity: max(header.slotCapacity, MailboxFormat.slotCapacity(forRecordSize: record.encodedSize)),
                generation: header.generation
            )
            try replace(name: name, identifier: identifier, header: grown, record: record)
            return ((sequence, header.generation), true)
        }
        let slot = contents.newest.map { 1 - $0.slot } ?? 0
        let written = outgoing.withEncodedBytes(sequence: sequence) { file.write($0, at: header.slotOffset(slot)) }
        if case .failure(let errno) = written {
            throw WormholeError.fileSystem(
                errno,
                "write the message",
                identifier: identifier,
                path: handle.filePath(name)
            )
        }
        if options.synchronizesWrites, case .failure(let errno) = file.synchronize() {
            throw WormholeError.fileSystem(
                errno,
                "flush the message to disk",
                identifier: identifier,
                path: handle.filePath(name)
            )
        }
        return ((sequence, header.generation), false)
    }

    private func replace(
        name: String,
        identifier: String,
        header: MailboxFormat.Header,
        record: MailboxFormat.Record
    ) throws(WormholeError) {
        let bytes = MailboxFormat.encodeFile(header: header, record: record)
        if case .failure(let errno) = handle.createFile(
            named: name,
            bytes: bytes,
            replacing: true,
            synchronize: options.synchronizesWrites
        ) {
            throw WormholeError.fileSystem(
                errno,
                "replace the mailbox file",
                identifier: identifier,
                path: handle.filePath(name)
            )
        }
    }

    // MARK: Reading

    /// Finds the newest valid record of a mailbox file (``MailboxFormat/withNewestRecord(size:read:_:)``).
    private func withNewestRecord<Value>(
        of file: Descriptor,
        size: Int,
        identifier: String,
        _ body: (Result<MailboxFormat.Found, MailboxFormat.FileProblem>) throws(WormholeError) -> Value
    ) throws(WormholeError) -> Value {
        try MailboxFormat.withNewestRecord(size: size) { (buffer, offset) throws(WormholeError) in
            try read(file, into: buffer, at: offset, once: false, identifier: identifier)
        } _: { (found) throws(WormholeError) in
            try body(found)
        }
    }

    /// Fills `buffer` from `offset` of a mailbox file (with one `pread` when `once`); returns the bytes read, fewer
    /// at the file's end.
    private func read(
        _ file: Descriptor,
        into buffer: UnsafeMutableRawBufferPointer,
        at offset: Int,
        once: Bool,
        identifier: String
    ) throws(WormholeError) -> Int {
        let read =
            once
            ? file.read(into: buffer.baseAddress!, count: buffer.count, at: UInt64(offset))
            : file.read(filling: buffer, at: offset)
        switch read {
        case .success(let count): return count
        case .failure(let errno):
            throw WormholeError.fileSystem(
                errno,
                "read the mailbox file",
                identifier: identifier,
                path: handle.filePath(Self.fileName(identifier))
            )
        }
    }

    private func openError(_ errno: Errno, identifier: String) -> WormholeError {
        let path = handle.filePath(Self.fileName(identifier))
        if errno == .tooManySymbolicLinkLevels {
            return WormholeError(
                .untrustedFile,
                "The mailbox file is a symbolic link, which a wormhole never follows; someone planted it. Remove it.",
                identifier: identifier,
                path: path,
                underlyingError: errno
            )
        }
        return WormholeError.fileSystem(errno, "open the mailbox file", identifier: identifier, path: path)
    }
}
