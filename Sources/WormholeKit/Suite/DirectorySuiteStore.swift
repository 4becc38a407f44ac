import Foundation
import SystemPackage

/// A suite in a directory: one file, `NAME.suite`, an append-only log of checksummed records (``SuiteLogFormat``):
/// a snapshot of every value, then one record per update with only the keys it changed. Observers are woken by the
/// directory's notifier (`suite.NAME`).
///
/// Each store keeps the suite's values in memory and reads only what other processes appended since its last read,
/// so that an update costs in proportion to the keys it changes: take the file's lock, read the new records, apply
/// the update, append one record, let go. (The file's lock is tried without waiting under the store's own lock; a
/// lock another process holds is waited for outside it, so that this process's reads go on meanwhile.) When the records after the snapshot outgrow it, the writer compacts the
/// file (the last changes as history, then a new snapshot) and renames it into place; every process notices the
/// rename (the old file has no link left) and reads the new file once. A version 1 file (a JSON document in the
/// mailbox format) is read as it is and rewritten as a log by the first update.
final class DirectorySuiteStore: SuiteStore {
    let name: String
    let files: FileTransiting
    let notifier: any Notifier
    let fileName: String
    var notificationName: String { "suite." + name }
    /// How many changes the file keeps for observers to catch up with, as history after a compaction.
    static let logLimit = 64
    /// A log is compacted once the records after its snapshot take more than this many bytes and more than the
    /// snapshot itself: compaction costs in proportion to the suite, and comes once per as many bytes of updates.
    static let minimumCompactionBytes = 64 << 10

    private let state = Locked(LogState())

    /// What this process knows of the file: its descriptor, how far it was read, and the values at that point.
    private struct LogState {
        var descriptor: Int32 = -1
        var writable = false
        /// The end of the last record read; 0 before the header was read.
        var offset = 0
        /// Where the records after the snapshot start.
        var snapshotEnd = 0
        var version: UInt64 = 0
        /// The file's generation: drawn for each new suite, kept by compaction.
        var generation: UInt64 = 0
        var values = SuiteValues()
        /// The last changes, oldest first, at most `logLimit`.
        var log: [SuiteChange] = []
        /// With synchronizesWrites: whether the directory was flushed since this file was opened.
        var directoryFlushed = false
        /// After a failed compaction, the end of the file from which the next one is tried.
        var compactionRetryOffset = 0

        mutating func reset() {
            let (descriptor, writable) = (self.descriptor, self.writable)
            self = LogState()
            (self.descriptor, self.writable) = (descriptor, writable)
        }

        mutating func record(_ change: SuiteChange) {
            log.append(change)
            if log.count > DirectorySuiteStore.logLimit { log.removeFirst(log.count - DirectorySuiteStore.logLimit) }
        }
    }

    init(name: String, files: FileTransiting, notifier: any Notifier) throws(WormholeError) {
        try MessageIdentifier.validate(name)
        self.name = name
        self.files = files
        self.notifier = notifier
        self.fileName = name + ".suite"
    }

    deinit {
        state.withLock { if $0.descriptor >= 0 { closeCached(&$0.descriptor) } }
    }

    private var handle: DirectoryHandle { files.handle }
    private var path: String { handle.filePath(fileName) }

    // MARK: SuiteStore

    func read() throws(WormholeError) -> SuiteState {
        try state.withLock { (state) throws(WormholeError) in
            try refresh(&state, forWriting: false)
            return SuiteState(version: state.version, values: state.values, lineage: state.generation)
        }
    }

    func changes(after version: UInt64) throws(WormholeError) -> (state: SuiteState, changes: [SuiteChange]?) {
        try state.withLock { (state) throws(WormholeError) in
            try refresh(&state, forWriting: false)
            let current = SuiteState(version: state.version, values: state.values, lineage: state.generation)
            guard state.version > version else { return (current, []) }
            let logged = state.log.drop { $0.version <= version }
            // Every change, none missing: a version 1 file's log may end before its version.
            guard logged.first?.version == version + 1, logged.last?.version == state.version,
                UInt64(logged.count) == state.version - version
            else { return (current, nil) }
            return (current, Array(logged))
        }
    }

