import Foundation
import Logging
import SystemPackage

/// A durable queue in a directory: a lock-free `O_APPEND` log of checksummed records (`IDENTIFIER.queue`) and a
/// position file per consumer (`IDENTIFIER.consumers/NAME`). `FORMAT.md` describes the files.
///
/// Consumers are woken by the log file itself (inotify on it, or polling its size), or, when the directory's
/// notifier is not a ``DirectoryNotifier``, by that notifier's `queue.IDENTIFIER` posts.
final class DirectoryQueueLog: QueueLog {
    let identifier: String
    let retention: Duration
    let directory: DirectoryHandle
    let consumers: DirectoryHandle
    let logName: String
    let sender: [UInt8]
    let logger: Logger
    let wakeSource: WakeSource
    /// Whether an append posts to `wakeSource`'s notifier: a plain flag, so that an append to a log whose consumers
    /// watch the file itself copies no enum or existential.
    private let appendsPost: Bool
    /// The descriptor appends write to (-1 until the first append), and the buffer they encode records into, kept
    /// between appends: one lock per append, and no allocation per message.
    private let appender = Locked<(descriptor: Int32, records: ReusableBuffer)>(
        (-1, ReusableBuffer(capacity: 64 << 10, keepingUpTo: 8 << 20))
    )

    enum WakeSource: Sendable {
        case logFile(DirectoryNotifier.Strategy)
        case notifier(any Notifier)
    }

    var logPath: String { directory.filePath(logName) }

