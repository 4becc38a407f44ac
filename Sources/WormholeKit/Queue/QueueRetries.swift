import Dispatch
import Foundation
import Synchronization

/// One consumer's attempts, retries and dead letters: what its ``QueueRetryPolicy`` makes of a handler's failures.
///
/// A message that waits for its next attempt is *set aside*: written, with its bytes and its attempt count, to the
/// consumer's retries suite (`QUEUE#retries#CONSUMER`, one key per message, its offset), before the consumer's
/// position moves past it. A message given up on goes to the dead-letters suite (`QUEUE#dead-letters#CONSUMER`)
/// before it leaves the retries. Suites are atomic and durable on every engine, so a consumer killed at any moment
/// finds each message in one of three places (the queue past its position, its retries, its dead letters), or in
/// two of them, when it was killed between the two writes, and then the later place wins: a set-aside message found
/// again in the queue at the position is passed over, and a retries entry whose message is a dead letter too is
/// removed when the consumer starts (`FORMAT.md`, "Retries and dead letters").
///
/// Every call comes from the consumer's delivery (``QueueConsumer``'s, one at a time, under its cursor's lock), but
/// for the suite's observer (which only adds entries another process wrote), ``wake(at:)``'s timer (which only wakes
/// the consumer) and ``takeScheduled(_:)``, which the scheduled log's consumer calls on its own queue (it only adds
/// entries, which the delivery offers once that consumer's position is past them). Each state is under its lock.
final class QueueRetries: Sendable {
    /// What the handler made of one attempt.
    enum Attempt {
        case done
        case later(Duration)
        case failed(any Error)
    }

    let policy: QueueRetryPolicy
    private let queue: String
    private let consumerName: String
    private let sender: String
    private let retries: any SuiteStore
    private let deadLetters: any SuiteStore
    /// The longest a set-aside message waits, whatever its entry says: a clock set back, or an entry from elsewhere,
    /// never holds a message for longer than the queue keeps its consumers.
    private let longestWait: Int64
    private let report: @Sendable (WormholeError) -> Void
    /// The set-aside messages by key, as the retries suite holds them.
    private let pending = Locked<[String: SetAsideMessage]>([:])
    /// In strict order, the message at the position put off (``QueueOutcome/later(_:)``) until a time: in memory
    /// only, as the position holds it anyway (a restarted consumer offers it at once).
    private let holds = Locked<[UInt64: Int64]>([:])
    /// Messages handled whose entry could not be removed: gone from ``pending`` (so never offered again by this
    /// process), and removed from the suite at the next pass.
    private let owedResolutions = Locked<[String: UInt64?]>([:])
    private let consumer = Locked<WeakConsumer>(WeakConsumer())
    /// The consumer of the queue's scheduled log, woken again when what it read could not be stored.
    private let scheduledConsumer = Locked<WeakConsumer>(WeakConsumer())
    /// The lineage and version of the retries suite that this consumer's last write made: a reload that read an
    /// older version of that lineage is dropped, as it could bring back what was resolved since.
    private let ownVersion = Locked<(lineage: UInt64, version: UInt64)>((0, 0))
    /// Watches the retries suite for entries another process adds (``WormholeDeadLetters/requeue(offsets:)``).
    private let observation = Locked<NotifierObservation?>(nil)
    /// The earliest time a timer is set for, and a count that cancels the timers set before.
    private let timer = Locked<(deadline: Int64?, generation: UInt64)>((nil, 0))
    private let stopped = Locked(false)
    /// Whether ``pending``, ``holds`` and ``owedResolutions`` are all empty, readable without their locks.
    private let empty = Atomic<Bool>(true)
    /// See ``holdsNoQueueMessage``.
    private let noQueueMessage = Atomic<Bool>(true)

    private struct WeakConsumer: @unchecked Sendable {
        weak var core: QueueConsumer?
    }