    func update(
        sender: String,
        direction: String?,
        _ body: (inout SuiteValues) throws(WormholeError) -> Void
    ) throws(WormholeError) -> SuiteChange? {
        // The file's lock is held while `body` runs: so is a permit, so that a suspended process takes no lock.
        let (change, flushFailure) = try SuspensionGate.withPermit(toDo: "update the suite", identifier: name) {
            () throws(WormholeError) in try appendLocked(sender: sender, direction: direction, body)
        }
        if change != nil {
            do throws(WormholeError) {
                try notifier.post(notificationName)
            } catch {
                throw WormholeError(
                    error.code,
                    "The update is made, but other processes were not told of it (they will see it at their next "
                        + "read or notification): \(error.message)",
                    identifier: name,
                    path: error.path,
                    underlyingError: error
                )
            }
        }
        // The update is made and other processes are told; only its durability failed.
        if let flushFailure { throw flushFailure }
        return change
    }

    /// Takes the suite file's lock (waiting for another process's outside this process's lock), runs `body` and
    /// appends its change under it.
    private func appendLocked(
        sender: String,
        direction: String?,
        _ body: (inout SuiteValues) throws(WormholeError) -> Void
    ) throws(WormholeError) -> (change: SuiteChange?, flushFailure: WormholeError?) {
        var outcome: (change: SuiteChange?, flushFailure: WormholeError?)?
        while outcome == nil {
            // The file's lock is taken without waiting under this process's lock: while another process holds it,
            // the wait happens outside, on a copy of the descriptor, so that this process's reads go on meanwhile.
            let busy = try state.withLock { (state) throws(WormholeError) -> Descriptor? in
                guard try refresh(&state, forWriting: true) else {
                    // A copy closed on exec, as every descriptor of the package: a child that inherited it would hold
                    // the lock.
                    switch Descriptor(rawValue: state.descriptor).duplicate() {
                    case .success(let copy): return copy
                    case .failure(let errno):
                        throw WormholeError.fileSystem(
                            errno,
                            "duplicate the suite's descriptor",
                            identifier: name,
                            path: path
                        )
                    }
                }
                let file = Descriptor(rawValue: state.descriptor)
                defer { file.unlock() }
                outcome = try append(to: &state, file: file, sender: sender, direction: direction, body)
                return nil
            }
            if let busy { try waitForLock(busy) }
        }
        return outcome!
    }

    func observe(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        try notifier.observe(notificationName, handler: handler)
    }

    /// Waits, holding no lock of this process, until the process that holds the suite file's lock lets it go; `copy`
    /// (a duplicate of the cached descriptor, closed here) shares its open file, so the lock taken here is the one
    /// the next try under this process's lock finds held (a file replaced meanwhile is locked afresh then).
    ///
    /// The wait has a limit (``FileTransiting/Options/lockWaitLimit``): a holder stopped while it holds the lock
    /// makes the update fail with ``WormholeError/Code/timedOut``, with nothing written.
    private func waitForLock(_ copy: Descriptor) throws(WormholeError) {
        defer { copy.close() }
        // Kept once taken: the next try, on the same open file, finds it this process's.
        try copy.lock(
            exclusive: true,
            waitingAtMost: files.options.lockWaitLimit,
            toDo: "lock the suite",
            identifier: name,
            path: path
        )
    }

    // MARK: Writing