    init(
        directory: DirectoryHandle,
        identifier: String,
        sender: String,
        retention: Duration,
        wakeSource: WakeSource,
        logger: Logger
    ) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        self.identifier = identifier
        self.retention = retention
        self.logName = identifier + ".queue"
        self.directory = directory
        self.consumers = try directory.subdirectory(named: identifier + ".consumers")
        self.sender = Array(sender.utf8.prefix(Int(UInt16.max)))
        self.logger = logger
        self.wakeSource = wakeSource
        if case .notifier = wakeSource { appendsPost = true } else { appendsPost = false }
    }

    deinit {
        appender.withLock { if $0.descriptor >= 0 { Descriptor(rawValue: $0.descriptor).close() } }
    }

    // MARK: Appending

    func append(contentsOf payloads: some Sequence<Data>) throws(WormholeError) {
        let timestamp = ProcessFacts.wallClockNanoseconds()
        let appended = try appender.withLock { (state) throws(WormholeError) -> Bool in
            let records = state.records
            records.removeAll()
            defer { records.shrinkAfterHugeBatch() }
            for payload in payloads {
                try checkSize(payload)
                let size = QueueFormat.recordSize(payloadSize: payload.count, senderSize: sender.count)
                // One write appends a batch whole; Linux writes at most 2 GiB less a page in one call, so a larger
                // batch would be cut, its tail torn.
                guard records.count + size <= Self.maximumBatchSize else {
                    records.removeAll()
                    throw WormholeError(
                        .messageTooLarge,
                        "The batch comes to more than 1 GiB; one append takes up to 1 GiB. Enqueue it in smaller "
                            + "batches.",
                        identifier: identifier
                    )
                }
                let destination = records.append(count: size)
                payload.withUnsafeBytes { payload in
                    sender.withUnsafeBytes { sender in
                        QueueFormat.encode(
                            payload: payload,
                            sender: sender,
                            timestampNanoseconds: timestamp,
                            into: destination
                        )
                    }
                }
            }
            guard records.count > 0 else { return false }
            try write(records.bytes, descriptor: &state.descriptor)
            return true
        }
        // An empty batch appends nothing, and wakes nobody.
        if appended, appendsPost, case .notifier(let notifier) = wakeSource {
            do throws(WormholeError) {
                try notifier.post("queue." + identifier)
            } catch {
                // The records are in the log: an error thrown now would have a caller enqueue them twice.
                logger.warning(
                    "Messages were appended, but the queue's consumers could not be woken; they read them when next woken",
                    metadata: ["queue": "\(identifier)", "error": "\(error)"]
                )
            }
        }
    }

    func synchronizePosition(of consumer: String) throws(WormholeError) {
        // The log first: a position on the disk must never point past the records on it.
        let log = Descriptor(rawValue: try openForReading())
        defer { log.close() }
        if case .failure(let errno) = log.synchronize() {
            throw WormholeError.fileSystem(errno, "flush the queue", identifier: identifier, path: logPath)
        }
        try QueueCursorFile(directory: consumers, name: consumer, create: false).synchronize()
    }

    func append(_ payload: Data) throws(WormholeError) {
        // The batch path on this concrete type, which the compiler specialises for one payload: a producer of single
        // messages pays for no generic iteration through the existential.
        try append(contentsOf: CollectionOfOne(payload))
    }

    private func checkSize(_ payload: Data) throws(WormholeError) {
        guard payload.count + QueueFormat.bodyPrefixSize + sender.count <= QueueFormat.maximumBodySize else {
            throw WormholeError(
                .messageTooLarge,
                "The message is \(payload.count) bytes; a queue accepts up to 64 MiB.",
                identifier: identifier
            )
        }
    }

    /// The most bytes of records one append writes: a batch is one `write`, which Linux cuts at 2 GiB less a page.
    static let maximumBatchSize = 1 << 30

    /// Appends whole records with one write, opening the log on the first append.
    private func write(_ records: UnsafeRawBufferPointer, descriptor: inout Int32) throws(WormholeError) {
        if descriptor < 0 {
            let opened = try openForAppending()
            // The log's name, once, so that a power cut cannot take away a log whose records were flushed; kept
            // open only once that is done, so that a failed flush is tried again with the next append.
            if directory.synchronizes, case .failure(let errno) = directory.synchronizeEntries() {
                Descriptor(rawValue: opened).close()
                throw WormholeError.fileSystem(errno, "flush the queue's directory", path: directory.path)
            }
            descriptor = opened
        }
        // One write: with O_APPEND the kernel puts it at the end, whole, whatever other processes append meanwhile.
        let result = Descriptor(rawValue: descriptor).writeOnce(records)
        let written = (try? result.get()) ?? -1
        guard written == records.count else {
            let errno: Errno = if case .failure(let errno) = result { errno } else { .noSpace }
            Descriptor(rawValue: descriptor).close()
            descriptor = -1
            let action =
                written > 0
                ? "append to the queue (only the first \(written) of \(records.count) bytes were written: the "
                    + "messages before the cut are in the queue, the rest are not)"
                : "append to the queue"
            throw WormholeError.fileSystem(errno, action, identifier: identifier, path: logPath)
        }
        if directory.synchronizes, case .failure(let errno) = Descriptor(rawValue: descriptor).synchronize() {
            throw WormholeError.fileSystem(
                errno,
                "flush the queue (the messages are appended, but may not survive a power cut)",
                identifier: identifier,
                path: logPath
            )
        }
    }

    private func openForAppending() throws(WormholeError) -> Int32 {
        try openLog(flags: O_WRONLY | O_APPEND | O_CREAT)
    }

    func openForReading() throws(WormholeError) -> Int32 {
        try openLog(flags: O_RDONLY | O_CREAT)
    }

    /// Opens the log (created if missing), refusing a planted link or another user's file.
    private func openLog(flags: Int32) throws(WormholeError) -> Int32 {
        let file: OwnedDescriptor
        do {
            file = try directory.openFile(named: logName, flags: flags)
        } catch {
            throw WormholeError.fileSystem(error, "open the queue", identifier: identifier, path: logPath)
        }
        guard try directory.trustedStatus(of: file.descriptor, name: logName, identifier: identifier) != nil else {
            throw WormholeError(
                .ioFailure,
                "The queue file was removed while opening it.",
                identifier: identifier,
                path: logPath
            )
        }
        return file.release()
    }

    // MARK: Consumers

    func openCursor(consumer: String) throws(WormholeError) -> any QueueCursor {
        try DirectoryQueueCursor(log: self, name: consumer)
    }

    func status() throws(WormholeError) -> QueueStatus {
        let reader = try openForReading()
        defer { Descriptor(rawValue: reader).close() }
        let end: UInt64
        switch Descriptor(rawValue: reader).status() {
        case .success(let status): end = UInt64(status.size)
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "inspect the queue", identifier: identifier, path: logPath)
        }
        var result: [QueueStatus.Consumer] = []
        for name in try consumers.entries().sorted() where MessageIdentifier.isValid(name) {
            // Dropped (by another process's reclaiming) or removed since the listing: not a consumer any more.
            guard let cursor = try openConsumerFile(name) else { continue }
            let position = try cursor.read() ?? 0
            var scan = QueueReader(descriptor: reader, position: position)
            var pending = 0
            while let item = try scan.next() {
                pending += 1
                scan.advance(to: item.end)
            }
            result.append(.init(name: name, offset: position, lagBytes: end - min(end, position), lagMessages: pending))
        }
        return QueueStatus(identifier: identifier, endOffset: end, consumers: result)
    }

    /// The position file of consumer `name`, or nil when it went since the directory was listed.
    private func openConsumerFile(_ name: String) throws(WormholeError) -> QueueCursorFile? {
        do {
            return try QueueCursorFile(directory: consumers, name: name, create: false)
        } catch  where error.underlyingError as? Errno == .noSuchFileOrDirectory || !consumers.hasEntry(name) {
            return nil
        }
    }

    // MARK: Reclaiming

    func reclaimSpace() throws(WormholeError) {
        let now = Date()
        let reading = OwnedDescriptor(taking: try openForReading())
        var minimum: UInt64?
        for name in try consumers.entries() where MessageIdentifier.isValid(name) {
            guard let cursor = try openConsumerFile(name) else { continue }
            // Not seen within the retention, checked again under the exclusive lock: a running consumer marks itself
            // every quarter of the retention, waiting on a quiet queue or not, and a mark under way is waited for.
            let limit = Double(retention.components.seconds)
            let unseen = { (seen: Date?) in seen.map { now.timeIntervalSince($0) > limit } }
            if unseen(cursor.lastWritten) == true, cursor.takeForDropping(), unseen(cursor.lastWritten) == true {
                _ = consumers.removeFile(named: name)
                logger.warning(
                    "Dropped a queue consumer not seen within the retention",
                    metadata: ["consumer": "\(name)"]
                )
                continue
            }
            var position: UInt64
            do {
                let stored = try cursor.readWithLastRecord()
                position = stored?.offset ?? 0
                // A position the log no longer backs (after a power cut) holds everything back until its consumer
                // comes and starts over: punching under it could take records enqueued since.
                if DirectoryQueueCursor.recoveredPosition(
                    position,
                    last: stored?.last,
                    descriptor: reading.descriptor.rawValue
                ) != nil {
                    position = 0
                }
            } catch {
                // A damaged position stops nobody, but holds everything back: where its consumer stood is unknown, and
                // the messages it still needs must stay until its file is removed (as the error says).
                logger.warning(
                    "A queue consumer's position is damaged; nothing is reclaimed until its file is removed",
                    metadata: ["consumer": "\(name)", "error": "\(error)"]
                )
                position = 0
            }
            minimum = min(minimum ?? position, position)
        }
        guard let minimum, minimum >= 4096 else { return }
        // Punching a hole needs a descriptor open for writing.
        let file: OwnedDescriptor
        do {
            file = try directory.openFile(named: logName, flags: O_WRONLY)
        } catch {
            throw WormholeError.fileSystem(error, "open the queue", identifier: identifier, path: logPath)
        }
        if case .failure(let errno) = file.descriptor.punchHole(length: minimum & ~4095) {
            // Not every file system can punch holes; the queue still works, it only keeps its space.
            logger.debug("Could not reclaim queue space", metadata: ["errno": "\(errno)"])
        }
    }
}