    init(
        policy: QueueRetryPolicy,
        queue: String,
        consumer: String,
        sender: String,
        engine: any WormholeEngine,
        longestWait: Duration,
        report: @escaping @Sendable (WormholeError) -> Void
    ) throws(WormholeError) {
        self.policy = policy
        self.queue = queue
        self.consumerName = consumer
        self.sender = sender
        self.retries = try engine.suiteStore(QueueWorkNames.retries(queue: queue, consumer: consumer))
        self.deadLetters = try engine.suiteStore(QueueWorkNames.deadLetters(queue: queue, consumer: consumer))
        self.longestWait = Self.nanoseconds(longestWait)
        self.report = report
        // Watching first: an entry requeued while the suite is read is then merged, not missed.
        let watch = try retries.observe { [weak self] in
            guard let self, !stopped.withLock({ $0 }) else { return }
            do throws(WormholeError) { try load(merging: true) } catch { report(error) }
        }
        observation.withLock { $0 = watch }
        try load(merging: false)
        try forgetDeadLetteredEntries()
    }

    deinit { stop() }

    /// The consumer to wake when a set-aside message comes due, and the consumer of the scheduled log.
    func attach(_ core: QueueConsumer, scheduled: QueueConsumer) {
        consumer.withLock { $0.core = core }
        scheduledConsumer.withLock { $0.core = scheduled }
    }

    /// Stops watching the suite and waking the consumer: it was cancelled.
    func stop() {
        stopped.withLock { $0 = true }
        let watch = observation.withLock { watch in
            defer { watch = nil }
            return watch
        }
        watch?.cancel()
        timer.withLock { timer in
            timer.deadline = nil
            timer.generation &+= 1
        }
    }

    /// Reads the set-aside messages; an entry that cannot be read is reported and left in the suite. Merging, only
    /// entries this process does not know, or knows another revision of, are taken (requeued dead letters), and the
    /// consumer is woken for them.
    private func load(merging: Bool) throws(WormholeError) {
        let state = try retries.read()
        var loaded: [String: SetAsideMessage] = [:]
        for key in state.values.keys {
            guard let entry = state.values[key, as: SetAsideMessage.self], entry.isValid, entry.key == key else {
                if !merging {
                    report(
                        WormholeError(
                            .corruptMessage,
                            "The retry entry \(key) of consumer \(consumerName) is not one this version can read; it "
                                + "is left in the suite \(retries.name), and never offered.",
                            identifier: queue
                        )
                    )
                }
                continue
            }
            loaded[key] = entry
        }
        let owed = owedResolutions.withLock { $0 }
        let added = pending.withLock { pending -> Bool in
            guard merging else {
                pending = loaded.filter { owed[$0.key] == nil }
                ownVersion.withLock { $0 = (state.lineage, state.version) }
                return false
            }
            let own = ownVersion.withLock { $0 }
            guard state.lineage != own.lineage || state.version >= own.version else { return false }
            // A suite that started over (its file removed, say) is taken as it is now.
            if state.lineage != own.lineage { ownVersion.withLock { $0 = (state.lineage, state.version) } }
            var added = false
            // The suite is at least as new as this consumer's last write: an entry it does not know, or of another
            // revision, was written since by another process (a requeue).
            for (key, entry) in loaded where pending[key]?.revision != entry.revision && owed[key] == nil {
                pending[key] = entry
                added = true
            }
            return added
        }
        noteChange()
        if added { wake(at: Self.now()) }
    }

    /// Removes the entries of messages that are dead letters too, written before their dead letter (a consumer
    /// killed between its two writes), so that none gets an attempt beyond its last. An entry written after its dead
    /// letter is a requeue under way (killed, or not yet done, before it removed the dead letter), and stays.
    private func forgetDeadLetteredEntries() throws(WormholeError) {
        guard !isEmpty else { return }
        let dead = try deadLetters.read().values
        let both = pending.withLock { pending in
            pending.filter { key, entry in
                guard let letter = dead[key, as: QueueDeadLetter.self] else { return dead.json(forKey: key) != nil }
                return entry.notBeforeNanoseconds < letter.deadLetteredNanoseconds
            }.map { ($0.key, $0.value.revision) }
        }
        try resolve(both)
    }

