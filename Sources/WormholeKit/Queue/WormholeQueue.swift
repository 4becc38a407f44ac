import Foundation
import Logging

/// A durable queue: every message passed to it is kept, in order, and each named consumer receives every one once.
///
/// MMWormhole kept only the newest message of an identifier; its most asked-for feature was a queue. Any number of
/// producers in any number of processes ``enqueue(_:)``; each *consumer* (a durable name, like a consumer group)
/// receives every message once, across restarts of either side: in append order, but for a message whose handler
/// failed, which comes back after a back-off while later ones flow (or, in strict order, holds them back; see
/// ``QueueRetryPolicy``). Its position is stored by the engine and moves past a message only once it was handled, set
/// aside for another attempt or given up on as a dead letter: a consumer killed while handling a message gets it
/// again, and one that handled it never does. Several consumers each see everything. A consumer that was away catches
/// up when it starts, then goes on live.
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
    /// The engine's log of this queue's scheduled messages (`QUEUE#scheduled`), opened at first use: each record a
    /// message and its schedule (``QueueSchedule``), which every consumer takes into its retries.
    private let openedScheduledLog = Locked<(any QueueLog)?>(nil)
    let coder: any MessageCoder
    let logger: Logger
    let engine: any WormholeEngine
    let sender: String

    init(wormhole: Wormhole, identifier: String, retention: Duration) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        self.identifier = identifier
        self.retention = retention
        self.log = try wormhole.engine.queueLog(identifier, sender: wormhole.sender, retention: retention)
        self.coder = wormhole.coder
        self.logger = wormhole.logger
        self.engine = wormhole.engine
        self.sender = wormhole.sender
    }

    /// The scheduled log, opened now if it was not: a queue that is only enqueued to, without a schedule, opens it
    /// only for ``status()`` and ``reclaimSpace()``.
    func scheduledLog() throws(WormholeError) -> any QueueLog {
        if let log = openedScheduledLog.withLock({ $0 }) { return log }
        let log = try engine.queueLog(QueueWorkNames.scheduled(queue: identifier), sender: sender, retention: retention)
        return openedScheduledLog.withLock { opened in
            if let opened { return opened }
            opened = log
            return log
        }
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

    /// Encodes a message and enqueues it to be offered when `schedule` says: after a delay or at a time, and not
    /// after it expires (``QueueSchedule``).
    ///
    /// ```swift
    /// try jobs.enqueue(Job(id: 2), schedule: .after(.seconds(30)))
    /// ```
    ///
    /// - Throws: as ``enqueue(_:)``.
    public func enqueue<Message: Encodable>(_ message: Message, schedule: QueueSchedule) throws(WormholeError) {
        try enqueueData(try coder.encodeMessage(message, identifier: identifier), schedule: schedule)
    }

    /// Enqueues bytes as they are, to be offered when `schedule` says; see ``enqueue(_:schedule:)``.
    public func enqueueData(_ payload: Data, schedule: QueueSchedule) throws(WormholeError) {
        try scheduledLog().append(try ScheduledEnvelope(schedule: schedule, payload: payload).encoded())
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
    /// handled, so a message is never handled twice once acknowledged. A handler that throws has failed an attempt:
    /// `retry` says when the message is offered again (``QueueMessage/attempt`` counts them) and whether later
    /// messages wait meanwhile; after its last attempt the message goes to the consumer's dead letters
    /// (``deadLetters(consumer:)``) and the consumer moves on, so that no message can stop it for good. The error
    /// goes to `errorHandler` either way. A message that cannot be decoded as `type` is reported as
    /// ``WormholeError/Code/decodingFailed`` and goes to the dead letters at once. A handler that throws
    /// `CancellationError` stops the consumer: its message stays unacknowledged, with no attempt counted.
    ///
    /// - Parameters:
    ///   - consumer: The consumer's durable name (rules of ``MessageIdentifier``).
    ///   - type: The type of the messages.
    ///   - retry: How failed attempts are retried; by default 5 attempts, later messages flowing past one that
    ///     waits (``QueueRetryPolicy/default``).
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
        retry: QueueRetryPolicy = .default,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (QueueMessage<Message>) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try process(consumer: consumer, as: type, retry: retry, on: execution, errorHandler: errorHandler) {
            try handler($0)
            return .done
        }
    }

    /// Calls `handler` with every message this consumer has not handled yet, as
    /// ``consume(consumer:as:retry:on:errorHandler:handler:)`` does, with a handler that says what became of each
    /// message: ``QueueOutcome/done`` acknowledges it, ``QueueOutcome/later(_:)`` offers it again after that long,
    /// without counting a failed attempt.
    ///
    /// ```swift
    /// let consumer = try jobs.process(consumer: "worker", as: Job.self) { message in
    ///     guard isOnline() else { return .later(.seconds(30)) }
    ///     try perform(message.value)
    ///     return .done
    /// }
    /// ```
    public func process<Message: Decodable & Sendable>(
        consumer: String,
        as type: Message.Type = Message.self,
        retry: QueueRetryPolicy = .default,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (QueueMessage<Message>) throws -> QueueOutcome
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer,
            batchSize: 1,
            retry: retry,
            execution: execution,
            errorHandler: errorHandler,
            decode: decoder(for: type),
            handler: .each(handler)
        )
    }

    /// Calls `handler` with every message of the queue as stored bytes, without decoding; otherwise as
    /// ``process(consumer:as:retry:on:errorHandler:handler:)``.
    public func processData(
        consumer: String,
        retry: QueueRetryPolicy = .default,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (QueueMessage<Data>) throws -> QueueOutcome
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer,
            batchSize: 1,
            retry: retry,
            execution: execution,
            errorHandler: errorHandler,
            decode: Self.bytes,
            handler: .each(handler)
        )
    }

    /// Calls `handler` with every message of the queue as stored bytes, without decoding; otherwise as
    /// ``consume(consumer:as:retry:on:errorHandler:handler:)``.
    public func consumeData(
        consumer: String,
        retry: QueueRetryPolicy = .default,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (QueueMessage<Data>) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try processData(consumer: consumer, retry: retry, on: execution, errorHandler: errorHandler) {
            try handler($0)
            return .done
        }
    }

    /// Calls `handler` with the messages this consumer has not handled yet in batches, in order: up to
    /// `maximumCount` messages at a time, as many as are there.
    ///
    /// The fast way to consume a busy queue: the handler returning acknowledges the whole batch by storing the
    /// consumer's position once, where ``consume(consumer:as:retry:on:errorHandler:handler:)`` stores it once per
    /// message. A handler that throws has failed an attempt of every message of the batch: in
    /// ``QueueRetryPolicy/Order-swift.enum/unordered`` order each is set aside and comes back, with the others due
    /// then, in a later batch; in ``QueueRetryPolicy/Order-swift.enum/strict`` order the batch is offered again after
    /// the back-off. A message that cannot be decoded is reported as ``WormholeError/Code/decodingFailed`` and goes
    /// to the dead letters.
    ///
    /// - Parameters:
    ///   - consumer: The consumer's durable name, as for ``consume(consumer:as:retry:on:errorHandler:handler:)``.
    ///   - type: The type of the messages.
    ///   - maximumCount: The most messages in one batch (at least 1).
    ///   - retry: How failed attempts are retried, as for ``consume(consumer:as:retry:on:errorHandler:handler:)``.
    ///   - execution: Where the handler runs, as for ``consume(consumer:as:retry:on:errorHandler:handler:)``.
    ///   - errorHandler: Called with the errors, as for ``consume(consumer:as:retry:on:errorHandler:handler:)``.
    ///   - handler: Called with each batch; returning acknowledges it.
    public func consumeBatches<Message: Decodable & Sendable>(
        consumer: String,
        as type: Message.Type = Message.self,
        maximumCount: Int = 1_000,
        retry: QueueRetryPolicy = .default,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable ([QueueMessage<Message>]) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer,
            batchSize: maximumCount,
            retry: retry,
            execution: execution,
            errorHandler: errorHandler,
            decode: decoder(for: type),
            handler: .batches(handler)
        )
    }

    /// Calls `handler` with batches of messages as stored bytes; see
    /// ``consumeBatches(consumer:as:maximumCount:retry:on:errorHandler:handler:)``.
    public func consumeDataBatches(
        consumer: String,
        maximumCount: Int = 1_000,
        retry: QueueRetryPolicy = .default,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable ([QueueMessage<Data>]) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        try startConsumer(
            consumer,
            batchSize: maximumCount,
            retry: retry,
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
        case each(@Sendable (QueueMessage<Value>) throws -> QueueOutcome)
        /// Batches of messages.
        case batches(@Sendable ([QueueMessage<Value>]) throws -> Void)
    }

    private func startConsumer<Value: Sendable>(
        _ consumer: String,
        batchSize: Int,
        retry policy: QueueRetryPolicy,
        execution: CallbackExecution,
        errorHandler: (@Sendable (WormholeError) -> Void)?,
        decode: @escaping @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Value>,
        handler: MessageHandler<Value>
    ) throws(WormholeError) -> QueueConsumer {
        try MessageIdentifier.validate(consumer)
        let retries = try QueueRetries(
            policy: policy,
            queue: identifier,
            consumer: consumer,
            sender: sender,
            engine: engine,
            longestWait: retention
        ) { [self] error in report(error, to: errorHandler) }
        // The scheduled log's records are taken into the retries, each due at its time, on a queue of their own.
        let scheduledCore = QueueConsumer(
            cursor: try scheduledLog().openCursor(consumer: consumer),
            execution: .serialQueue,
            label: "wormhole.queue.\(identifier).\(consumer).scheduled",
            batchSize: 500,
            // Once the position is past them, they may be offered: the queue's consumer looks.
            onAcknowledged: { retries.wake(at: QueueRetries.now()) },
            deliver: { records in retries.takeScheduled(records) ? records.last?.end : nil },
            reportError: { [self] error in report(error, to: errorHandler) }
        )
        let delivery = QueueDelivery(
            queue: self,
            consumer: consumer,
            retries: retries,
            batchSize: batchSize,
            errorHandler: errorHandler,
            decode: decode,
            handler: handler,
            scheduledPosition: { [weak scheduledCore] in scheduledCore?.position ?? 0 }
        )
        let cursor = try log.openCursor(consumer: consumer)
        let core = QueueConsumer(
            cursor: cursor,
            execution: execution,
            label: "wormhole.queue.\(identifier).\(consumer)",
            batchSize: batchSize,
            prepare: { position in delivery.deliverDue(before: position) },
            releaseWaits: { retries.releaseWaits() },
            onCancel: {
                retries.stop()
                scheduledCore.cancel()
            },
            deliver: { records in delivery.deliver(records) },
            reportError: { [self] error in report(error, to: errorHandler) }
        )
        retries.attach(core, scheduled: scheduledCore)
        try scheduledCore.start()
        try core.start()
        return core
    }

    /// Hands one consumer's records to its handler and settles each attempt with its ``QueueRetries``.
    private struct QueueDelivery<Value: Sendable>: Sendable {
        let queue: WormholeQueue
        let consumer: String
        let retries: QueueRetries
        let batchSize: Int
        let errorHandler: (@Sendable (WormholeError) -> Void)?
        let decode: @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Value>
        let handler: MessageHandler<Value>
        /// The stored position of this consumer in the queue's scheduled log.
        let scheduledPosition: @Sendable () -> UInt64

        /// Records read from the queue at the consumer's position; returns the end of those handled (nil: none).
        func deliver(_ records: [QueueRecord]) -> UInt64? {
            // The success path of a consumer with nothing set aside looks at nothing more than this.
            let anySetAside = !retries.holdsNoQueueMessage
            switch handler {
            case .each(let handle):
                var end: UInt64?
                for record in records {
                    var entry: SetAsideMessage?
                    if anySetAside {
                        switch retries.standing(of: record.offset) {
                        case .fresh: break
                        case .setAside:
                            end = record.end
                            continue
                        case .waiting(let until):
                            retries.wake(at: until)
                            return end
                        case .due(let found): entry = found
                        }
                    }
                    guard deliverOne(record, (entry?.attempts ?? 0) + 1, entry, atPosition: true, handle) else {
                        return end
                    }
                    end = record.end
                }
                return end
            case .batches(let handle):
                guard anySetAside else { return deliverFreshBatch(records, handle) ? records.last?.end : nil }
                // The batch runs while its messages stand alike: all fresh, or (strict order) all due at the same
                // attempt, so that they share one fate; the rest is read again.
                var items: [QueueRetries.Item] = []
                var end: UInt64?
                scan: for record in records {
                    let item: QueueRetries.Item
                    switch retries.standing(of: record.offset) {
                    case .fresh: item = (record, 1, nil)
                    case .setAside:
                        if items.isEmpty { end = record.end }
                        guard items.isEmpty else { break scan }
                        continue scan
                    case .waiting(let until):
                        if items.isEmpty { retries.wake(at: until) }
                        break scan
                    case .due(let found): item = (record, found.attempts + 1, found)
                    }
                    if let first = items.first, first.number != item.number { break scan }
                    items.append(item)
                }
                guard let last = items.last else { return end }
                return deliverBatch(items, atPosition: true, handle) ? last.record.end : end
            }
        }

        /// Hands over the set-aside messages whose time has come, before the queue is read: each at most once a
        /// pass, within the pass's time budget, until one could not be settled or the consumer is cancelled.
        func deliverDue(before position: UInt64) {
            guard !retries.isEmpty else { return }
            retries.settleOwedResolutions()
            let started = CallbackDriver.passStart()
            // Sorted once a pass, then handed over a batch at a time.
            var pending = retries.due(before: position, scheduledBefore: scheduledPosition())[...]
            while !retries.consumerIsCancelled {
                var due = Array(pending.prefix(max(1, batchSize)))
                pending = pending.dropFirst(due.count)
                guard !due.isEmpty else { return }
                // Past their time to live: to the dead letters, unoffered.
                let now = QueueRetries.now()
                let expired = due.filter { $0.hasExpired(at: now) }
                if !expired.isEmpty {
                    guard retries.expire(expired) else { return }
                    due.removeAll { $0.hasExpired(at: now) }
                    if due.isEmpty { continue }
                }
                let settled: Bool
                switch handler {
                case .each(let handle):
                    settled = due.allSatisfy { entry in
                        deliverOne(entry.record, entry.attempts + 1, entry, atPosition: false, handle)
                    }
                case .batches(let handle):
                    settled = deliverBatch(due.map { ($0.record, $0.attempts + 1, $0) }, atPosition: false, handle)
                }
                // Not settled: `settle` asked for a wake-up in a second. Over budget: the rest in the next pass.
                guard settled else { return }
                if CallbackDriver.passIsOverBudget(started) {
                    retries.wake(at: QueueRetries.now())
                    return
                }
            }
        }

        private func deliverOne(
            _ record: QueueRecord,
            _ number: Int,
            _ entry: SetAsideMessage?,
            atPosition: Bool,
            _ handle: @Sendable (QueueMessage<Value>) throws -> QueueOutcome
        ) -> Bool {
            var message: QueueMessage<Value>
            do throws(WormholeError) {
                message = try decode(record)
            } catch {
                reportUndecodable(error)
                return retries.giveUp(on: (record, number, entry), error: error)
            }
            if let entry {
                message.attempt = number
                message.isScheduled = entry.isScheduled
            }
            let attempt: QueueRetries.Attempt
            do {
                switch try handle(message) {
                case .done:
                    // The success path: nothing to store but the position.
                    guard entry != nil else { return true }
                    attempt = .done
                case .later(let delay): attempt = .later(delay)
                }
            } catch is CancellationError {
                return stop()
            } catch {
                reportFailure(error, count: 1, from: record.offset, number: number)
                attempt = .failed(error)
            }
            return retries.settle([(record, number, entry)], attempt, atPosition: atPosition)
        }

        /// A batch read at the position with nothing set aside: the success path builds the messages and nothing
        /// else.
        private func deliverFreshBatch(
            _ records: [QueueRecord],
            _ handle: @Sendable ([QueueMessage<Value>]) throws -> Void
        ) -> Bool {
            var messages: [QueueMessage<Value>] = []
            messages.reserveCapacity(records.count)
            for record in records {
                do throws(WormholeError) {
                    messages.append(try decode(record))
                } catch {
                    reportUndecodable(error)
                    guard retries.giveUp(on: (record, 1, nil), error: error) else { return false }
                }
            }
            guard !messages.isEmpty else { return true }
            do {
                try handle(messages)
                return true
            } catch is CancellationError {
                return stop()
            } catch {
                reportFailure(error, count: messages.count, from: messages[0].offset, number: 1)
                let handed = Set(messages.map(\.offset))
                let items = records.filter { handed.contains($0.offset) }.map { ($0, 1, SetAsideMessage?.none) }
                return retries.settle(items, .failed(error), atPosition: true)
            }
        }

        private func deliverBatch(
            _ items: [QueueRetries.Item],
            atPosition: Bool,
            _ handle: @Sendable ([QueueMessage<Value>]) throws -> Void
        ) -> Bool {
            var messages: [QueueMessage<Value>] = []
            var handed: [QueueRetries.Item] = []
            messages.reserveCapacity(items.count)
            for item in items {
                do throws(WormholeError) {
                    var message = try decode(item.record)
                    message.attempt = item.number
                    message.isScheduled = item.entry?.isScheduled ?? false
                    messages.append(message)
                    handed.append(item)
                } catch {
                    reportUndecodable(error)
                    guard retries.giveUp(on: item, error: error) else { return false }
                }
            }
            guard !messages.isEmpty else { return true }
            do {
                try handle(messages)
                guard handed.contains(where: { $0.entry != nil }) else { return true }
                return retries.settle(handed, .done, atPosition: atPosition)
            } catch is CancellationError {
                return stop()
            } catch {
                reportFailure(error, count: messages.count, from: messages[0].offset, number: handed[0].number)
                return retries.settle(handed, .failed(error), atPosition: atPosition)
            }
        }

        /// A handler threw `CancellationError`: the message is not handled, no attempt is counted, and the consumer
        /// stops.
        private func stop() -> Bool {
            retries.cancelConsumer()
            return false
        }

        /// A message that cannot be decoded: to the dead letters, so that it cannot block the queue.
        private func reportUndecodable(_ error: WormholeError) {
            var error = error
            error.message += " It goes to the dead letters of consumer \(consumer)."
            queue.report(error, to: errorHandler)
        }

        private func reportFailure(_ error: any Error, count: Int, from offset: UInt64, number: Int) {
            let policy = retries.policy
            let place = count == 1 ? "the message at offset \(offset)" : "\(count) messages from offset \(offset)"
            let limit = policy.maximumAttempts == .max ? "" : " of \(policy.maximumAttempts)"
            let fate =
                number >= policy.maximumAttempts
                ? "it was the last attempt: it goes to the dead letters of consumer \(consumer)"
                : "it is offered again after a back-off"
            queue.report(
                .handlerFailed(error, "on \(place), attempt \(number)\(limit); \(fate)", identifier: queue.identifier),
                to: errorHandler
            )
        }
    }

    /// The messages this consumer has not handled yet, then each new one, as an `AsyncSequence`.
    ///
    /// The sequence reads the queue only: messages enqueued with a ``QueueSchedule`` go to consumers made by
    /// ``consume(consumer:as:retry:on:errorHandler:handler:)`` and its kin.
    ///
    /// The consumer is registered (a new one from the oldest message kept) before this returns; opening its position
    /// may wait for a flush or a server, and waits on a Dispatch worker thread, never on the cooperative thread pool.
    ///
    /// A message counts as handled when the iteration asks for the next one, or when you pass it to
    /// ``QueueSequence/acknowledge(_:)``. A message that cannot be decoded ends the sequence with
    /// ``WormholeError/Code/decodingFailed`` (it stays unacknowledged); use
    /// ``consume(consumer:as:retry:on:errorHandler:handler:)`` to set such messages aside as dead letters. The
    /// sequence has no retry policy: the loop decides what a failure means.
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

    /// The queue's size, and each consumer's position, how far behind it is, how many of its messages wait for
    /// another attempt (and when the first comes due) and how many it gave up on.
    public func status() throws(WormholeError) -> QueueStatus {
        var status = try log.status()
        let scheduledLogStatus = try scheduledLog().status()
        // As a consumer reads them: an entry it would not offer is not counted, and no wait is longer than the
        // retention.
        let latest = QueueRetries.now().addingClamped(QueueRetries.nanoseconds(retention))
        for index in status.consumers.indices {
            let name = status.consumers[index].name
            let values = try engine.suiteStore(QueueWorkNames.retries(queue: identifier, consumer: name)).read().values
            let entries = values.keys.compactMap { key -> SetAsideMessage? in
                guard let entry = values[key, as: SetAsideMessage.self], entry.isValid, entry.key == key else {
                    return nil
                }
                return entry
            }
            let inLog = scheduledLogStatus.consumers.first { $0.name == name }
            // A scheduled message not offered yet waits for its time, not for a retry; one taken from the scheduled
            // log, the log's position not yet past it, is counted once.
            let waiting = entries.filter { !$0.waitsForItsTime }
            let scheduled = entries.filter(\.waitsForItsTime)
            let takenNotPassed = scheduled.filter { $0.offset >= (inLog?.offset ?? .max) }.count
            status.consumers[index].waitingForRetry = waiting.count
            status.consumers[index].nextRetryNanoseconds = waiting.map { min($0.notBeforeNanoseconds, latest) }.min()
            status.consumers[index].scheduled = scheduled.count + max(0, (inLog?.lagMessages ?? 0) - takenNotPassed)
            status.consumers[index].deadLetters = try engine.suiteStore(
                QueueWorkNames.deadLetters(queue: identifier, consumer: name)
            ).read().values.keys.count
        }
        return status
    }

    // MARK: Reclaiming

    /// Frees what every consumer has passed; consumers not seen for ``retention`` are dropped first.
    ///
    /// Consumers call it as they move on; call it yourself after removing consumers.
    public func reclaimSpace() throws(WormholeError) {
        try log.reclaimSpace()
        try scheduledLog().reclaimSpace()
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