/// A consumer's reader and stored position in a directory queue.
final class DirectoryQueueCursor: QueueCursor, @unchecked Sendable {
    // Used by one reader at a time, as QueueCursor requires: its owner serialises every call. That is also why the
    // properties below skip the run-time exclusivity checks, which cost more than the rest of a small message's read.
    let log: DirectoryQueueLog
    /// The consumer's position file: made again when reclaiming dropped it while this cursor was away.
    @exclusivity(unchecked) private(set) var file: QueueCursorFile
    /// Marks the file as seen while the cursor lives, holding no lock between marks.
    private let heartbeat: QueueHeartbeat
    @exclusivity(unchecked) private var reader: QueueReader
    @exclusivity(unchecked) private var sinceReclaim: UInt64 = 0
    /// The records of the last batch read, in order, by their end: an acknowledgement stores the one it ends with.
    @exclusivity(unchecked) private var lastRead: [(end: UInt64, record: QueueCursorFile.LastRecord)] = []
    /// The last sender read, as bytes and as text: a queue's records mostly come from a few senders, so a record
    /// whose sender is the last one's takes its text with no decoding and no allocation.
    @exclusivity(unchecked) private var lastSender: (bytes: [UInt8], text: String) = ([], "")
    /// The array of the last batch read, refilled in place when its reader let go of it (copy on write tells).
    @exclusivity(unchecked) private var batch: [QueueRecord] = []
    /// The payload of the last single message read, rewritten in place when nothing else holds it: see
    /// ``reusedPayload(copying:)``.
    @exclusivity(unchecked) private var reusablePayload = Data()
    /// The largest payload written in place; larger ones get a `Data` of their own.
    static let largestReusedPayload = 1024

