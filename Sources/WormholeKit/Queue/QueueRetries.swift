import Dispatch
import Foundation

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
/// for the suite's observer (which only adds entries another process wrote) and ``wake(at:)``'s timer (which only
/// wakes the consumer).
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
    /// The set-aside messages by offset, as the retries suite holds them.
    private let pending = Locked<[UInt64: SetAsideMessage]>([:])
    /// In strict order, the message at the position put off (``QueueOutcome/later(_:)``) until a time: in memory
    /// only, as the position holds it anyway (a restarted consumer offers it at once).
    private let holds = Locked<[UInt64: Int64]>([:])
    /// Messages handled whose entry could not be removed: gone from ``pending`` (so never offered again by this
    /// process), and removed from the suite at the next pass.
    private let owedResolutions = Locked<Set<UInt64>>([])
    private let consumer = Locked<WeakConsumer>(WeakConsumer())
    /// The lineage and version of the retries suite that this consumer's last write made: a reload that read an
    /// older version of that lineage is dropped, as it could bring back what was resolved since.
    private let ownVersion = Locked<(lineage: UInt64, version: UInt64)>((0, 0))
    /// Watches the retries suite for entries another process adds (``WormholeDeadLetters/requeue(offsets:)``).
    private let observation = Locked<NotifierObservation?>(nil)
    /// The earliest time a timer is set for, and a count that cancels the timers set before.
    private let timer = Locked<(deadline: Int64?, generation: UInt64)>((nil, 0))
    private let stopped = Locked(false)

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

    /// The consumer to wake when a set-aside message comes due.
    func attach(_ core: QueueConsumer) {
        consumer.withLock { $0.core = core }
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
    /// entries this process does not know are taken (requeued dead letters), and the consumer is woken for them.
    private func load(merging: Bool) throws(WormholeError) {
        let state = try retries.read()
        var loaded: [UInt64: SetAsideMessage] = [:]
        for key in state.values.keys {
            guard let entry = state.values[key, as: SetAsideMessage.self], entry.isValid,
                QueueWorkNames.key(entry.offset) == key
            else {
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
            loaded[entry.offset] = entry
        }
        let owed = owedResolutions.withLock { $0 }
        let added = pending.withLock { pending -> Bool in
            guard merging else {
                pending = loaded.filter { !owed.contains($0.key) }
                ownVersion.withLock { $0 = (state.lineage, state.version) }
                return false
            }
            let own = ownVersion.withLock { $0 }
            guard state.lineage != own.lineage || state.version >= own.version else { return false }
            // A suite that started over (its file removed, say) is taken as it is now.
            if state.lineage != own.lineage { ownVersion.withLock { $0 = (state.lineage, state.version) } }
            var added = false
            for (offset, entry) in loaded where pending[offset] == nil && !owed.contains(offset) {
                pending[offset] = entry
                added = true
            }
            return added
        }
        if added { wake(at: Self.now()) }
    }

    /// Removes the entries of messages that are dead letters too (a consumer killed between the two writes), so
    /// that none gets an attempt beyond its last.
    private func forgetDeadLetteredEntries() throws(WormholeError) {
        guard !isEmpty else { return }
        let dead = Set(try deadLetters.read().values.keys)
        let both = pending.withLock { $0.keys.filter { dead.contains(QueueWorkNames.key($0)) } }
        try resolve(both)
    }

    /// Whether any message is set aside or put off: the consumer's success path checks only this.
    var isEmpty: Bool { pending.withLock { $0.isEmpty } && holds.withLock { $0.isEmpty } }

    /// What a message read from the queue at the consumer's position is to this consumer.
    enum Standing: Equatable {
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
        }
        guard let found = pending.withLock({ $0[offset] }) else { return .fresh }
        if policy.order == .unordered { return .setAside }
        let time = notBefore(of: found)
        return time > now ? .waiting(time) : .due(found)
    }

    /// The set-aside messages before `position` whose time has come, by offset, at most `limit` and none of
    /// `excluded`; the consumer is woken when the next of the others comes due. (A message at or past the position
    /// is the queue's to offer: in strict order the consumer offers it there, and in unordered order one found there
    /// is passed over, as it was set aside before the position could move past it.)
    func due(before position: UInt64, excluding excluded: Set<UInt64>, limit: Int) -> [SetAsideMessage] {
        let now = Self.now()
        let eligible = pending.withLock { pending in
            pending.values.filter { $0.offset < position && !excluded.contains($0.offset) }
        }
        var ready: [SetAsideMessage] = []
        var next: Int64?
        for entry in eligible {
            let time = notBefore(of: entry)
            if time <= now { ready.append(entry) } else { next = min(next ?? .max, time) }
        }
        if let next { wake(at: next) }
        return Array(ready.sorted { $0.offset < $1.offset }.prefix(max(1, limit)))
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
                let offsets = batch.compactMap { $0.entry?.offset }
                do throws(WormholeError) {
                    try resolve(offsets)
                } catch {
                    // Handled: forgotten here, and removed from the suite at the next pass.
                    pending.withLock { pending in for offset in offsets { pending.removeValue(forKey: offset) } }
                    owedResolutions.withLock { $0.formUnion(offsets) }
                    report(error)
                }
                return true
            case .later(let delay):
                let notBefore = now.addingClamped(Self.nanoseconds(delay))
                if holdsAtPosition {
                    // Held where it is, by the position: nothing to store.
                    holds.withLock { holds in for item in batch { holds[item.record.offset] = notBefore } }
                    wake(at: notBefore)
                    return false
                }
                try setAside(batch.map { ($0.record, $0.number - 1, notBefore, $0.entry?.lastError) })
                wake(at: notBefore)
                return true
            case .failed(let error):
                let text = String(describing: error)
                var kept: [(QueueRecord, Int, Int64, String?)] = []
                var given: [(QueueRecord, Int, String)] = []
                // One draw for the batch: in strict order its messages come back together.
                let spread = Double.random(in: -1...1)
                for (record, number, _) in batch {
                    if number >= policy.maximumAttempts {
                        given.append((record, number, text))
                    } else {
                        let wait = policy.delay(afterAttempt: number, spread: spread)
                        kept.append((record, number, now.addingClamped(Self.nanoseconds(wait)), text))
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
    func giveUp(on record: QueueRecord, attempts: Int, error: WormholeError) -> Bool {
        do throws(WormholeError) {
            try deadLetter([(record, attempts, error.message)], reason: .undecodable)
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
            try resolve(Array(owed))
            owedResolutions.withLock { $0.subtract(owed) }
        } catch {
            report(error)
            wake(at: Self.now().addingClamped(1_000_000_000))
        }
    }

    private func setAside(_ messages: [(QueueRecord, Int, Int64, String?)]) throws(WormholeError) {
        let entries = messages.map { record, attempts, notBefore, lastError in
            SetAsideMessage(record: record, attempts: attempts, notBeforeNanoseconds: notBefore, lastError: lastError)
        }
        let change = try retries.update(sender: sender, direction: nil) { (values) throws(WormholeError) in
            for entry in entries { try values.set(entry, forKey: QueueWorkNames.key(entry.offset)) }
        }
        pending.withLock { pending in
            for entry in entries { pending[entry.offset] = entry }
            if let change { noteOwnWrite(change) }
        }
    }

    private func resolve(_ offsets: [UInt64]) throws(WormholeError) {
        guard !offsets.isEmpty else { return }
        let change = try retries.update(sender: sender, direction: nil) { values in
            for offset in offsets { values.removeValue(forKey: QueueWorkNames.key(offset)) }
        }
        pending.withLock { pending in
            for offset in offsets { pending.removeValue(forKey: offset) }
            if let change { noteOwnWrite(change) }
        }
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
    private func deadLetter(
        _ messages: [(QueueRecord, Int, String)],
        reason: QueueDeadLetter.Reason
    ) throws(WormholeError) {
        let now = Self.now()
        let letters = messages.map { record, attempts, text in
            QueueDeadLetter(
                offset: record.offset,
                end: record.end,
                sender: record.sender,
                timestampNanoseconds: record.timestampNanoseconds,
                attempts: attempts,
                reason: reason,
                lastError: text,
                deadLetteredNanoseconds: now,
                payload: record.payload
            )
        }
        try deadLetters.update(sender: sender, direction: nil) { (values) throws(WormholeError) in
            for letter in letters { try values.set(letter, forKey: QueueWorkNames.key(letter.offset)) }
        }
        let known = pending.withLock { pending in messages.map(\.0.offset).filter { pending[$0] != nil } }
        try resolve(known)
    }

    // MARK: Waking

    /// Makes every set-aside message due now, in this process only (their entries keep their times): the owner of the
    /// consumer is ready for them (``QueueConsumer/wakeUp()``).
    func releaseWaits() {
        let now = Self.now()
        holds.withLock { $0.removeAll() }
        pending.withLock { pending in
            for key in pending.keys where pending[key]!.notBeforeNanoseconds > now {
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
            if let set = timer.deadline, set <= deadline, set > Self.now() { return nil }
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
