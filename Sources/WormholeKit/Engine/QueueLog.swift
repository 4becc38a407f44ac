import Foundation

/// The storage of a durable queue: an append-only log of records, and a durable position per named consumer.
///
/// ``WormholeQueue`` encodes messages, runs handlers and builds sequences on top of it. An engine's log must keep
/// these promises, which the queue contract tests check for every engine:
///
/// - Appending a batch is atomic and ordered: consumers see all its records, in order, with no record of another
///   append in between, or (after a crash or a full disk mid-append) a first part of it and never a torn record.
/// - Every record has an ``QueueRecord/offset`` greater than every record before it; ``QueueRecord/end`` is the
///   position just past it. Records are read in offset order, which is the order their appends completed.
/// - A consumer's position only moves when ``QueueCursor/acknowledge(through:)`` stores it; reading does not move
///   it. A new consumer starts at the oldest record kept and holds back reclaiming from then on.
/// - ``QueueCursor/observeAppends(_:)`` calls its handler, at least once, after each append that completes after it
///   returned, in this process or another.
///
/// Not yet stable: it may change in a minor release before 1.0 (see ``WormholeEngine``).
public protocol QueueLog: Sendable {
    /// The queue's identifier.
    var identifier: String { get }

    /// Appends each payload as one record, in order, in one atomic step.
    ///
    /// - Throws: ``WormholeError/Code/messageTooLarge`` (nothing appended), ``WormholeError/Code/diskFull`` and
    ///   other storage codes.
    func append(contentsOf payloads: some Sequence<Data>) throws(WormholeError)

    /// Appends one payload as one record; an engine may do it faster than a batch of one.
    func append(_ payload: Data) throws(WormholeError)

    /// Opens the durable position of `consumer`, registering the consumer if it is new.
    func openCursor(consumer: String) throws(WormholeError) -> any QueueCursor

    /// The log's end, and each registered consumer's position and lag.
    func status() throws(WormholeError) -> QueueStatus

    /// Frees what every registered consumer has passed; consumers not seen within the retention are dropped first.
    func reclaimSpace() throws(WormholeError)

    /// Makes a consumer's stored position survive a power cut, for a caller about to forget something that only
    /// that position makes unnecessary (a received file's delivery marker). Engines whose positions are durable once
    /// stored need not implement it.
    func synchronizePosition(of consumer: String) throws(WormholeError)
}

extension QueueLog {
    /// Does nothing: the engine's positions are durable once stored.
    public func synchronizePosition(of consumer: String) throws(WormholeError) {}

    /// Appends one payload as a batch of one.
    public func append(_ payload: Data) throws(WormholeError) {
        try append(contentsOf: CollectionOfOne(payload))
    }
}

/// One consumer's reading and stored position in a ``QueueLog``.
///
/// A cursor is used by one reader at a time (its owner serialises the calls), so it need not be thread-safe; it is
/// `Sendable` so that the owner may move it between threads.
public protocol QueueCursor: AnyObject, Sendable {
    /// The consumer's name.
    var consumer: String { get }

    /// The stored position: the offset of the next record to deliver.
    var position: UInt64 { get }

    /// Up to `maximumCount` records from the stored position, without moving it; empty when none is whole yet.
    ///
    /// An engine may return fewer records than there are (to bound the bytes of one batch).
    func read(maximumCount: Int) throws(WormholeError) -> [QueueRecord]

    /// Stores the position `end` (a record's ``QueueRecord/end``): the records before it are handled and are never
    /// read through this consumer again.
    func acknowledge(through end: UInt64) throws(WormholeError)

    /// Acknowledges through `end`, as ``acknowledge(through:)``, then reads up to `maximumCount` records from the new
    /// position, as ``read(maximumCount:)``.
    ///
    /// A consumer calls this after each batch it handled. The default implementation calls the two in turn; an engine
    /// whose calls cross a network does both in one round trip.
    func acknowledge(through end: UInt64, thenRead maximumCount: Int) throws(WormholeError) -> [QueueRecord]

    /// Calls `handler` after appends to the log, until the observation is cancelled or released.
    func observeAppends(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation

    /// Whether a call of this cursor may wait (for a disk flush, a server's answer): ``QueueSequence`` then makes its
    /// calls on a thread that may block, never on Swift's cooperative pool. The default implementation says true.
    var callsMayWait: Bool { get }
}

extension QueueCursor {
    /// True: a cursor that does not say otherwise is called off Swift's cooperative pool from `async` code.
    public var callsMayWait: Bool { true }

    /// Acknowledges through `end`, then reads from the new position: two calls.
    public func acknowledge(through end: UInt64, thenRead maximumCount: Int) throws(WormholeError) -> [QueueRecord] {
        try acknowledge(through: end)
        return try read(maximumCount: maximumCount)
    }
}

/// A record of a queue's log, as an engine stores it.
public struct QueueRecord: Sendable, Equatable {
    /// The record's position in the log: its id, growing with each append.
    public var offset: UInt64
    /// The position just past the record, where the next one starts.
    public var end: UInt64
    /// Who appended it.
    public var sender: String
    /// When it was appended, in nanoseconds since 1970.
    public var timestampNanoseconds: Int64
    /// The bytes as appended.
    public var payload: Data

    /// Creates a record.
    public init(offset: UInt64, end: UInt64, sender: String, timestampNanoseconds: Int64, payload: Data) {
        self.offset = offset
        self.end = end
        self.sender = sender
        self.timestampNanoseconds = timestampNanoseconds
        self.payload = payload
    }
}