    init(log: DirectoryQueueLog, name: String) throws(WormholeError) {
        self.log = log
        // The mark below takes a lock: refused before the position file is made, so that nothing is left of it.
        guard SuspensionGate.enter() else {
            throw WormholeError.suspended("open the consumer \(name)", identifier: log.identifier)
        }
        defer { SuspensionGate.leave() }
        // Seen from here on, and marked again every quarter of the retention: reclaiming does not drop it. A file
        // dropped just before the mark is made again.
        var opened = try QueueCursorFile(directory: log.consumers, name: name, create: true)
        var attempts = 1
        while try !opened.markSeen(waitingAtMost: QueueCursorFile.reclaimingWaitLimit), attempts < 3 {
            opened = try QueueCursorFile(directory: log.consumers, name: name, create: true)
            attempts += 1
        }
        file = opened
        heartbeat = QueueHeartbeat(file: opened, retention: log.retention)
        let synchronizes = log.directory.synchronizes
        let storedPosition = try file.readWithLastRecord()
        let stored = storedPosition?.offset
        if stored == nil {
            // Registered now: reclaiming waits for this consumer from here on.
            try file.write(0, synchronize: synchronizes)
            if synchronizes, case .failure(let errno) = log.consumers.synchronizeEntries() {
                throw WormholeError.fileSystem(errno, "flush the consumers' directory", path: log.consumers.path)
            }
        }
        let descriptor = try log.openForReading()
        var position = stored ?? 0
        if let recovered = Self.recoveredPosition(position, last: storedPosition?.last, descriptor: descriptor) {
            // The log's descriptor is not this cursor's yet: closed if the write below fails.
            var written = false
            defer { if !written { Descriptor(rawValue: descriptor).close() } }
            log.logger.warning(
                Logger.Message(
                    stringLiteral:
                        "The stored position of a queue consumer does not start a record of the log: the log lost records "
                        + "this consumer had acknowledged (after a power cut without synchronizesWrites). It goes on from "
                        + "a safe position and may get messages again."
                ),
                metadata: [
                    "queue": "\(log.identifier)", "consumer": "\(name)", "stored": "\(position)",
                    "resumesAt": "\(recovered)",
                ]
            )
            position = recovered
            try file.write(position, synchronize: synchronizes)
            written = true
        }
        reader = QueueReader(descriptor: descriptor, position: position)
    }

    /// Where a consumer must resume when its stored position cannot be trusted, or nil when it can.
    ///
    /// A position always ends a record that was read, so after a crash of the process it is at or before the end of
    /// the log, where that record ends. A power cut without `synchronizesWrites` may keep a position and lose the
    /// log's tail, and producers may have appended since, from where the tail began: the position is then past the
    /// end, or in the middle of new records, or even at the start of one. The position file names the record it ends
    /// (its start and timestamp): when that record is not there, which records are new cannot be told, and the
    /// consumer starts over from the oldest record kept. Repeats are possible then; a skipped message is not.
    /// A position stored without its record (by an older version) is trusted when a record starts there.
    static func recoveredPosition(
        _ position: UInt64,
        last: QueueCursorFile.LastRecord?,
        descriptor: Int32
    ) -> UInt64? {
        let log = Descriptor(rawValue: descriptor)
        guard position > 0, case .success(let status) = log.status() else { return nil }
        let size = UInt64(status.size)
        if position > size { return 0 }
        if let last, last.start < position, position - last.start <= UInt64(QueueFormat.maximumBodySize + 64),
            case .success(let bytes) = log.read(count: Int(position - last.start), at: Int(last.start)),
            bytes.count == Int(position - last.start)
        {
            // A magic of zeros is a hole that reclaiming punched under every consumer: the record cannot be read
            // there any more, and a record must start at the position instead.
            if bytes.count >= 4, bytes[...].load(at: 0) as UInt32 != 0 {
                // The whole record, checksum and all: a torn one whose header survived, with new records appended
                // after it, must not pass.
                let parsed = bytes.withUnsafeBytes { QueueFormat.parse($0, at: 0) }
                guard case .record(let record, let size) = parsed, size == bytes.count,
                    record.timestampNanoseconds == last.timestampNanoseconds
                else { return 0 }
                return nil
            }
        }
        // The log may end inside the magic of a record being appended right now: trust what cannot be read yet.
        guard position + 4 <= size, case .success(let header) = log.read(count: 4, at: Int(position)) else {
            return nil
        }
        return header.count == 4 && header[...].load(at: 0) as UInt32 == QueueFormat.magic ? nil : 0
    }