    /// Runs `body` on the values and appends its change, in the locked file. Returns the change (nil when none),
    /// and the error of flushing it to the disk when that alone failed: the change is in the file then.
    private func append(
        to state: inout LogState,
        file: Descriptor,
        sender: String,
        direction: String?,
        _ body: (inout SuiteValues) throws(WormholeError) -> Void
    ) throws(WormholeError) -> (SuiteChange?, WormholeError?) {
        // The body works on a copy that keeps its changes apart from the values it shares with the state, so that
        // nothing compares or copies every key, and a failed update leaves the state as it was.
        var (values, update) = state.values.updateCopy()
        try body(&values)
        let entries: [(key: String, value: Data?)]
        if let changes = values.changes(ofUpdate: update) {
            entries = changes
        } else {
            entries = state.values.differences(to: values)  // the body replaced the whole value
        }
        values = SuiteValues()  // let go of the state's values, so that they are changed in place below
        guard !entries.isEmpty else { return (nil, nil) }
        for (what, text) in [("sender", sender), ("direction", direction ?? "")] where text.utf8.count > 65_534 {
            throw WormholeError(
                .encodingFailed,
                "A \(what) of \(text.utf8.count) bytes: a suite change's \(what) is at most 65,534 bytes of UTF-8.",
                identifier: name
            )
        }
        try checkSizes(
            entries.lazy.map { ($0.key, $0.value?.count ?? 0) },
            fixedSize: sender.utf8.count + (direction?.utf8.count ?? 0),
            // A reader refuses a larger record whatever the wormhole's limit.
            limit: min(
                files.options.maximumMessageSize,
                SuiteLogFormat.recordHeaderSize + SuiteLogFormat.maximumBodySize
            )
        )
        let record = SuiteLogFormat.Record(
            kind: .change,
            version: state.version + 1,
            timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
            sender: sender,
            direction: direction,
            entries: entries
        )
        var bytes: [UInt8] = []
        SuiteLogFormat.encode(record, appendingTo: &bytes)
        if case .failure(let errno) = file.write(bytes, at: state.offset) {
            // A part written (the disk filled up, say) is cut off, so that the next record follows the last one.
            _ = ftruncate(file.rawValue, off_t(state.offset))
            throw WormholeError.fileSystem(errno, "append to the suite", identifier: name, path: path)
        }
        state.values.apply(entries)
        state.version += 1
        state.offset += bytes.count
        let change = SuiteChange(record)
        state.record(change)
        let flushFailure = flush(&state, file: file)
        // Compacted once the records after the snapshot outweigh what a compaction writes (the history it keeps
        // and the snapshot), so that its cost stays in proportion to the bytes the updates appended.
        let rewritten = max(Self.minimumCompactionBytes, state.snapshotEnd - SuiteLogFormat.headerSize)
        if state.offset - state.snapshotEnd > rewritten, state.offset >= state.compactionRetryOffset {
            do throws(WormholeError) {
                // (With synchronizesWrites, the directory is flushed anew once the new file is opened.)
                try replaceFile(
                    version: state.version,
                    values: state.values,
                    log: state.log,
                    generation: state.generation
                )
            } catch {
                // The update is made either way. A failure that lasts (a full disk, a snapshot over the limit) is
                // tried again only once as many bytes more are appended, so that not every update pays for it.
                state.compactionRetryOffset = state.offset + rewritten
            }
        }
        return (change, flushFailure)
    }

    /// With `synchronizesWrites`: flushes the file, and once per opened file the directory, whose entry names the
    /// file (another process may have created or compacted it and not flushed the directory yet).
    private func flush(_ state: inout LogState, file: Descriptor) -> WormholeError? {
        guard files.options.synchronizesWrites else { return nil }
        if case .failure(let errno) = file.synchronize() {
            return WormholeError.fileSystem(
                errno,
                "flush the suite (the update is made, but may not survive a power cut)",
                identifier: name,
                path: path
            )
        }
        if !state.directoryFlushed {
            if case .failure(let errno) = handle.synchronizeEntries() {
                return WormholeError.fileSystem(
                    errno,
                    "flush the suite's directory (the update is made, but may not survive a power cut)",
                    identifier: name,
                    path: handle.path
                )
            }
            state.directoryFlushed = true
        }
        return nil
    }

    /// Refuses keys longer than a record can hold, and a record larger than `limit` bytes (`fixedSize`: its sender
    /// and direction).
    private func checkSizes(
        _ entries: some Sequence<(key: String, valueSize: Int)>,
        fixedSize: Int = 0,
        limit: Int
    ) throws(WormholeError) {
        var total = SuiteLogFormat.recordHeaderSize + SuiteLogFormat.bodyPrefixSize + fixedSize
        for (key, valueSize) in entries {
            let keySize = key.utf8.count
            guard keySize <= Int(UInt16.max) else {
                throw WormholeError(
                    .encodingFailed,
                    "A key of \(keySize) bytes: a suite's keys are at most 65,535 bytes of UTF-8.",
                    identifier: name
                )
            }
            total += 6 + keySize + valueSize
        }
        guard total <= limit else {
            throw WormholeError(
                .messageTooLarge,
                "The update would take \(total) bytes; the limit is \(limit) (maximumMessageSize).",
                identifier: name
            )
        }
    }

