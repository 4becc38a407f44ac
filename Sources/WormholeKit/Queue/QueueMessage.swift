import Foundation
import Logging

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

    /// The position just past the message: where its consumer's position moves when it is acknowledged.
    public var end: UInt64

    /// Which time the message is offered to this consumer: 1 at first, one more after each failed attempt (a
    /// message put off with ``QueueOutcome/later(_:)`` keeps its number). See ``QueueRetryPolicy``.
    public var attempt: Int

    /// Whether the message was enqueued with a ``QueueSchedule``: its ``offset`` is then in the queue's scheduled log,
    /// not in the queue.
    public var isScheduled: Bool = false

    init(record: QueueRecord, value: Value, attempt: Int = 1) {
        self.attempt = attempt
        offset = record.offset
        end = record.end
        sender = record.sender
        timestampNanoseconds = record.timestampNanoseconds
        payload = record.payload
        self.value = value
    }

    /// When it was enqueued.
    public var date: Date { Date(timeIntervalSince1970: Double(timestampNanoseconds) / 1e9) }
}
