import Foundation

/// The messages one consumer of a queue gave up on, to look at, requeue or drop.
///
/// A consumer's ``QueueRetryPolicy`` sends here each message whose handler failed at its last attempt, and each
/// message it could not decode, with its bytes, offset, sender and time, its attempt count and the last error's text
/// (``QueueDeadLetter``); the consumer moves on. They stay until they are requeued or dropped, on every engine, across
/// restarts.
///
/// ```swift
/// let dead = try wormhole.queue("jobs").deadLetters(consumer: "worker")
/// for letter in try dead.list() {
///     print(letter.offset, letter.attempts, letter.lastError)
/// }
/// try dead.requeue()   // each is offered to the consumer again, from attempt 1
/// ```
///
/// The engine keeps them in a suite named `QUEUE#dead-letters#CONSUMER` (`FORMAT.md`, "Retries and dead letters").
public final class WormholeDeadLetters: Sendable {
    /// The queue's identifier.
    public let queue: String
    /// The consumer's name.
    public let consumer: String
    private let letters: any SuiteStore
    private let retries: any SuiteStore
    private let sender: String

    init(queue: WormholeQueue, consumer: String) throws(WormholeError) {
        try MessageIdentifier.validate(consumer)
        self.queue = queue.identifier
        self.consumer = consumer
        self.sender = queue.sender
        letters = try queue.engine.suiteStore(QueueWorkNames.deadLetters(queue: queue.identifier, consumer: consumer))
        retries = try queue.engine.suiteStore(QueueWorkNames.retries(queue: queue.identifier, consumer: consumer))
    }

    /// Every dead letter, by offset. An entry this version cannot read (``unreadableKeys``) is left out, and left
    /// where it is: ``drop(offsets:)`` removes it.
    public func list() throws(WormholeError) -> [QueueDeadLetter] {
        try read().letters
    }

    /// The keys of the entries that are not dead letters this version reads (written by a newer version, or
    /// damaged): checked before use, never offered.
    public var unreadableKeys: [String] {
        get throws(WormholeError) { try read().unreadable }
    }

    /// How many dead letters there are, readable or not.
    public var count: Int {
        get throws(WormholeError) { try letters.read().values.keys.count }
    }

    private func read() throws(WormholeError) -> (letters: [QueueDeadLetter], unreadable: [String]) {
        let values = try letters.read().values
        var result: [QueueDeadLetter] = []
        var unreadable: [String] = []
        for key in values.keys {
            guard let letter = values[key, as: QueueDeadLetter.self], letter.key == key, letter.end > letter.offset,
                letter.attempts >= 0
            else {
                unreadable.append(key)
                continue
            }
            result.append(letter)
        }
        return (result.sorted { $0.offset < $1.offset }, unreadable)
    }

    /// Offers dead letters to the consumer again, from attempt 1, as soon as it runs (now, when it is running): all of
    /// them, or those at `offsets`. Returns how many were requeued.
    ///
    /// Each goes into the consumer's retries before it leaves the dead letters: a process killed in between leaves
    /// it in both, and it is offered, and listed until it is dropped.
    @discardableResult
    public func requeue(offsets: [UInt64]? = nil) throws(WormholeError) -> Int {
        let chosen = try selected(offsets)
        guard !chosen.isEmpty else { return 0 }
        let now = ProcessFacts.wallClockNanoseconds()
        try retries.update(sender: sender, direction: "requeued") { (values) throws(WormholeError) in
            for letter in chosen {
                // A requeued message no longer expires: it is offered because it was asked for.
                let entry = SetAsideMessage(
                    record: letter.record,
                    attempts: 0,
                    notBeforeNanoseconds: now,
                    lastError: nil,
                    scheduled: letter.isScheduled
                )
                try values.set(entry, forKey: entry.key)
            }
        }
        try remove(chosen)
        return chosen.count
    }

    /// Removes dead letters for good: all of them (readable or not), or those at `offsets` (in the queue, or in its
    /// scheduled log: both are dropped). Returns how many were dropped.
    @discardableResult
    public func drop(offsets: [UInt64]? = nil) throws(WormholeError) -> Int {
        var dropped = 0
        try letters.update(sender: sender, direction: "removed") { values in
            let keys =
                offsets.map { offsets in
                    offsets.flatMap { [QueueWorkNames.key($0), QueueWorkNames.key($0, scheduled: true)] }
                } ?? values.keys
            dropped = 0
            for key in keys where values.json(forKey: key) != nil {
                values.removeValue(forKey: key)
                dropped += 1
            }
        }
        return dropped
    }

    private func selected(_ offsets: [UInt64]?) throws(WormholeError) -> [QueueDeadLetter] {
        let all = try list()
        guard let offsets else { return all }
        let wanted = Set(offsets)
        return all.filter { wanted.contains($0.offset) }
    }

    private func remove(_ chosen: [QueueDeadLetter]) throws(WormholeError) {
        guard !chosen.isEmpty else { return }
        try letters.update(sender: sender, direction: "removed") { values in
            for letter in chosen { values.removeValue(forKey: letter.key) }
        }
    }
}

extension WormholeQueue {
    /// The messages `consumer` gave up on (``QueueRetryPolicy``), to list, requeue or drop.
    ///
    /// - Throws: ``WormholeError/Code/invalidIdentifier`` for an invalid consumer name, or the engine's error.
    public func deadLetters(consumer: String) throws(WormholeError) -> WormholeDeadLetters {
        try WormholeDeadLetters(queue: self, consumer: consumer)
    }
}
