#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
#if os(Linux) || os(Android)
import CWormholeSystem
#endif
import Foundation
import Logging
import Synchronization

/// A durable queue: every message passed to it is kept, in order, and each named consumer receives every one once.
///
/// MMWormhole kept only the newest message of an identifier; its most asked-for feature was a queue. Any number of
/// producers in any number of processes ``enqueue(_:)``; each *consumer* (a durable name, like a consumer group)
/// receives every message in append order, once, across restarts of either side. Its position is stored in the
/// group directory and moves on only when the consumer has handled a message: a consumer killed while handling a
/// message gets it again, and one that handled it never does. Several consumers each see everything. A consumer
/// that was away catches up when it starts, then goes on live.
///
/// ```swift
/// let jobs = try wormhole.queue("jobs")
/// try jobs.enqueue(Job(id: 1))                       // in any process
///
/// let worker = try jobs.consume(consumer: "worker", as: Job.self) { message in
///     try perform(message.value)                     // returning acknowledges; throwing retries it later
/// }
/// ```
///
/// Space is reclaimed once every registered consumer has passed it (the file keeps its offsets; the blocks are
/// freed). A consumer not seen for ``retention`` no longer holds space back. `FORMAT.md` describes the files.
public final class WormholeQueue: Sendable {
    /// The queue's identifier.
    public let identifier: String
    /// How long a consumer may stay away and still hold back reclaiming; 7 days by default.
    public let retention: Duration
    let directory: DirectoryHandle
    let consumers: DirectoryHandle
    let logName: String
    let coder: any MessageCoder
    let sender: [UInt8]
    let logger: Logger
    /// How consumers are woken: the log file itself (inotify, or polling its size), or the wormhole's notifier.
    let wakeSource: WakeSource
    private let appendDescriptor = Locked<Int32>(-1)
    /// The bytes of a batch being appended, kept for the next batch.
    private let batchBuffer = Locked<[UInt8]>([])

    enum WakeSource: Sendable {
        case logFile(DirectoryNotifier.Strategy)
        case notifier(any Notifier)
    }

    var logPath: String { directory.filePath(logName) }