    /// Writes the suite as a new file (its last changes as history, then a snapshot) and renames it into place,
    /// under the old file's lock: other processes notice that the old file lost its name, and read the new one.
    /// `generation`: the file's, kept by a compaction; a new one for a file of another history.
    private func replaceFile(
        version: UInt64,
        values: SuiteValues,
        log: [SuiteChange],
        generation: UInt64
    ) throws(WormholeError) {
        // A snapshot larger than a reader accepts would make the suite unreadable: the log is left as it is then.
        let storage = values.storage
        try checkSizes(storage.lazy.map { ($0.key, $0.value.count) }, limit: SuiteLogFormat.maximumBodySize)
        var bytes = SuiteLogFormat.encodeHeader(generation: generation)
        for change in log {
            SuiteLogFormat.encode(
                SuiteLogFormat.Record(
                    kind: .history,
                    version: change.version,
                    timestampNanoseconds: change.timestampNanoseconds,
                    sender: change.sender,
                    direction: change.direction,
                    entries: change.keys.sorted().map { ($0, change.values.json(forKey: $0)) }
                ),
                appendingTo: &bytes
            )
        }
        SuiteLogFormat.encode(
            SuiteLogFormat.Record(
                kind: .snapshot,
                version: version,
                timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
                sender: "",
                direction: nil,
                entries: storage.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
            ),
            appendingTo: &bytes
        )
        if case .failure(let errno) = handle.createFile(
            named: fileName,
            bytes: bytes,
            replacing: true,
            synchronize: files.options.synchronizesWrites
        ) {
            throw WormholeError.fileSystem(errno, "rewrite the suite", identifier: name, path: path)
        }
    }

