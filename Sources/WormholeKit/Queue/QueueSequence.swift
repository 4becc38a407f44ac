import Foundation
import Synchronization

/// The messages of a queue a consumer has not handled, then each new one, as an `AsyncSequence`; see
/// ``WormholeQueue/messages(consumer:as:)``. Iterate it once.
///
/// A message counts as handled, and the consumer's position moves past it, when the iteration asks for the next
/// one, or when you call ``acknowledge(_:)``: do that before leaving a loop with `break`, so that the last message is
/// not delivered again.
///
/// ```swift
/// let jobs = try await wormhole.queue("jobs").messages(consumer: "worker", as: String.self)
/// for try await job in jobs {
///     print(job.value)
///     try await jobs.acknowledge(job)
///     break
/// }
/// ```
public struct QueueSequence<Message: Decodable & Sendable>: AsyncSequence, Sendable {
    public typealias Element = QueueMessage<Message>
    public typealias Failure = WormholeError

    /// The consumer's cursor behind its lock, the messages handed out and not acknowledged, and the wake-ups.
    final class Feed: Sendable {
        let cursor: Locked<any QueueCursor>
        let decode: @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Message>
        /// The end of the last message handed out, not yet acknowledged.
        let pending = Locked<UInt64?>(nil)
        let observation: NotifierObservation
        /// Whether the cursor's calls may wait (``QueueCursor/callsMayWait``): then they run off the cooperative pool.
        let callsMayWait: Bool

        init(
            cursor: any QueueCursor,
            observation: NotifierObservation,
            decode: @escaping @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Message>
        ) {
            callsMayWait = cursor.callsMayWait
            self.cursor = Locked(cursor)
            self.observation = observation
            self.decode = decode
        }

        /// Runs a step of the cursor's: on a thread that may block when its calls may wait, here otherwise.
        func perform<Value: Sendable>(
            _ step: @escaping @Sendable () throws(WormholeError) -> Value
        ) async throws(WormholeError) -> Value {
            guard callsMayWait else { return try step() }
            return try await runBlocking(step)
        }

        deinit { observation.cancel() }

        /// Stores the position past the messages handed out so far.
        func acknowledgePending(through end: UInt64? = nil) throws(WormholeError) {
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

    /// Opens `consumer`'s position in `log` (registering a new consumer) and watches the log's appends, on a Dispatch
    /// worker thread: opening may wait for a flush or a server, never on the cooperative pool.
    static func open(
        log: any QueueLog,
        consumer: String,
        decode: @escaping @Sendable (QueueRecord) throws(WormholeError) -> QueueMessage<Message>
    ) async throws(WormholeError) -> QueueSequence {
        let (wakes, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let feed = try await runBlocking { () throws(WormholeError) -> Feed in
            let cursor = try log.openCursor(consumer: consumer)
            let observation = try cursor.observeAppends { continuation.yield() }
            return Feed(cursor: cursor, observation: observation, decode: decode)
        }
        return QueueSequence(feed: feed, wakes: wakes)
    }

    private init(feed: Feed, wakes: AsyncStream<Void>) {
        self.feed = feed
        self.wakes = wakes
    }

    /// Acknowledges `message` and every message handed out before it: they are never delivered to this consumer
    /// again.
    ///
    /// Where storing the position may wait (a flush with `synchronizesWrites`, a server), it waits on a Dispatch worker
    /// thread, never on the cooperative thread pool.
    public func acknowledge(_ message: QueueMessage<Message>) async throws(WormholeError) {
        let feed = self.feed
        let end = message.end
        try await feed.perform { () throws(WormholeError) in try feed.acknowledgePending(through: end) }
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
            let cursor = feed.cursor
            let feed = self.feed
            var acknowledging = true
            while !Task.isCancelled {
                // The previous message acknowledged, then the next one read: off the cooperative pool when the cursor
                // may wait (a flush, a server); waiting for appends happens on the AsyncStream below.
                let acknowledge = acknowledging
                let record = try await feed.perform { () throws(WormholeError) -> QueueRecord? in
                    if acknowledge { try feed.acknowledgePending() }
                    return try cursor.withLock { (cursor) throws(WormholeError) in
                        try cursor.read(maximumCount: 1).first
                    }
                }
                acknowledging = false
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

/// An iterator belongs to the task that iterates: it is not `Sendable`.
@available(*, unavailable)
extension QueueSequence.AsyncIterator: Sendable {}
