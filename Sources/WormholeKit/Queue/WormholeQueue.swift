import Foundation
import Logging

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
/// Space is reclaimed once every registered consumer has passed it. A consumer not seen for ``retention`` no longer
/// holds space back. The wormhole's engine stores the queue (a ``QueueLog``): in a directory, `FORMAT.md` describes
/// the files.
public final class WormholeQueue: Sendable {
    /// The queue's identifier.
    public let identifier: String
    /// How long a consumer may stay away and still hold back reclaiming; 7 days by default.
    public let retention: Duration
    /// The engine's log of this queue.
    public let log: any QueueLog
    let coder: any MessageCoder
    let logger: Logger

    init(wormhole: Wormhole, identifier: String, retention: Duration) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        self.identifier = identifier
        self.retention = retention
        self.log = try wormhole.engine.queueLog(identifier, sender: wormhole.sender, retention: retention)
        self.coder = wormhole.coder
        self.logger = wormhole.logger
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
        try log.append(payload)
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
        try log.append(contentsOf: payloads)
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
    ///   - type: The type of the messages.
    ///   - execution: Where the handler runs; by default ``CallbackExecution/automatic``: one message at a time, on
    ///     the notifier's thread while the handler returns quickly (a backlog is taken in passes of a few
    ///     milliseconds).
    ///   - errorHandler: Called when `handler` throws, a message cannot be decoded, or the queue cannot be read;
    ///     consuming goes on. When nil, the error is logged.
    ///   - handler: Called with each message; returning acknowledges it.
    /// - Returns: The consumer; it stops when cancelled or released.
    public func consume<Message: Decodable & Sendable>(
        consumer: String,
        as type: Message.Type = Message.self,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (QueueMessage<Message>) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer,
            batchSize: 1,
            execution: execution,
            errorHandler: errorHandler,
            decode: decoder(for: type),
            handler: .each(handler)
        )
    }

    /// Calls `handler` with every message of the queue as stored bytes, without decoding; otherwise as
    /// ``consume(consumer:as:on:errorHandler:handler:)``.
    public func consumeData(
        consumer: String,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (QueueMessage<Data>) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer,
            batchSize: 1,
            execution: execution,
            errorHandler: errorHandler,
            decode: Self.bytes,
            handler: .each(handler)
        )
    }

    /// Calls `handler` with the messages this consumer has not handled yet in batches, in order: up to
    /// `maximumCount` messages at a time, as many as are there.
    ///
    /// The fast way to consume a busy queue: the handler returning acknowledges the whole batch by storing the
    /// consumer's position once, where ``consume(consumer:as:on:errorHandler:handler:)`` stores it once per message.
    /// A handler that throws leaves the whole batch unacknowledged, to be offered again. A message that cannot be
    /// decoded is reported as ``WormholeError/Code/decodingFailed`` and left out of its batch.
    ///
    /// - Parameters:
    ///   - consumer: The consumer's durable name, as for ``consume(consumer:as:on:errorHandler:handler:)``.
    ///   - type: The type of the messages.
    ///   - maximumCount: The most messages in one batch (at least 1).
    ///   - execution: Where the handler runs, as for ``consume(consumer:as:on:errorHandler:handler:)``.
    ///   - errorHandler: Called with the errors, as for ``consume(consumer:as:on:errorHandler:handler:)``.
    ///   - handler: Called with each batch; returning acknowledges it.
    public func consumeBatches<Message: Decodable & Sendable>(
        consumer: String,
        as type: Message.Type = Message.self,
        maximumCount: Int = 1_000,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable ([QueueMessage<Message>]) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer,
            batchSize: maximumCount,
            execution: execution,
            errorHandler: errorHandler,
            decode: decoder(for: type),
            handler: .batches(handler)
        )
    }

    /// Calls `handler` with batches of messages as stored bytes; see
    /// ``consumeBatches(consumer:as:maximumCount:on:errorHandler:handler:)``.
    public func consumeDataBatches(
        consumer: String,
        maximumCount: Int = 1_000,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable ([QueueMessage<Data>]) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer,
            batchSize: maximumCount,
            execution: execution,
            errorHandler: errorHandler,
            decode: Self.bytes,
            handler: .batches(handler)
        )
    }

    // A decoder throws its error rather than returning a `Result`: a consumer of single messages then copies no
    // `Result` in and out per message.
    private static let bytes: @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Data> = { record in
        QueueMessage(record: record, value: record.payload)
    }

    private func decoder<Message: Decodable & Sendable>(
        for type: Message.Type
    ) -> @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Message> {
        { [coder, identifier] (record) throws(WormholeError) in
            do {
                return QueueMessage(record: record, value: try coder.decode(type, from: record.payload))
            } catch {
                throw WormholeError(
                    .decodingFailed,
                    "Queue message at offset \(record.offset) is not a \(Message.self) (from \(record.sender)): "
                        + "\(error).",
                    identifier: identifier,
                    underlyingError: error
                )
            }
        }
    }

    /// What a consumer's handler takes.
    private enum MessageHandler<Value: Sendable>: Sendable {
        /// One message at a time (batches of one): no array is made per message.
        case each(@Sendable (QueueMessage<Value>) throws -> Void)
        /// Batches of messages.
        case batches(@Sendable ([QueueMessage<Value>]) throws -> Void)
    }

    private func startConsumer<Value: Sendable>(
        _ consumer: String,
        batchSize: Int,
        execution: CallbackExecution,
        errorHandler: (@Sendable (WormholeError) -> Void)?,
        decode: @escaping @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Value>,
        handler: MessageHandler<Value>
    ) throws(WormholeError) -> QueueConsumer {
        try MessageIdentifier.validate(consumer)
        let cursor = try log.openCursor(consumer: consumer)
        let core = QueueConsumer(
            cursor: cursor,
            execution: execution,
            label: "wormhole.queue.\(identifier).\(consumer)",
            batchSize: batchSize
        ) { [self] records in
            switch handler {
            case .each(let handle):
                // A batch of one, as read for this handler: a failure leaves it unacknowledged.
                for record in records {
                    let message: QueueMessage<Value>
                    do throws(WormholeError) {
                        message = try decode(record)
                    } catch {
                        reportPassedOver(error, to: errorHandler)
                        continue
                    }
                    do {
                        try handle(message)
                    } catch {
                        reportHandlerFailure(error, count: 1, from: message.offset, to: errorHandler)
                        return false
                    }
                }
                return true
            case .batches(let handle):
                var messages: [QueueMessage<Value>] = []
                messages.reserveCapacity(records.count)
                for record in records {
                    do throws(WormholeError) {
                        messages.append(try decode(record))
                    } catch {
                        reportPassedOver(error, to: errorHandler)
                    }
                }
                guard !messages.isEmpty else { return true }
                do {
                    try handle(messages)
                    return true
                } catch {
                    reportHandlerFailure(error, count: messages.count, from: messages[0].offset, to: errorHandler)
                    return false
                }
            }
        } reportError: { [self] error in
            report(error, to: errorHandler)
        }
        try core.start()
        return core
    }

    /// A message that cannot be decoded: passed over, so that it cannot block the queue.
    private func reportPassedOver(_ error: WormholeError, to errorHandler: (@Sendable (WormholeError) -> Void)?) {
        var error = error
        error.message += " It is passed over."
        report(error, to: errorHandler)
    }

    private func reportHandlerFailure(
        _ error: any Error,
        count: Int,
        from offset: UInt64,
        to errorHandler: (@Sendable (WormholeError) -> Void)?
    ) {
        let place = count == 1 ? "the message at offset \(offset)" : "\(count) messages from offset \(offset)"
        report(
            .handlerFailed(error, "on \(place); it stays unacknowledged and is offered again", identifier: identifier),
            to: errorHandler
        )
    }

    /// The messages this consumer has not handled yet, then each new one, as an `AsyncSequence`.
    ///
    /// The consumer is registered (a new one from the oldest message kept) before this returns; opening its position
    /// may wait for a flush or a server, and waits on a Dispatch worker thread, never on the cooperative thread pool.
    ///
    /// A message counts as handled when the iteration asks for the next one, or when you pass it to
    /// ``QueueSequence/acknowledge(_:)``. A message that cannot be decoded ends the sequence with
    /// ``WormholeError/Code/decodingFailed`` (it stays unacknowledged); use
    /// ``consume(consumer:as:on:errorHandler:handler:)`` to pass over such messages.
    ///
    /// - Throws: ``WormholeError/Code/invalidIdentifier`` for an invalid consumer name, or the error that opening
    ///   the consumer's position met.
    public func messages<Message: Decodable & Sendable>(
        consumer: String,
        as type: Message.Type = Message.self
    ) async throws(WormholeError) -> QueueSequence<Message> {
        try MessageIdentifier.validate(consumer)
        let decode = decoder(for: type)
        return try await QueueSequence.open(log: log, consumer: consumer, decode: decode)
    }

    /// Messages of the consumers that have no error handler.
    func report(_ error: WormholeError, to handler: (@Sendable (WormholeError) -> Void)?) {
        ErrorReporting.report(error, to: handler, logger: logger, context: "queue \(identifier)")
    }

    // MARK: Status

    /// The queue's size, and each consumer's position and how far behind it is.
    public func status() throws(WormholeError) -> QueueStatus {
        try log.status()
    }

    // MARK: Reclaiming

    /// Frees what every consumer has passed; consumers not seen for ``retention`` are dropped first.
    ///
    /// Consumers call it as they move on; call it yourself after removing consumers.
    public func reclaimSpace() throws(WormholeError) {
        try log.reclaimSpace()
    }
}

extension Wormhole {
    /// The durable queue named `identifier`, stored by this wormhole's engine.
    ///
    /// - Parameters:
    ///   - identifier: The queue's name (rules of ``MessageIdentifier``).
    ///   - retention: How long a consumer may stay away and still hold back reclaiming.
    /// - Throws: ``WormholeError/Code/invalidIdentifier``, or ``WormholeError/Code/unsupported`` when the wormhole's
    ///   engine has no queues (a wormhole made from a transiting that keeps no directory).
    public func queue(
        _ identifier: String,
        retention: Duration = .seconds(7 * 24 * 3600)
    ) throws(WormholeError) -> WormholeQueue {
        try WormholeQueue(wormhole: self, identifier: identifier, retention: retention)
    }
}
