import Foundation

/// A message as stored in a mailbox: the encoded payload and what the wormhole records about it.
///
/// The transiting assigns ``sequence`` when it stores the message, so sequences of one mailbox only grow. A
/// mailbox that is deleted and made anew gets a new ``generation``; a listener compares both to deliver each
/// message once and never an older one after a newer one.
public struct Envelope: Sendable, Hashable {
    /// The version of the on-disk format that this build writes (see `FORMAT.md`).
    public static let formatVersion: UInt16 = 1

    /// The message's place in its mailbox: 1 for the first message, one more for each later one.
    public var sequence: UInt64
    /// Which incarnation of the mailbox holds the message; a new random value whenever the mailbox is created anew.
    public var generation: UInt64
    /// Who passed the message: by default the process name and id, as `name[pid]`.
    public var sender: String
    /// When the message was passed, in nanoseconds since 1970-01-01 UTC.
    public var timestampNanoseconds: Int64
    /// The encoded message (JSON by default).
    public var payload: Data

    /// When the message was passed.
    public var date: Date { Date(timeIntervalSince1970: Double(timestampNanoseconds) / 1e9) }

    /// Creates an envelope; transitings call this when they read or store a message.
    public init(sequence: UInt64, generation: UInt64, sender: String, timestampNanoseconds: Int64, payload: Data) {
        self.sequence = sequence
        self.generation = generation
        self.sender = sender
        self.timestampNanoseconds = timestampNanoseconds
        self.payload = payload
    }

    /// Whether this envelope is newer than one already seen: a later sequence, or a mailbox made anew.
    public func supersedes(_ other: Envelope) -> Bool {
        generation != other.generation || sequence > other.sequence
    }
}