    /// Whether any message is set aside or put off, or an entry is owed a removal: a pass with nothing of the
    /// kind offers nothing from the retries.
    var isEmpty: Bool { empty.load(ordering: .acquiring) }

    /// Whether no message read from the queue itself can have an entry or a hold: the consumer's success path checks
    /// only this, one atomic load per batch. (A scheduled message waiting for its time does not count: its key is
    /// of the scheduled log.)
    var holdsNoQueueMessage: Bool { noQueueMessage.load(ordering: .acquiring) }

    /// Brings ``empty`` and ``noQueueMessage`` up to date after a change of ``pending``, ``holds`` or
    /// ``owedResolutions``.
    ///
    /// Read and stored under ``pending``'s lock (with ``holds``' and ``owedResolutions``' inside it, an order nothing
    /// else nests the other way), so that two threads noting changes at once store the state the later one read.
    private func noteChange() {
        pending.withLock { pending in
            let noHolds = holds.withLock { $0.isEmpty }
            let noneOwed = owedResolutions.withLock { $0.isEmpty }
            empty.store(pending.isEmpty && noHolds && noneOwed, ordering: .releasing)
            noQueueMessage.store(noHolds && !pending.values.contains { !$0.isScheduled }, ordering: .releasing)
        }
    }

    /// What a message read from the queue at the consumer's position is to this consumer.
    enum Standing {
        /// Never set aside: its first attempt.
        case fresh
        /// Set aside already (unordered order), by a consumer killed before its position moved past it: pass over.
        case setAside
        /// Strict order: it waits until this time (nanoseconds since 1970).
        case waiting(Int64)
        /// Strict order: its next attempt, after those its entry counts.
        case due(SetAsideMessage)
    }

    /// The standing of the message at `offset`, read from the queue at the consumer's position.
    func standing(of offset: UInt64) -> Standing {
        let now = Self.now()
        if let until = holds.withLock({ $0[offset] }) {
            if until > now { return .waiting(until) }
            _ = holds.withLock { $0.removeValue(forKey: offset) }
            noteChange()
        }
        guard let found = pending.withLock({ $0[QueueWorkNames.key(offset)] }) else { return .fresh }
        if policy.order == .unordered { return .setAside }
        let time = notBefore(of: found)
        return time > now ? .waiting(time) : .due(found)
    }

    /// The set-aside messages whose time has come, by key; the consumer is woken when the next of the others comes
    /// due.
    ///
    /// Of the queue's own messages, only those before `position`: one at or past it is the queue's to offer (in
    /// strict order the consumer offers it there; in unordered order one found there is passed over, as it was set
    /// aside before the position could move past it). Of the scheduled log's, only those before
    /// `scheduledPosition`, for the same reason: one there is taken from the log again.
    func due(before position: UInt64, scheduledBefore scheduledPosition: UInt64) -> [SetAsideMessage] {
        let now = Self.now()
        let eligible = pending.withLock { pending in
            pending.values.filter { entry in entry.offset < (entry.isScheduled ? scheduledPosition : position) }
        }
        var ready: [SetAsideMessage] = []
        var next: Int64?
        for entry in eligible {
            let time = notBefore(of: entry)
            if time <= now { ready.append(entry) } else { next = min(next ?? .max, time) }
        }
        if let next { wake(at: next) }
        return ready.sorted { $0.key < $1.key }
    }

    /// When an entry may be offered: no later than ``longestWait`` from now.
    private func notBefore(of entry: SetAsideMessage) -> Int64 {
        min(entry.notBeforeNanoseconds, Self.now().addingClamped(longestWait))
    }

    /// Whether the consumer was cancelled.
    var consumerIsCancelled: Bool { consumer.withLock { $0.core }?.isCancelled ?? true }

    // MARK: Outcomes

    /// One message of an attempt: its record, its attempt number (1 for the first) and its entry, if it was set aside.
    typealias Item = (record: QueueRecord, number: Int, entry: SetAsideMessage?)

