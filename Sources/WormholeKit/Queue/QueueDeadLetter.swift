import Foundation

/// A message a consumer gave up on: its handler failed at every attempt the consumer's ``QueueRetryPolicy``
/// allowed, or it could not be decoded.
///
/// It keeps everything the message was: its bytes, its offset in the queue, who enqueued it and when, with how many
/// times it was offered and the text of the last error. ``WormholeDeadLetters`` lists them, requeues them and drops
/// them.
public struct QueueDeadLetter: Sendable, Hashable, Codable, KeepsQueueRecord {
    /// Why a message went to the dead letters.
    public enum Reason: String, Sendable, Hashable, Codable {
        /// Its handler failed at its last attempt.
        case failed
        /// It could not be decoded as the consumer's message type.
        case undecodable
        /// Its time to live (``QueueSchedule/expires``) ran out before it was handled: its handler never saw it.
        case expired
    }

    /// The message's offset in its queue, or in the queue's scheduled log when ``isScheduled``.
    public var offset: UInt64
    /// The position just past the message there.
    public var end: UInt64
    /// Stored as `scheduled`, absent when false.
    var scheduled: Bool?
    /// Whether the message was enqueued with a ``QueueSchedule``: its offset is then in the queue's scheduled log.
    public var isScheduled: Bool { scheduled ?? false }
    /// Who enqueued it.
    public var sender: String
    /// When it was enqueued, in nanoseconds since 1970.
    public var timestampNanoseconds: Int64
    /// How many times it was offered.
    public var attempts: Int
    /// Why it went to the dead letters.
    public var reason: Reason
    /// The text of the last error.
    public var lastError: String
    /// When it went to the dead letters, in nanoseconds since 1970.
    public var deadLetteredNanoseconds: Int64
    /// The message's bytes, as enqueued.
    public var payload: Data

    /// When it was enqueued.
    public var date: Date { Date(timeIntervalSince1970: Double(timestampNanoseconds) / 1e9) }

    /// When it went to the dead letters.
    public var deadLetteredDate: Date { Date(timeIntervalSince1970: Double(deadLetteredNanoseconds) / 1e9) }

    /// Its key in the dead-letters suite.
    var key: String { QueueWorkNames.key(offset, scheduled: isScheduled) }

    /// Creates a dead letter.
    public init(
        offset: UInt64,
        end: UInt64,
        sender: String,
        timestampNanoseconds: Int64,
        attempts: Int,
        reason: Reason,
        lastError: String,
        deadLetteredNanoseconds: Int64,
        payload: Data,
        isScheduled: Bool = false
    ) {
        self.scheduled = isScheduled ? true : nil
        self.offset = offset
        self.end = end
        self.sender = sender
        self.timestampNanoseconds = timestampNanoseconds
        self.attempts = attempts
        self.reason = reason
        self.lastError = lastError
        self.deadLetteredNanoseconds = deadLetteredNanoseconds
        self.payload = payload
    }
}

/// A message set aside by a consumer until its next attempt: the value of its key in the consumer's retries suite.
struct SetAsideMessage: Sendable, Hashable, Codable, KeepsQueueRecord {
    /// The message's offset and end in its queue.
    var offset: UInt64
    var end: UInt64
    var sender: String
    var timestampNanoseconds: Int64
    /// How many attempts failed so far (a message put off by ``QueueOutcome/later(_:)`` does not count one).
    var attempts: Int
    /// When it may be offered again, in nanoseconds since 1970.
    var notBeforeNanoseconds: Int64
    /// The text of the last failure, if any.
    var lastError: String?
    var payload: Data
    /// True for a message enqueued with a schedule, whose offset is in the scheduled log; absent when false.
    var scheduled: Bool?
    /// When a scheduled message is no longer offered, in nanoseconds since 1970.
    var expiresNanoseconds: Int64?
    /// A random number drawn for each entry written: a consumer removes an entry only while it is the one it wrote
    /// (a dead letter requeued by another process meanwhile is another entry). Absent in entries that have none.
    var revision: UInt64?
    /// True once the message was offered to the consumer's handler (it failed, or was put off); absent before.
    var offered: Bool?

