import Foundation
import Synchronization

/// An identifier of the calling thread.
func currentThreadID() -> UInt {
    #if canImport(Darwin)
    UInt(bitPattern: pthread_self())
    #else
    UInt(pthread_self())
    #endif
}

/// A running queue consumer; it stops when cancelled or released.
///
/// It is the callback core of queue consumption: woken by its cursor's observation, it reads what was appended,
/// hands it to the handler on the consumer's execution, and stores the position when the handler returns.
public final class QueueConsumer: WormholeCancellable {
    private let cursor: Locked<any QueueCursor>
    private let schedule: @Sendable (@escaping @Sendable () -> Void) -> Void
    /// Hands over a batch of records; false when they were not handled (and stay unacknowledged).
    private let deliver: @Sendable ([QueueRecord]) -> Bool
    /// The most messages in one batch: 1 for a handler of single messages.
    private let batchSize: Int
    private let reportError: @Sendable (WormholeError) -> Void
    private let observation = Locked<NotifierObservation?>(nil)
    private let cancelled = Atomic<Bool>(false)
    private let scheduled = Atomic<Bool>(false)
    /// The thread delivering right now, so that `cancel()` called from a handler does not wait for itself.
    private let deliveringThread = Atomic<UInt>(0)
    /// The consumer's name.
    public let name: String

    init(
        cursor: any QueueCursor, execution: CallbackExecution, label: String, batchSize: Int,
        deliver: @escaping @Sendable ([QueueRecord]) -> Bool,
        reportError: @escaping @Sendable (WormholeError) -> Void
    ) {
        self.name = cursor.consumer
        self.batchSize = max(1, batchSize)
        self.cursor = Locked(cursor)
        self.schedule = execution.makeScheduler(label: label)
        self.deliver = deliver
        self.reportError = reportError
    }

    func start() throws(WormholeError) {
        let watch = try cursor.withLock { (cursor) throws(WormholeError) in
            try cursor.observeAppends { [weak self] in self?.wake() }
        }
        observation.withLock { $0 = watch }
        wake()  // catch up on what was appended while this consumer was away
    }

    /// The offset of the next message this consumer will handle.
    public var position: UInt64 { cursor.withLock { $0.position } }

    /// Whether the consumer has stopped.
    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    /// Stops the consumer. A message being handled finishes first, and is acknowledged if its handler returns:
    /// when `cancel()` returns (from outside a handler), no message is left handled but unacknowledged.
    public func cancel() {
        cancelled.store(true, ordering: .releasing)
        let watch = observation.withLock { watch in
            defer { watch = nil }
            return watch
        }
        watch?.cancel()
        // Wait for a delivery under way, unless this is that delivery's own thread.
        if deliveringThread.load(ordering: .acquiring) != currentThreadID() {
            cursor.withLock { _ in }
        }
    }

    deinit { cancel() }

    private func wake() {
        // Coalesce: one pass reads everything appended so far.
        guard !scheduled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        schedule { [self] in
            scheduled.store(false, ordering: .releasing)
            deliverPending()
        }
    }

    private func deliverPending() {
        cursor.withLock { cursor in
            deliveringThread.store(currentThreadID(), ordering: .releasing)
            defer { deliveringThread.store(0, ordering: .releasing) }
            do throws(WormholeError) {
                while !cancelled.load(ordering: .relaxed) {
                    let batch = try cursor.read(maximumCount: batchSize)
                    guard let last = batch.last, deliver(batch) else { return }
                    try cursor.acknowledge(through: last.end)
                }
            } catch {
                reportError(error)
            }
        }
    }
}

/// The messages of a queue a consumer has not handled, then each new one, as an `AsyncSequence`; see
/// ``WormholeQueue/messages(consumer:as:)``. Iterate it once.
///
/// A message counts as handled, and the consumer's position moves past it, when the iteration asks for the next
/// one, or when you call ``acknowledge(_:)``: do that before leaving a loop with `break`, so that the last message is
/// not delivered again.
///
/// ```swift
/// let jobs = try wormhole.queue("jobs").messages(consumer: "worker", as: String.self)
/// for try await job in jobs {
///     print(job.value)
///     try jobs.acknowledge(job)
///     break
/// }
/// ```
public struct QueueSequence<Message: Decodable & Sendable>: AsyncSequence, Sendable {
    public typealias Element = QueueMessage<Message>
    public typealias Failure = WormholeError

    /// The consumer's cursor behind its lock, the messages handed out and not acknowledged, and the wake-ups.
    final class Feed: Sendable {
        let cursor: Result<Locked<any QueueCursor>, WormholeError>
        let decode: @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Message>
        /// The end of the last message handed out, not yet acknowledged.
        let pending = Locked<UInt64?>(nil)
        let observation: NotifierObservation?

        init(
            cursor: Result<Locked<any QueueCursor>, WormholeError>, observation: NotifierObservation?,
            decode: @escaping @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Message>
        ) {
            self.cursor = cursor
            self.observation = observation
            self.decode = decode
        }

        deinit { observation?.cancel() }

        /// Stores the position past the messages handed out so far.
        func acknowledgePending(through end: UInt64? = nil) throws(WormholeError) {
            let cursor = try self.cursor.get()
            try cursor.withLock { (cursor) throws(WormholeError) in
                let target = pending.withLock { pending -> UInt64? in
                    guard let last = pending else { return nil }
                    let target = Swift.min(end ?? last, last)
                    if target == last { pending = nil }
                    return target
                }
                if let target, target > cursor.position { try cursor.acknowledge(through: target) }
            }
        }
    }

    private let feed: Feed
    private let wakes: AsyncStream<Void>

    init(
        log: Result<any QueueLog, WormholeError>, consumer: String,
        decode: @escaping @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Message>
    ) {
        let (wakes, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        self.wakes = wakes
        do throws(WormholeError) {
            let cursor = try log.get().openCursor(consumer: consumer)
            let observation = try cursor.observeAppends { continuation.yield() }
            feed = Feed(cursor: .success(Locked(cursor)), observation: observation, decode: decode)
        } catch {
            feed = Feed(cursor: .failure(error), observation: nil, decode: decode)
        }
    }

    /// Acknowledges `message` and every message handed out before it: they are never delivered to this consumer
    /// again.
    public func acknowledge(_ message: QueueMessage<Message>) throws(WormholeError) {
        try feed.acknowledgePending(through: message.end)
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(feed: feed, wakes: wakes.makeAsyncIterator())
    }

    /// The iterator; asking for the next message acknowledges the previous one.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let feed: Feed
        var wakes: AsyncStream<Void>.AsyncIterator

        /// The next message; throws a ``WormholeError`` when the queue cannot be read or a message decoded (it stays
        /// unacknowledged).
        public mutating func next() async throws(WormholeError) -> QueueMessage<Message>? {
            let cursor = try feed.cursor.get()
            try feed.acknowledgePending()
            while !Task.isCancelled {
                // Reading the page cache does not wait; waiting for appends happens on the AsyncStream below.
                let record = try cursor.withLock { (cursor) throws(WormholeError) in
                    try cursor.read(maximumCount: 1).first
                }
                if let record {
                    let message = try feed.decode(record)
                    feed.pending.withLock { $0 = record.end }
                    return message
                }
                guard await wakes.next() != nil else { return nil }
            }
            return nil
        }
    }
}