    /// Records what a handler made of one attempt of `batch` (one message, or a batch that one handler call took).
    ///
    /// - Parameter atPosition: Whether the messages were read from the queue at the consumer's position, not from
    ///   the retries: in strict order such messages wait there, held by the position.
    /// - Returns: Whether the consumer's position may move past the messages: false in strict order while they wait
    ///   (the consumer is woken when they are due), and when a failure or a delay could not be stored (they are
    ///   offered again in a second). A message handled is never offered again, whatever the writes do.
    func settle(_ batch: [Item], _ attempt: Attempt, atPosition: Bool) -> Bool {
        let now = Self.now()
        let holdsAtPosition = atPosition && policy.order == .strict
        do throws(WormholeError) {
            switch attempt {
            case .done:
                let entries = batch.compactMap { $0.entry.map { ($0.key, $0.revision) } }
                do throws(WormholeError) {
                    try resolve(entries)
                } catch {
                    // Handled: forgotten here, and removed from the suite at the next pass.
                    pending.withLock { pending in for (key, _) in entries { pending.removeValue(forKey: key) } }
                    owedResolutions.withLock { owed in for (key, revision) in entries { owed[key] = revision } }
                    noteChange()
                    report(error)
                }
                return true
            case .later(let delay):
                let notBefore = now.addingClamped(Self.nanoseconds(delay))
                if holdsAtPosition {
                    // Held where it is, by the position: nothing to store.
                    holds.withLock { holds in for item in batch { holds[item.record.offset] = notBefore } }
                    noteChange()
                    wake(at: notBefore)
                    return false
                }
                try setAside(batch.map { ($0, $0.number - 1, notBefore, $0.entry?.lastError) })
                wake(at: notBefore)
                return true
            case .failed(let error):
                let text = String(describing: error)
                var kept: [(Item, Int, Int64, String?)] = []
                var given: [(Item, Int, String)] = []
                // One draw for the batch: in strict order its messages come back together.
                let spread = Double.random(in: -1...1)
                for item in batch {
                    if item.number >= policy.maximumAttempts {
                        given.append((item, item.number, text))
                    } else {
                        let wait = policy.delay(afterAttempt: item.number, spread: spread)
                        kept.append((item, item.number, now.addingClamped(Self.nanoseconds(wait)), text))
                    }
                }
                if !given.isEmpty { try deadLetter(given, reason: .failed) }
                if !kept.isEmpty { try setAside(kept) }
                guard let soonest = kept.map(\.2).min() else { return true }
                wake(at: soonest)
                return !holdsAtPosition
            }
        } catch {
            report(error)
            // Offered again: soon, not only at the next append.
            wake(at: now.addingClamped(1_000_000_000))
            return false
        }
    }

    /// Gives up on a message that cannot be decoded: it goes to the dead letters, so that it cannot block the queue.
    func giveUp(on item: Item, error: WormholeError) -> Bool {
        do throws(WormholeError) {
            try deadLetter([(item, item.number, error.message)], reason: .undecodable)
            return true
        } catch {
            report(error)
            wake(at: Self.now().addingClamped(1_000_000_000))
            return false
        }
    }

    /// Removes from the suite the entries of messages handled whose removal failed before.
    func settleOwedResolutions() {
        let owed = owedResolutions.withLock { $0 }
        guard !owed.isEmpty else { return }
        do throws(WormholeError) {
            try resolve(owed.map { ($0.key, $0.value) })
            owedResolutions.withLock { current in for key in owed.keys { current.removeValue(forKey: key) } }
            noteChange()
        } catch {
            report(error)
            wake(at: Self.now().addingClamped(1_000_000_000))
        }
    }

    /// Writes entries for messages (an item, its failed attempts, when it may come back, its last error): a
    /// message's schedule (its expiry, and whether it came from the scheduled log) stays with it.
    private func setAside(_ messages: [(Item, Int, Int64, String?)]) throws(WormholeError) {
        let entries = messages.map { item, attempts, notBefore, lastError in
            var entry = SetAsideMessage(
                record: item.record,
                attempts: attempts,
                notBeforeNanoseconds: notBefore,
                lastError: lastError,
                scheduled: item.entry?.isScheduled ?? false,
                expiresNanoseconds: item.entry?.expiresNanoseconds
            )
            entry.offered = true
            return entry
        }
        try store(entries)
    }