    init(wormhole: Wormhole, identifier: String, retention: Duration) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        guard let path = wormhole.directory else {
            throw WormholeError(
                .directoryUnavailable,
                "Queues live in a directory; this wormhole was made with a custom transiting and has none.",
                identifier: identifier)
        }
        let options = wormhole.fileOptions
        self.identifier = identifier
        self.retention = retention
        self.logName = identifier + ".queue"
        self.directory = try DirectoryHandle.open(path: path, create: true, options: options)
        self.consumers = try directory.subdirectory(named: identifier + ".consumers")
        self.coder = wormhole.coder
        self.sender = Array(wormhole.sender.utf8.prefix(Int(UInt16.max)))
        self.logger = wormhole.logger
        if let files = wormhole.notifier as? DirectoryNotifier {
            wakeSource = .logFile(files.strategy)
        } else {
            wakeSource = .notifier(wormhole.notifier)
        }
    }

    deinit {
        appendDescriptor.withLock { if $0 >= 0 { _ = close($0) } }
    }

    // MARK: Producing

    /// Encodes a message and appends it to the queue.
    ///
    /// - Throws: ``WormholeError/Code/encodingFailed``, ``WormholeError/Code/messageTooLarge``,
    ///   ``WormholeError/Code/diskFull`` (nothing appended, or a torn record that consumers step over).
    public func enqueue<Message: Encodable>(_ message: Message) throws(WormholeError) {
        try enqueueData(try coder.encodeMessage(message, identifier: identifier))
    }

    /// Appends bytes as they are to the queue; consumers read them back with ``QueueMessage/payload``.
    public func enqueueData(_ payload: Data) throws(WormholeError) {
        try enqueueData(contentsOf: CollectionOfOne(payload))
    }

    /// Encodes messages and appends them to the queue in one write, in order.
    ///
    /// The fast way to enqueue many messages at once: one system call and one wake-up of the consumers for the
    /// whole batch, where ``enqueue(_:)`` costs one of each per message. Another producer's messages never come
    /// between them. On a full disk, a first part of the batch may be appended and the rest not: the error's message
    /// says so, and consumers step over the record cut short.
    ///
    /// - Throws: as ``enqueue(_:)``; nothing is appended when a message cannot be encoded or is too large.
    public func enqueue<Message: Encodable>(contentsOf messages: some Sequence<Message>) throws(WormholeError) {
        var payloads: [Data] = []
        for message in messages { payloads.append(try coder.encodeMessage(message, identifier: identifier)) }
        try enqueueData(contentsOf: payloads)
    }

    /// Appends each payload as it is, in one write, in order; see ``enqueue(contentsOf:)``.
    public func enqueueData(contentsOf payloads: some Sequence<Data>) throws(WormholeError) {
        let timestamp = ProcessFacts.wallClockNanoseconds()
        // One buffer, kept between calls (a fresh one would cost an allocation per message, and page faults for a
        // large batch), one write.
        try batchBuffer.withLock { (buffer) throws(WormholeError) in
            buffer.removeAll(keepingCapacity: true)
            for payload in payloads {
                try checkSize(payload)
                payload.withUnsafeBytes { bytes in
                    QueueFormat.encode(payload: bytes, sender: sender, timestampNanoseconds: timestamp, appendingTo: &buffer)
                }
            }
            guard !buffer.isEmpty else { return }
            try append(buffer)
            if buffer.capacity > 8 << 20 { buffer = [] }  // not kept after a huge batch
        }
    }

    private func checkSize(_ payload: Data) throws(WormholeError) {
        guard payload.count + QueueFormat.bodyPrefixSize + sender.count <= QueueFormat.maximumBodySize else {
            throw WormholeError(
                .messageTooLarge, "The message is \(payload.count) bytes; a queue accepts up to 64 MiB.",
                identifier: identifier)
        }
    }

    /// Appends whole records with one write, then wakes the consumers.
    private func append(_ records: [UInt8]) throws(WormholeError) {
        try appendDescriptor.withLock { (descriptor) throws(WormholeError) in
            if descriptor < 0 { descriptor = try openForAppending() }
            // One write: with O_APPEND the kernel puts it at the end, whole, whatever other processes append
            // meanwhile.
            let written = records.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            guard written == records.count else {
                let errno = written < 0 ? currentErrno : .noSpace
                _ = close(descriptor)
                descriptor = -1
                let action =
                    written > 0
                    ? "append to the queue (only the first \(written) of \(records.count) bytes were written: the "
                        + "messages before the cut are in the queue, the rest are not)"
                    : "append to the queue"
                throw WormholeError.fileSystem(errno, action, identifier: identifier, path: logPath)
            }
        }
        if case .notifier(let notifier) = wakeSource {
            try notifier.post("queue." + identifier)
        }
    }

    private func openForAppending() throws(WormholeError) -> Int32 {
        let file: OwnedDescriptor
        do {
            file = try directory.openFile(named: logName, flags: O_WRONLY | O_APPEND | O_CREAT)
        } catch {
            throw WormholeError.fileSystem(error, "open the queue", identifier: identifier, path: logPath)
        }
        guard try directory.trustedStatus(of: file.descriptor, name: logName, identifier: identifier) != nil else {
            throw WormholeError(.ioFailure, "The queue file was removed while opening it.", identifier: identifier, path: logPath)
        }
        return file.release()
    }

    // MARK: Consuming

    /// Calls `handler` with every message of the queue this consumer has not handled yet, in order, then with each
    /// new one as it is appended.
    ///
    /// The handler returning acknowledges the message: the consumer's position is stored before the next one is
    /// handled, so a message is never handled twice once acknowledged. A handler that throws leaves the message
    /// unacknowledged: the error goes to `errorHandler`, and the message is offered again at the next append (or
    /// when the consumer starts again). A message that cannot be decoded as `type` is reported as
    /// ``WormholeError/Code/decodingFailed`` and passed over, so that it cannot block the queue.
    ///
    /// - Parameters:
    ///   - consumer: The consumer's durable name (rules of ``MessageIdentifier``).
    ///   - execution: Where the handler runs; a serial queue of the consumer's own by default.
    /// - Returns: The consumer; it stops when cancelled or released.
    public func consume<Message: Decodable & Sendable>(
        consumer: String,
        as type: Message.Type = Message.self,
        on execution: CallbackExecution = .serialQueue,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (QueueMessage<Message>) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer, batchSize: 1, execution: execution, errorHandler: errorHandler, decode: decoder(for: type)
        ) { try handler($0[0]) }
    }

    /// Calls `handler` with every message of the queue as stored bytes, without decoding; otherwise as
    /// ``consume(consumer:as:on:errorHandler:handler:)``.
    public func consumeData(
        consumer: String,
        on execution: CallbackExecution = .serialQueue,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (QueueMessage<Data>) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(consumer, batchSize: 1, execution: execution, errorHandler: errorHandler, decode: Self.bytes) {
            try handler($0[0])
        }
    }

    /// Calls `handler` with the messages this consumer has not handled yet in batches, in order: up to
    /// `maximumCount` messages at a time, as many as are there.
    ///
    /// The fast way to consume a busy queue: the handler returning acknowledges the whole batch with one write of
    /// the consumer's position, where ``consume(consumer:as:on:errorHandler:handler:)`` writes it once per message.
    /// A handler that throws leaves the whole batch unacknowledged, to be offered again. A message that cannot be
    /// decoded is reported as ``WormholeError/Code/decodingFailed`` and left out of its batch.
    ///
    /// - Parameters:
    ///   - maximumCount: The most messages in one batch (at least 1).
    ///   - consumer, type, execution, errorHandler: As for ``consume(consumer:as:on:errorHandler:handler:)``.
    public func consumeBatches<Message: Decodable & Sendable>(
        consumer: String,
        as type: Message.Type = Message.self,
        maximumCount: Int = 1_000,
        on execution: CallbackExecution = .serialQueue,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable ([QueueMessage<Message>]) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer, batchSize: maximumCount, execution: execution, errorHandler: errorHandler,
            decode: decoder(for: type), handler: handler)
    }

    /// Calls `handler` with batches of messages as stored bytes; see
    /// ``consumeBatches(consumer:as:maximumCount:on:errorHandler:handler:)``.
    public func consumeDataBatches(
        consumer: String,
        maximumCount: Int = 1_000,
        on execution: CallbackExecution = .serialQueue,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable ([QueueMessage<Data>]) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer, batchSize: maximumCount, execution: execution, errorHandler: errorHandler, decode: Self.bytes,
            handler: handler)
    }

    private static let bytes: @Sendable (QueueReader.Item) -> Result<QueueMessage<Data>, WormholeError> = { item in
        .success(QueueMessage(item: item, value: item.record.payload))
    }

    private func decoder<Message: Decodable & Sendable>(
        for type: Message.Type
    ) -> @Sendable (QueueReader.Item) -> Result<QueueMessage<Message>, WormholeError> {
        { [self] item in
            do {
                return .success(QueueMessage(item: item, value: try coder.decode(type, from: item.record.payload)))
            } catch {
                return .failure(
                    WormholeError(
                        .decodingFailed,
                        "Queue message at offset \(item.offset) is not a \(Message.self) (from "
                            + "\(String(decoding: item.record.sender, as: UTF8.self))): \(error). It is passed over.",
                        identifier: identifier, underlyingError: error))
            }
        }
    }

    private func startConsumer<Value: Sendable>(
        _ consumer: String,
        batchSize: Int,
        execution: CallbackExecution,
        errorHandler: (@Sendable (WormholeError) -> Void)?,
        decode: @escaping @Sendable (QueueReader.Item) -> Result<QueueMessage<Value>, WormholeError>,
        handler: @escaping @Sendable ([QueueMessage<Value>]) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        let state = try QueueConsumerState(queue: self, name: consumer)
        let core = QueueConsumer(state: state, execution: execution, batchSize: batchSize) { [self] items in
            var messages: [QueueMessage<Value>] = []
            messages.reserveCapacity(items.count)
            for item in items {
                switch decode(item) {
                case .success(let decoded): messages.append(decoded)
                case .failure(let error): report(error, to: errorHandler)  // passed over: it cannot block the queue
                }
            }
            guard !messages.isEmpty else { return true }
            do {
                try handler(messages)
                return true
            } catch {
                let place =
                    messages.count == 1
                    ? "the message at offset \(messages[0].offset)"
                    : "\(messages.count) messages from offset \(messages[0].offset)"
                report(
                    WormholeError(
                        .ioFailure, "The handler failed on \(place): \(error). It stays unacknowledged and is offered "
                            + "again.",
                        identifier: identifier, underlyingError: error),
                    to: errorHandler)
                return false
            }
        } reportError: { [self] error in report(error, to: errorHandler) }
        try core.start()
        return core
    }

    /// The messages this consumer has not handled yet, then each new one, as an `AsyncSequence`.
    ///
    /// A message counts as handled when the iteration asks for the next one. A message that cannot be decoded ends
    /// the sequence with ``WormholeError/Code/decodingFailed`` (it stays unacknowledged); use
    /// ``consume(consumer:as:on:errorHandler:handler:)`` to pass over such messages.
    public func messages<Message: Decodable & Sendable>(
        consumer: String, as type: Message.Type = Message.self
    ) -> QueueSequence<Message> {
        QueueSequence(queue: self, consumer: consumer)
    }

    func report(_ error: WormholeError, to handler: (@Sendable (WormholeError) -> Void)?) {
        if let handler { handler(error) } else {
            logger.error("Queue consumer error", metadata: ["queue": "\(identifier)", "error": "\(error)"])
        }
    }

    // MARK: Status

    /// The queue's size, and each consumer's position and how far behind it is.
    public func status() throws(WormholeError) -> QueueStatus {
        let reader = try openForReading()
        defer { _ = close(reader) }
        var raw = stat()
        fstat(reader, &raw)
        let end = UInt64(raw.st_size)
        var result: [QueueStatus.Consumer] = []
        for name in try consumers.entries().sorted() where MessageIdentifier.isValid(name) {
            let cursor = try QueueCursorFile(directory: consumers, name: name, create: false)
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

    func openForReading() throws(WormholeError) -> Int32 {
        let file: OwnedDescriptor
        do {
            file = try directory.openFile(named: logName, flags: O_RDONLY | O_CREAT)
        } catch {
            throw WormholeError.fileSystem(error, "open the queue", identifier: identifier, path: logPath)
        }
        guard try directory.trustedStatus(of: file.descriptor, name: logName, identifier: identifier) != nil else {
            throw WormholeError(.ioFailure, "The queue file was removed while opening it.", identifier: identifier, path: logPath)
        }
        return file.release()
    }

    // MARK: Reclaiming

    /// Frees the blocks that every consumer has passed; consumers not seen for ``retention`` are dropped first.
    ///
    /// Consumers call it as they move on; call it yourself after removing consumers.
    public func reclaimSpace() throws(WormholeError) {
        let now = Date()
        var minimum: UInt64?
        for name in try consumers.entries() where MessageIdentifier.isValid(name) {
            let cursor = try QueueCursorFile(directory: consumers, name: name, create: false)
            if let seen = cursor.lastWritten, now.timeIntervalSince(seen) > Double(retention.components.seconds) {
                _ = consumers.removeFile(named: name)
                logger.warning("Dropped a queue consumer not seen within the retention", metadata: ["consumer": "\(name)"])
                continue
            }
            let position = try cursor.read() ?? 0
            minimum = min(minimum ?? position, position)
        }
        guard let minimum, minimum >= 4096 else { return }
        #if os(Linux) || os(Android)
        // Punching a hole needs a descriptor open for writing.
        let file: OwnedDescriptor
        do {
            file = try directory.openFile(named: logName, flags: O_WRONLY)
        } catch {
            throw WormholeError.fileSystem(error, "open the queue", identifier: identifier, path: logPath)
        }
        let descriptor = file.descriptor.rawValue
        let through = minimum & ~4095
        if cwormhole_punch_hole(descriptor, 0, Int64(through)) != 0 {
            // Not every file system can punch holes; the queue still works, it only keeps its space.
            logger.debug("Could not reclaim queue space", metadata: ["errno": "\(currentErrno)"])
        }
        _ = consume file
        #endif
    }
}

extension Wormhole {
    /// The durable queue named `identifier` in this wormhole's directory.
    ///
    /// - Parameter retention: How long a consumer may stay away and still hold back reclaiming.
    /// - Throws: ``WormholeError/Code/invalidIdentifier``, or ``WormholeError/Code/directoryUnavailable`` for a
    ///   wormhole made with a custom transiting (queues live in a directory).
    public func queue(_ identifier: String, retention: Duration = .seconds(7 * 24 * 3600)) throws(WormholeError) -> WormholeQueue {
        try WormholeQueue(wormhole: self, identifier: identifier, retention: retention)
    }
}

/// A message taken from a queue.
public struct QueueMessage<Value: Sendable>: Sendable {
    /// The message's position in the queue: its id, growing with each append.
    public var offset: UInt64
    /// Who enqueued it.
    public var sender: String
    /// When it was enqueued, in nanoseconds since 1970.
    public var timestampNanoseconds: Int64
    /// The encoded message.
    public var payload: Data
    /// The decoded message.
    public var value: Value

    init(item: QueueReader.Item, value: Value) {
        offset = item.offset
        sender = String(decoding: item.record.sender, as: UTF8.self)
        timestampNanoseconds = item.record.timestampNanoseconds
        payload = item.record.payload
        self.value = value
    }

    /// When it was enqueued.
    public var date: Date { Date(timeIntervalSince1970: Double(timestampNanoseconds) / 1e9) }
}

/// A queue's size and its consumers' positions.
public struct QueueStatus: Sendable, Codable, Equatable {
    /// A consumer's position.
    public struct Consumer: Sendable, Codable, Equatable {
        /// The consumer's name.
        public var name: String
        /// The offset of the next message it will handle.
        public var offset: UInt64
        /// How many bytes of the queue it has not handled.
        public var lagBytes: UInt64
        /// How many messages it has not handled.
        public var lagMessages: Int
    }

    /// The queue's identifier.
    public var identifier: String
    /// The offset just past the last message.
    public var endOffset: UInt64
    /// The registered consumers, by name.
    public var consumers: [Consumer]
}