    deinit {
        // A clean stop leaves the position written, not only stored (best effort: it is stored either way).
        try? file.writeStored()
        Descriptor(rawValue: reader.descriptor).close()
    }

    var consumer: String { file.name }

    /// Only with `synchronizesWrites`, whose acknowledgements flush the log and the position; otherwise a call reads
    /// and writes the page cache.
    var callsMayWait: Bool { log.directory.synchronizes }

    var position: UInt64 { reader.position }

    func read(maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
        let start = reader.position
        defer { reader.rewind(to: start) }
        // Emptied first: the last batch's payloads go, so that the one kept for reuse is free again.
        batch.removeAll(keepingCapacity: true)
        // Kept until the next read only when it holds at most one small payload: a batch of large ones would stay in
        // memory while the consumer waits (a handler that threw, a sequence between two elements).
        defer {
            if maximumCount > 1 || batch.contains(where: { $0.payload.count > Self.largestReusedPayload }) {
                batch = []
            }
        }
        // A batch also ends past one read chunk of bytes, so that it stays in the CPU's caches.
        while batch.count < maximumCount, reader.position - start < QueueReader.chunkSize,
            let item = try reader.next()
        {
            if batch.capacity == 0 { batch.reserveCapacity(min(maximumCount, 64)) }
            let (sender, payload) = reader.withParts(of: item) { sender, payload in
                (
                    senderText(sender),
                    maximumCount == 1 && payload.count <= Self.largestReusedPayload
                        ? reusedPayload(copying: payload) : Data(payload)
                )
            }
            batch.append(
                QueueRecord(
                    offset: item.offset,
                    end: item.end,
                    sender: sender,
                    timestampNanoseconds: item.record.timestampNanoseconds,
                    payload: payload
                )
            )
            reader.advance(to: item.end)
        }
        // Overwritten in place rather than emptied and refilled: a batch of one is the common case.
        for (index, record) in batch.enumerated() {
            let entry = (
                end: record.end,
                record: QueueCursorFile.LastRecord(
                    start: record.offset,
                    timestampNanoseconds: record.timestampNanoseconds
                )
            )
            if index < lastRead.count { lastRead[index] = entry } else { lastRead.append(entry) }
        }
        if lastRead.count > batch.count { lastRead.removeLast(lastRead.count - batch.count) }
        return batch
    }

    /// A `Data` holding `bytes`: the one handed out with the last single message, rewritten in place when its handler
    /// kept no copy of it.
    ///
    /// A consumer of single messages then allocates nothing per message (for payloads of 15 bytes or more: `Data` holds
    /// smaller ones inline, with no storage to reuse, and a small one after a larger one lets that storage go). A
    /// handler that keeps the message (or passes it on) holds a reference, and `Data`'s copy on write gives the next
    /// message storage of its own: what a handler keeps never changes.
    private func reusedPayload(copying bytes: UnsafeRawBufferPointer) -> Data {
        if reusablePayload.count != bytes.count { reusablePayload.count = bytes.count }
        if !bytes.isEmpty {
            reusablePayload.withUnsafeMutableBytes {
                $0.baseAddress!.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
            }
        }
        return reusablePayload
    }

    /// The text of a sender's bytes, decoded only when they differ from the last sender's.
    private func senderText(_ bytes: UnsafeRawBufferPointer) -> String {
        let same = lastSender.bytes.withUnsafeBytes { last in
            guard last.count == bytes.count else { return false }
            return bytes.isEmpty || memcmp(last.baseAddress!, bytes.baseAddress!, bytes.count) == 0
        }
        if !same { lastSender = (Array(bytes), String(decoding: bytes, as: UTF8.self)) }
        return lastSender.text
    }