    private func store(_ entries: [SetAsideMessage]) throws(WormholeError) {
        let change = try retries.update(sender: sender, direction: nil) { (values) throws(WormholeError) in
            for entry in entries { try values.set(entry, forKey: entry.key) }
        }
        pending.withLock { pending in
            for entry in entries { pending[entry.key] = entry }
            if let change { noteOwnWrite(change) }
        }
        noteChange()
    }

    /// Removes entries, each only while the suite holds the revision this consumer knows (nil: whatever it holds):
    /// a dead letter requeued meanwhile, by another process, is a new entry, and stays.
    private func resolve(_ entries: [(key: String, revision: UInt64?)]) throws(WormholeError) {
        guard !entries.isEmpty else { return }
        let change = try retries.update(sender: sender, direction: nil) { values in
            for (key, revision) in entries {
                if let revision, let stored = values[key, as: SetAsideMessage.self], stored.revision != revision {
                    continue
                }
                values.removeValue(forKey: key)
            }
        }
        pending.withLock { pending in
            for (key, revision) in entries where revision == nil || pending[key]?.revision == revision {
                pending.removeValue(forKey: key)
            }
            if let change { noteOwnWrite(change) }
        }
        noteChange()
    }

    /// Called under ``pending``'s lock, as a reload reads the version under it.
    private func noteOwnWrite(_ change: SuiteChange) {
        ownVersion.withLock { own in
            // A change does not say its lineage: the suite's, read when this consumer loaded it, stays.
            own.version = max(own.version, change.version)
        }
    }

    /// Dead letters first, then out of the retries: killed in between, the message is in both, and the entry goes
    /// when the consumer starts again.
    private func deadLetter(_ messages: [(Item, Int, String)], reason: QueueDeadLetter.Reason) throws(WormholeError) {
        let now = Self.now()
        let letters = messages.map { item, attempts, text in
            QueueDeadLetter(
                offset: item.record.offset,
                end: item.record.end,
                sender: item.record.sender,
                timestampNanoseconds: item.record.timestampNanoseconds,
                attempts: attempts,
                reason: reason,
                lastError: text,
                deadLetteredNanoseconds: now,
                payload: item.record.payload,
                isScheduled: item.entry?.isScheduled ?? false
            )
        }
        try deadLetters.update(sender: sender, direction: nil) { (values) throws(WormholeError) in
            for letter in letters { try values.set(letter, forKey: letter.key) }
        }
        let known = pending.withLock { pending in
            messages.compactMap { $0.0.entry.map { ($0.key, $0.revision) } }.filter { pending[$0.0] != nil }
        }
        try resolve(known)
    }

    /// Sends scheduled messages whose time to live ran out to the dead letters, unoffered; false when that could
    /// not be stored (they are tried again in a second).
    func expire(_ entries: [SetAsideMessage]) -> Bool {
        do throws(WormholeError) {
            let items = entries.map { entry -> (Item, Int, String) in
                (
                    (entry.record, entry.attempts, entry), entry.attempts,
                    entry.lastError ?? "expired before it was handled"
                )
            }
            try deadLetter(items, reason: .expired)
            return true
        } catch {
            report(error)
            wake(at: Self.now().addingClamped(1_000_000_000))
            return false
        }
    }

