import Foundation
import Logging

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
        /// How many messages wait for another attempt (set aside by its ``QueueRetryPolicy``); nil in an engine's own
        /// report, which ``WormholeQueue/status()`` fills in.
        public var waitingForRetry: Int?
        /// When the first of them comes due, in nanoseconds since 1970; nil when none waits.
        public var nextRetryNanoseconds: Int64?
        /// How many messages it gave up on (``WormholeDeadLetters``); nil in an engine's own report.
        public var deadLetters: Int?
        /// How many messages enqueued with a ``QueueSchedule`` wait for their time; nil in an engine's own report.
        public var scheduled: Int?

        /// Creates a consumer's status, as an engine's ``QueueLog`` reports it.
        public init(name: String, offset: UInt64, lagBytes: UInt64, lagMessages: Int) {
            self.name = name
            self.offset = offset
            self.lagBytes = lagBytes
            self.lagMessages = lagMessages
        }
    }

    /// The queue's identifier.
    public var identifier: String
    /// The offset just past the last message.
    public var endOffset: UInt64
    /// The registered consumers, by name.
    public var consumers: [Consumer]

    /// Creates a queue's status, as an engine's ``QueueLog`` reports it.
    public init(identifier: String, endOffset: UInt64, consumers: [Consumer]) {
        self.identifier = identifier
        self.endOffset = endOffset
        self.consumers = consumers
    }
}