    /// The record of the last batch read that ends at `end` (usually its last one).
    private func lastRecord(endingAt end: UInt64) -> QueueCursorFile.LastRecord? {
        lastRead.last(where: { $0.end == end })?.record
    }

    /// Makes the position file again when reclaiming dropped it: the consumer's process was away (stopped,
    /// suspended) for most of the retention. Records it had not read may have been reclaimed meanwhile.
    private func registerAgain() throws(WormholeError) {
        log.logger.warning(
            Logger.Message(
                stringLiteral:
                    "A queue consumer's position was dropped by reclaiming while its process was away for most of "
                    + "the retention; it is registered again, and messages it had not read may have been reclaimed"
            ),
            metadata: ["queue": "\(log.identifier)", "consumer": "\(file.name)", "retention": "\(log.retention)"]
        )
        let again = try QueueCursorFile(directory: log.consumers, name: file.name, create: true)
        _ = try again.markSeen(waitingAtMost: QueueCursorFile.reclaimingWaitLimit)
        try again.write(reader.position, synchronize: log.directory.synchronizes)
        file = again
        heartbeat.replace(with: again)
    }

    func acknowledge(through end: UInt64) throws(WormholeError) {
        if heartbeat.wasDropped { try registerAgain() }
        let synchronizes = log.directory.synchronizes
        // The records first: a position flushed before the records it passes could outlive them in a power cut.
        if synchronizes, case .failure(let errno) = Descriptor(rawValue: reader.descriptor).synchronize() {
            throw WormholeError.fileSystem(errno, "flush the queue before storing a position", path: log.logPath)
        }
        try file.write(end, last: lastRecord(endingAt: end), synchronize: synchronizes)
        advance(to: end)
    }

    /// Acknowledges through `end`, then reads on: one pass of a consumer, message after message.
    ///
    /// Without `synchronizesWrites` the position is stored (``QueueCursorFile/store(_:last:)``): through a mapping of
    /// the position file where the file system allows it, with no system call per message. With it, as
    /// ``acknowledge(through:)``: written and flushed after the log is.
    func acknowledge(through end: UInt64, thenRead maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
        if log.directory.synchronizes {
            try acknowledge(through: end)
        } else {
            if heartbeat.wasDropped { try registerAgain() }
            try file.store(end, last: lastRecord(endingAt: end))
            advance(to: end)
        }
        return try read(maximumCount: maximumCount)
    }

    /// Moves the reader past an acknowledged position, and reclaims space every 4 MiB.
    private func advance(to end: UInt64) {
        let start = reader.position
        reader.advance(to: end)
        sinceReclaim += end - min(start, end)
        if sinceReclaim > 4 << 20 {
            sinceReclaim = 0
            // The position is stored: a failure to reclaim space is not this acknowledgement's.
            do {
                try log.reclaimSpace()
            } catch {
                log.logger.warning("Could not reclaim queue space", metadata: ["error": "\(error)"])
            }
        }
    }

    func observeAppends(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        switch log.wakeSource {
        case .notifier(let notifier):
            return try notifier.observe("queue." + log.identifier, handler: handler)
        case .logFile(let strategy):
            let path = log.logPath
            let descriptor = reader.descriptor
            let pollSize: @Sendable () -> [UInt8]? = {
                guard case .success(let status) = Descriptor(rawValue: descriptor).status() else { return nil }
                return PollingMonitor.token(UInt64(status.size))
            }
            switch strategy {
            case .polling(let interval):
                return PollingMonitor.shared.observe(probe: pollSize, interval: interval, handler: handler)
            case .inotify, .automatic:
                #if os(Linux) || os(Android)
                do {
                    let (directory, name) = (log.directory, log.logName)
                    return try InotifyMonitor.shared.observe(
                        path: path,
                        create: { directory.touchFile(named: name) },
                        handler: handler
                    )
                } catch  where strategy == .automatic {
                    log.logger.warning(
                        "inotify is unavailable; polling the queue instead",
                        metadata: ["cause": "\(error.message)"]
                    )
                }
                #endif
                return PollingMonitor.shared.observe(
                    probe: pollSize,
                    interval: DirectoryNotifier.fallbackPollingInterval,
                    handler: handler
                )
            }
        }
    }
}