    /// A new, empty suite file; false when another process created one first.
    private func createEmptyFile() throws(WormholeError) -> Bool {
        var bytes = SuiteLogFormat.encodeHeader(generation: UInt64.random(in: 1...UInt64.max))
        SuiteLogFormat.encode(
            SuiteLogFormat.Record(
                kind: .snapshot,
                version: 0,
                timestampNanoseconds: ProcessFacts.wallClockNanoseconds(),
                sender: "",
                direction: nil,
                entries: []
            ),
            appendingTo: &bytes
        )
        switch handle.createFile(
            named: fileName,
            bytes: bytes,
            replacing: false,
            synchronize: files.options.synchronizesWrites
        ) {
        case .success: return true
        case .failure(.fileExists): return false
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "create the suite", identifier: name, path: path)
        }
    }

    // MARK: Reading

    /// Brings `state` up to the end of the file that has the suite's name now. With `forWriting`, creates the file
    /// when missing, and returns with it locked (the caller unlocks), a version 1 file rewritten as a log and a tail
    /// torn by a writer that died (or by a power cut) cut off; or returns false, having waited for nothing, when
    /// another open file of the suite holds the lock (another process's, or another store's of this one): the caller
    /// waits for it without holding `state`, then tries again.
    @discardableResult
    private func refresh(_ state: inout LogState, forWriting: Bool) throws(WormholeError) -> Bool {
        // A few rounds at most: each retry means another process created or replaced the file meanwhile.
        for _ in 0..<1000 {
            if state.descriptor < 0 || (forWriting && !state.writable) {
                if state.descriptor >= 0 { closeCached(&state.descriptor) }
                state.reset()
                guard try open(&state, forWriting: forWriting) else {
                    if forWriting {
                        _ = try createEmptyFile()
                        continue
                    }
                    return true  // no file: an empty suite at version 0
                }
            }
            let file = Descriptor(rawValue: state.descriptor)
            if forWriting {
                switch file.tryLockExclusive() {
                case .success(true): break
                case .success(false): return false
                case .failure(let errno):
                    closeCached(&state.descriptor)
                    throw WormholeError.fileSystem(errno, "lock the suite", identifier: name, path: path)
                }
            }
            do throws(WormholeError) {
                guard let status = try handle.trustedStatus(of: file, name: fileName, identifier: name) else {
                    // Replaced (compacted, rewritten) or removed: read the file that has the name now.
                    if forWriting { file.unlock() }
                    closeCached(&state.descriptor)
                    continue
                }
                if try readRecords(&state, file: file, size: status.size, forWriting: forWriting) { return true }
                // A version 1 file, rewritten as a log under its lock: read the new file.
                file.unlock()
                closeCached(&state.descriptor)
            } catch {
                if forWriting { file.unlock() }
                closeCached(&state.descriptor)
                state.reset()
                throw error
            }
        }
        throw WormholeError(
            .ioFailure,
            "The suite file kept being replaced while this process opened it.",
            identifier: name,
            path: path
        )
    }

    /// Opens the file; false when there is none. A directory shared read-only with this user is read without
    /// writing.
    private func open(_ state: inout LogState, forWriting: Bool) throws(WormholeError) -> Bool {
        do throws(Errno) {
            do {
                state.descriptor = try handle.openFile(named: fileName, flags: O_RDWR).release()
                state.writable = true
            } catch .permissionDenied where !forWriting {
                state.descriptor = try handle.openFile(named: fileName, flags: O_RDONLY).release()
                state.writable = false
            }
            return true
        } catch .noSuchFileOrDirectory {
            return false
        } catch .tooManySymbolicLinkLevels {
            throw WormholeError(
                .untrustedFile,
                "The suite file is a symbolic link, which a wormhole never follows; someone planted it. Remove it.",
                identifier: name,
                path: path
            )
        } catch {
            throw WormholeError.fileSystem(error, "open the suite", identifier: name, path: path)
        }
    }

    /// Reads the records from `state.offset` to `size`. Returns false when the file was a version 1 document that
    /// this call (writing) rewrote as a log.
    private func readRecords(
        _ state: inout LogState,
        file: Descriptor,
        size: Int,
        forWriting: Bool,
        rechecking: Bool = false
    ) throws(WormholeError) -> Bool {
        if state.offset == 0 && size < 8 { throw damaged("it holds \(size) bytes, too few for its header") }
        guard size > state.offset else {
            if size < state.offset { throw damaged("it is shorter than what was read from it before") }
            return true
        }
        let bytes: [UInt8]
        switch file.read(count: size - state.offset, at: state.offset) {
        case .success(let read): bytes = read
        case .failure(let errno): throw WormholeError.fileSystem(errno, "read the suite", identifier: name, path: path)
        }
        var position = 0
        if state.offset == 0 {
            switch SuiteLogFormat.decodeHeader(bytes[...]) {
            case .success(.documentFile):
                try readDocument(&state, file: file, size: size)
                guard forWriting else { return true }
                // The version 1 file's history goes on: the same lineage as the state read from it.
                try replaceFile(
                    version: state.version,
                    values: state.values,
                    log: state.log,
                    generation: state.generation
                )
                return false
            case .success(.log(let generation)):
                position = SuiteLogFormat.headerSize
                state.generation = generation
            case .failure(.unsupportedVersion(let version)):
                throw WormholeError(
                    .unsupportedFormatVersion,
                    "The suite file has format version \(version); this build reads versions 1 and "
                        + "\(SuiteLogFormat.version). Update WormholeKit in every process of the group.",
                    identifier: name,
                    path: path
                )
            case .failure(let problem):
                throw damaged("its header is damaged (\(problem))")
            }
        }
        let whole = bytes[...]
        while position < bytes.count {
            switch SuiteLogFormat.parse(whole, at: position) {
            case .record(let record, let recordSize):
                try apply(record, to: &state, end: state.offset + position + recordSize, size: recordSize)
                position += recordSize
            case .incomplete, .invalid:
                if SuiteLogFormat.validRecordFollows(whole, after: position) {
                    // A reader takes no lock: before calling it damage, it reads the bytes once more, in case it
                    // read them while a writer's append was half copied.
                    guard forWriting || rechecking else {
                        state.offset += position
                        guard case .success(let status) = file.status() else { return true }
                        return try readRecords(
                            &state,
                            file: file,
                            size: status.size,
                            forWriting: false,
                            rechecking: true
                        )
                    }
                    throw damaged("a record at byte \(state.offset + position) is damaged")
                }
                // A record being written by another process (a reader waits for it), or one left torn by a writer
                // that died or by a power cut: the writer, holding the lock, cuts it off.
                if forWriting {
                    if case .failure(let errno) = valueOrErrno({
                        ftruncate(file.rawValue, off_t(state.offset + position))
                    }) {
                        throw WormholeError.fileSystem(errno, "cut a torn update off the suite", path: path)
                    }
                }
                state.offset += position
                return true
            }
        }
        state.offset += position
        return true
    }

    private func apply(
        _ record: SuiteLogFormat.Record,
        to state: inout LogState,
        end: Int,
        size: Int
    ) throws(WormholeError) {
        switch record.kind {
        case .history:
            if record.version > (state.log.last?.version ?? 0) { state.record(SuiteChange(record)) }
        case .snapshot:
            var storage: [String: Data] = [:]
            storage.reserveCapacity(record.entries.count)
            for (key, value) in record.entries { storage[key] = value }
            state.values = SuiteValues(storage: storage)
            state.version = record.version
            state.snapshotEnd = end
        case .change:
            guard record.version == state.version + 1 else {
                throw damaged(
                    "its log goes from version \(state.version) to \(record.version) at byte \(end - size)"
                )
            }
            let change = SuiteChange(record)
            state.values.apply(change)
            state.version = record.version
            state.record(change)
        }
    }

    /// Reads a version 1 file: a JSON document in the mailbox format.
    private func readDocument(_ state: inout LogState, file: Descriptor, size: Int) throws(WormholeError) {
        let decoded = try MailboxFormat.decodeFile(size: size) { (count, offset) throws(WormholeError) in
            switch file.read(count: count, at: offset) {
            case .success(let bytes): return bytes
            case .failure(let errno):
                throw WormholeError.fileSystem(errno, "read the suite", identifier: name, path: path)
            }
        }
        let document: SuiteDocument
        switch decoded {
        case .success(let contents):
            state.generation = contents.header.generation
            guard let record = contents.newest?.record, !record.isCleared else {
                document = SuiteDocument()
                break
            }
            do throws(WormholeError) {
                document = try SuiteDocument(decoding: Data(record.payload), suite: name)
            } catch {
                throw damaged(error.message)
            }
        case .failure(let problem):
            let error = MailboxFormat.error(for: problem, identifier: name, path: path)
            throw damaged(error.message, code: error.code)
        }
        state.offset = 0  // read whole again next time: a version 1 writer replaces it in place
        state.version = document.version
        state.values = document.values
        state.log = document.log.map(SuiteChange.init(entry:))
    }

    /// A damaged suite, with its way forward: unlike a mailbox's message, its values are not replaced by the next
    /// write, which would lose every one of them without a word.
    private func damaged(_ what: String, code: WormholeError.Code = .corruptMessage) -> WormholeError {
        WormholeError(
            code,
            "The suite's file is damaged (\(what)), so its values can be neither read nor updated (a power cut "
                + "without synchronizesWrites can leave it so, as can another program). Remove \(path) to start the "
                + "suite over, empty.",
            identifier: name,
            path: path
        )
    }
}

extension SuiteChange {
    /// A change as a log record holds it.
    init(_ record: SuiteLogFormat.Record) {
        var storage: [String: Data] = [:]
        var keys = Set<String>()
        for (key, value) in record.entries {
            keys.insert(key)
            if let value { storage[key] = value }
        }
        self.init(
            version: record.version,
            keys: keys,
            sender: record.sender,
            direction: record.direction,
            timestampNanoseconds: record.timestampNanoseconds,
            values: SuiteValues(storage: storage)
        )
    }
}