    /// Takes records of the queue's scheduled log into the retries, each due at its time: true when they are
    /// stored, so that the scheduled log's position may move past them. A record that holds no envelope this
    /// version reads goes to the dead letters.
    func takeScheduled(_ records: [QueueRecord]) -> Bool {
        var entries: [SetAsideMessage] = []
        var unreadable: [(Item, Int, String)] = []
        for record in records {
            guard let envelope = ScheduledEnvelope.decode(record.payload) else {
                let item: Item = (
                    record, 0,
                    SetAsideMessage(
                        record: record,
                        attempts: 0,
                        notBeforeNanoseconds: 0,
                        lastError: nil,
                        scheduled: true
                    )
                )
                unreadable.append((item, 0, "The record is not a scheduled message this version reads."))
                continue
            }
            var message = record
            message.payload = envelope.payload
            entries.append(
                SetAsideMessage(
                    record: message,
                    attempts: 0,
                    notBeforeNanoseconds: envelope.notBeforeNanoseconds,
                    lastError: nil,
                    scheduled: true,
                    expiresNanoseconds: envelope.expiresNanoseconds
                )
            )
        }
        do throws(WormholeError) {
            if !unreadable.isEmpty { try deadLetter(unreadable, reason: .undecodable) }
            // Read again (a consumer killed before the log's position moved): the same key, the same entry, not
            // offered meanwhile, as `due(...)` offers none before the position moves past it.
            let fresh = pending.withLock { pending in entries.filter { pending[$0.key] == nil } }
            if !fresh.isEmpty { try store(fresh) }
            if let soonest = fresh.map(notBefore(of:)).min() { wake(at: soonest) }
            return true
        } catch {
            report(error)
            // Read again in a second: they stay in the log until they are stored.
            DispatchQueue.global().asyncAfter(deadline: .now() + 1) { [weak self] in
                self?.scheduledConsumer.withLock { $0.core }?.wakeForDueMessages()
            }
            return false
        }
    }

    // MARK: Waking

    /// Makes every set-aside message but the scheduled ones due now, in this process only (their entries keep their times): the owner of the
    /// consumer is ready for them (``QueueConsumer/wakeUp()``).
    func releaseWaits() {
        let now = Self.now()
        holds.withLock { $0.removeAll() }
        defer { noteChange() }
        pending.withLock { pending in
            // Not a scheduled message that waits for its time: it is never offered before it.
            for (key, entry) in pending where entry.notBeforeNanoseconds > now && !entry.waitsForItsTime {
                pending[key]!.notBeforeNanoseconds = now
            }
        }
    }

    /// Cancels the consumer, from its own handler (which `cancel()` does not wait for).
    func cancelConsumer() {
        consumer.withLock { $0.core }?.cancel()
    }

    /// Wakes the consumer at `deadline` (nanoseconds since 1970), unless a timer is set for earlier.
    func wake(at deadline: Int64) {
        let generation: UInt64? = timer.withLock { timer in
            // A timer set for no later is there, or its block on its way (one past its time has not run yet).
            if let set = timer.deadline, set <= deadline { return nil }
            timer.deadline = deadline
            timer.generation &+= 1
            return timer.generation
        }
        guard let generation, !stopped.withLock({ $0 }) else { return }
        // At most about 35 minutes at once: a longer wait wakes early, and the pass sets the timer again.
        let wait = min(max(0, deadline &- Self.now()), Int64(Int32.max) * 1000)
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(wait))) { [weak self] in
            guard let self else { return }
            let current = timer.withLock { timer -> Bool in
                guard timer.generation == generation else { return false }
                timer.deadline = nil
                return true
            }
            guard current, let core = consumer.withLock({ $0.core }) else { return }
            core.wakeForDueMessages()
        }
    }

    static func now() -> Int64 { ProcessFacts.wallClockNanoseconds() }

    /// A duration in nanoseconds, at most `Int64.max`, at least 0.
    static func nanoseconds(_ duration: Duration) -> Int64 {
        let milliseconds = duration.milliseconds
        guard milliseconds > 0 else { return 0 }
        guard milliseconds < Double(Int64.max) / 1e6 else { return .max }
        return Int64(milliseconds * 1e6)
    }
}

extension Int64 {
    /// The sum, at most `Int64.max`: a wait of "for ever" is a time that never comes, not a crash.
    func addingClamped(_ other: Int64) -> Int64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? (other > 0 ? .max : .min) : sum
    }
}
