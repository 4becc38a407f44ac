import Foundation

/// When a queue message may be offered, and until when: a delay, a time, a time to live.
///
/// A message enqueued with a schedule is offered to each consumer no earlier than ``notBefore``, and, when it has
/// an ``expires`` time, never after it: a consumer that comes to it too late sends it to its dead letters with the
/// reason ``QueueDeadLetter/Reason/expired``, and its handler never sees it. Both are kept across restarts of every
/// process (and of the server, on PostgreSQL).
///
/// ```swift
/// try jobs.enqueue(Job(id: 2), schedule: .after(.seconds(30)))
/// try jobs.enqueue(Job(id: 3), schedule: .at(nineOClock).expiring(after: .seconds(600)))
/// ```
///
/// A scheduled message is offered when its time comes, in either ``QueueRetryPolicy/Order-swift.enum``: it has no
/// place in the order of the queue's other messages. Times are the wall clock's, as processes on several hosts share
/// it.
public struct QueueSchedule: Sendable, Hashable {
    /// The earliest time the message is offered; nil: at once.
    public var notBefore: Date?
    /// The time after which it is no longer offered; nil: never.
    public var expires: Date?

    /// A schedule; with neither time, the message is offered at once and never expires.
    public init(notBefore: Date? = nil, expires: Date? = nil) {
        self.notBefore = notBefore
        self.expires = expires
    }

    /// Offered after `delay` from now.
    public static func after(_ delay: Duration) -> QueueSchedule {
        QueueSchedule(notBefore: Date().addingTimeInterval(max(0, delay.milliseconds / 1000)))
    }

    /// Offered at `date`, or at once when it has passed.
    public static func at(_ date: Date) -> QueueSchedule {
        QueueSchedule(notBefore: date)
    }

    /// Offered at once, and no longer after `lifetime` from now.
    public static func expiring(after lifetime: Duration) -> QueueSchedule {
        QueueSchedule().expiring(after: lifetime)
    }

    /// This schedule, expiring `lifetime` after the message is due: after ``notBefore``, or after now when it has
    /// none.
    public func expiring(after lifetime: Duration) -> QueueSchedule {
        var schedule = self
        schedule.expires = (notBefore ?? Date()).addingTimeInterval(max(0, lifetime.milliseconds / 1000))
        return schedule
    }
}

/// A record of a queue's scheduled log (`QUEUE#scheduled`): a message and its schedule, as JSON
/// (`FORMAT.md`, "Scheduled messages").
struct ScheduledEnvelope: Codable, Sendable {
    /// The earliest time it may be offered, in nanoseconds since 1970.
    var notBeforeNanoseconds: Int64
    /// When it is no longer offered, in nanoseconds since 1970.
    var expiresNanoseconds: Int64?
    /// The message's bytes, as the wormhole's coder made them.
    var payload: Data

    init(schedule: QueueSchedule, payload: Data) {
        notBeforeNanoseconds = schedule.notBefore.map(Self.nanoseconds) ?? ProcessFacts.wallClockNanoseconds()
        expiresNanoseconds = schedule.expires.map(Self.nanoseconds)
        self.payload = payload
    }

    /// A date in nanoseconds since 1970, within `Int64`.
    static func nanoseconds(_ date: Date) -> Int64 {
        let value = date.timeIntervalSince1970 * 1e9
        guard value.isFinite else { return value > 0 ? .max : .min }
        return Int64(max(Double(Int64.min), min(Double(Int64.max) - 1024, value)))
    }

    func encoded() throws(WormholeError) -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        do {
            return try encoder.encode(self)
        } catch {
            throw WormholeError(
                .encodingFailed,
                "Could not encode a scheduled message: \(error).",
                underlyingError: error
            )
        }
    }

    /// The envelope a record holds, or nil when it holds none this version reads.
    static func decode(_ data: Data) -> ScheduledEnvelope? {
        try? JSONDecoder().decode(ScheduledEnvelope.self, from: data)
    }
}