    init(
        record: QueueRecord,
        attempts: Int,
        notBeforeNanoseconds: Int64,
        lastError: String?,
        scheduled: Bool = false,
        expiresNanoseconds: Int64? = nil
    ) {
        self.scheduled = scheduled ? true : nil
        self.expiresNanoseconds = expiresNanoseconds
        // At most 2^53: a JSON reader that reads numbers as doubles (jq) reads it exactly.
        self.revision = UInt64.random(in: 1...(1 << 53))
        offset = record.offset
        end = record.end
        sender = record.sender
        timestampNanoseconds = record.timestampNanoseconds
        self.attempts = attempts
        self.notBeforeNanoseconds = notBeforeNanoseconds
        self.lastError = lastError
        payload = record.payload
    }

    /// Whether the message came from the scheduled log.
    var isScheduled: Bool { scheduled ?? false }

    /// Whether it is a scheduled message that has not been offered yet: its time is its own, which nothing brings
    /// forward.
    var waitsForItsTime: Bool { isScheduled && offered != true }

    /// Its key in the retries suite.
    var key: String { QueueWorkNames.key(offset, scheduled: isScheduled) }

    /// Whether what was read makes sense: an entry that does not is reported and left where it is.
    var isValid: Bool { end > offset && attempts >= 0 }

    /// Whether it may no longer be offered.
    func hasExpired(at now: Int64) -> Bool { expiresNanoseconds.map { $0 <= now } ?? false }
}

/// The names of a consumer's retries and dead letters, suites of the queue's engine.
enum QueueWorkNames {
    /// The key of a message's entry: its offset, zero-padded so that keys sort as offsets do, after an `s` for an
    /// offset in the scheduled log.
    static func key(_ offset: UInt64, scheduled: Bool = false) -> String {
        let digits = String(offset)
        return (scheduled ? "s" : "") + String(repeating: "0", count: max(0, 20 - digits.utf8.count)) + digits
    }

    static func scheduled(queue: String) -> String { name(queue, "scheduled", nil) }

    static func retries(queue: String, consumer: String) -> String { name(queue, "retries", consumer) }

    static func deadLetters(queue: String, consumer: String) -> String { name(queue, "dead-letters", consumer) }

    /// `QUEUE#KIND#CONSUMER`; when that is longer than an identifier may be, a prefix of it and a hash of the whole
    /// (FNV-1a, the same in every process and on every platform).
    private static func name(_ queue: String, _ kind: String, _ consumer: String?) -> String {
        let full = consumer.map { "\(queue)#\(kind)#\($0)" } ?? "\(queue)#\(kind)"
        guard full.utf8.count > MessageIdentifier.maximumLength else { return full }
        let suffix = "#" + String(LiveSocketNaming.hash(full), radix: 16)
        // Whole characters only, so that the name stays valid UTF-8 within the limit.
        var prefix = ""
        for character in full {
            guard prefix.utf8.count + character.utf8.count + suffix.utf8.count <= MessageIdentifier.maximumLength
            else { break }
            prefix.append(character)
        }
        return prefix + suffix
    }
}

/// A value that keeps the fields of the queue record it was made from.
protocol KeepsQueueRecord {
    var offset: UInt64 { get }
    var end: UInt64 { get }
    var sender: String { get }
    var timestampNanoseconds: Int64 { get }
    var payload: Data { get }
}

extension KeepsQueueRecord {
    /// The record it was.
    var record: QueueRecord {
        QueueRecord(
            offset: offset,
            end: end,
            sender: sender,
            timestampNanoseconds: timestampNanoseconds,
            payload: payload
        )
    }
}
