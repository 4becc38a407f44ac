import Dispatch
import Foundation

/// One consumer's attempts, retries and dead letters: what its ``QueueRetryPolicy`` makes of a handler's failures.
///
/// A message that waits for its next attempt is *set aside*: written, with its bytes and its attempt count, to the
/// consumer's retries suite (`QUEUE#retries#CONSUMER`, one key per message, its offset), before the consumer's
/// position moves past it. A message given up on goes to the dead-letters suite (`QUEUE#dead-letters#CONSUMER`)
/// before it leaves the retries. Suites are atomic and durable on every engine, so a consumer killed at any moment
/// finds each message in one of three places (the queue past its position, its retries, its dead letters), or in
/// two of them, when it was killed between the two writes, and then the later place wins (a set-aside message found
/// again in the queue is passed over; a dead letter found again in the retries overwrites itself).
///
/// Every call comes from the consumer's delivery (``QueueConsumer``'s, one at a time, under its cursor's lock), but
/// for ``wake(at:)``'s timer, which only wakes the consumer.
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
    private let longestWait: Duration
    private let report: @Sendable (WormholeError) -> Void
    /// The set-aside messages by offset, as the retries suite holds them.
    private let pending = Locked<[UInt64: SetAsideMessage]>([:])
    /// In strict order, the messages put off (``QueueOutcome/later(_:)``) until a time, by offset: in memory only, as
    /// the queue's position holds them anyway (a restarted consumer offers them at once).
    private let holds = Locked<[UInt64: Int64]>([:])
    private let consumer = Locked<WeakConsumer>(WeakConsumer())
    /// The version of the retries suite that this consumer's last write made: a reload that read an older one is
    /// dropped, as it could bring back what was resolved since.
    private let ownVersion = Locked<UInt64>(0)
    /// Watches the retries suite for entries another process adds (``WormholeDeadLetters/requeue(offsets:)``).
    private let observation = Locked<NotifierObservation?>(nil)
    /// The earliest time a timer is set for, and a count that cancels the timers set before.
    private let timer = Locked<(deadline: Int64?, generation: UInt64)>((nil, 0))

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
        self.longestWait = longestWait
        self.report = report
        try load(merging: false)
        let watch = try retries.observe { [weak self] in
            guard let self else { return }
            do throws(WormholeError) { try load(merging: true) } catch { report(error) }
        }
        observation.withLock { $0 = watch }
    }

    deinit { observation.withLock { $0?.cancel() } }

    /// The consumer to wake when a set-aside message comes due.
    func attach(_ core: QueueConsumer) {
        consumer.withLock { $0.core = core }
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
                                + "is left in the suite \(retries.name).",
                            identifier: queue
                        )
                    )
                }
                continue
            }
            loaded[entry.offset] = entry
        }
        let added = pending.withLock { pending -> Bool in
            guard merging else {
                pending = loaded
                return false
            }
            guard state.version >= ownVersion.withLock({ $0 }) else { return false }
            var added = false
            for (offset, entry) in loaded where pending[offset] == nil {
                pending[offset] = entry
                added = true
            }
            return added
        }
        if added { wake(at: Self.now()) }
    }

    /// Whether any message is set aside or put off: the consumer's success path checks only this.
    var isEmpty: Bool { pending.withLock { $0.isEmpty } && holds.withLock { $0.isEmpty } }

    /// The set-aside entry of the message at `offset`, if any.
    func entry(_ offset: UInt64) -> SetAsideMessage? { pending.withLock { $0[offset] } }

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

    /// The standing of the message at `offset`.
    func standing(of offset: UInt64) -> Standing {
        let now = Self.now()
        if let until = holds.withLock({ $0[offset] }) {
            if until > now { return .waiting(until) }
            _ = holds.withLock { $0.removeValue(forKey: offset) }
        }
        guard let found = entry(offset) else { return .fresh }
        if policy.order == .unordered { return .setAside }
        if let wait = notYetDue(found) { return .waiting(wait) }
        return .due(found)
    }

    /// The set-aside messages whose time has come, oldest first, that this consumer's ``deliverDue`` hands over:
    /// in strict order, only those before `position` (the one at the position is the queue's own head, which the
    /// consumer offers itself).
    func due(before position: UInt64, now: Int64, limit: Int) -> [SetAsideMessage] {
        let all = pending.withLock { Array($0.values) }
        let eligible = all.filter { policy.order == .unordered || $0.offset < position }
        let ready = eligible.filter { notBefore(of: $0) <= now }.sorted { $0.offset < $1.offset }
        if let next = eligible.filter({ notBefore(of: $0) > now }).map(notBefore(of:)).min() { wake(at: next) }
        return Array(ready.prefix(max(1, limit)))
    }

    /// When an entry may be offered, if that is still to come.
    func notYetDue(_ entry: SetAsideMessage) -> Int64? {
        let time = notBefore(of: entry)
        return time > Self.now() ? time : nil
    }

    /// When an entry may be offered, no later than ``longestWait`` from now.
    private func notBefore(of entry: SetAsideMessage) -> Int64 {
        let latest = Self.now() &+ Int64(longestWait.milliseconds * 1e6)
        return min(entry.notBeforeNanoseconds, latest)
    }

    // MARK: Outcomes

    /// Records what a handler made of attempt `attempt` (1 for the first) of `record`, set aside as `entry` before.
    ///
    /// - Returns: Whether the consumer's position may move past the record: false in strict order while the message
    ///   waits (the consumer is woken when it is due), and when the outcome could not be stored (the message is
    ///   offered again).
    func settle(_ attempt: Attempt, of record: QueueRecord, number: Int, entry: SetAsideMessage?) -> Bool {
        settle([(record, number, entry)], attempt)
    }

    /// ``settle(_:of:number:entry:)`` for a batch that one handler call took, with one outcome for all.
    func settle(_ batch: [(record: QueueRecord, number: Int, entry: SetAsideMessage?)], _ attempt: Attempt) -> Bool {
        let now = Self.now()
        do throws(WormholeError) {
            switch attempt {
            case .done:
                try resolve(batch.compactMap { $0.entry?.offset })
                return true
            case .later(let delay):
                let notBefore = now &+ Int64(max(.zero, delay).milliseconds * 1e6)
                if policy.order == .strict {
                    // Held where it is, by the position: nothing to store.
                    holds.withLock { holds in for item in batch { holds[item.record.offset] = notBefore } }
                    wake(at: notBefore)
                    return false
                }
                try setAside(batch.map { ($0.record, $0.number - 1, notBefore, $0.entry?.lastError) })
                return waitOrMoveOn(until: notBefore)
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
                        kept.append((record, number, now &+ Int64(wait.milliseconds * 1e6), text))
                    }
                }
                if !given.isEmpty { try deadLetter(given, reason: .failed) }
                if !kept.isEmpty { try setAside(kept) }
                guard let soonest = kept.map(\.2).min() else { return true }
                return waitOrMoveOn(until: soonest)
            }
        } catch {
            report(error)
            // Offered again: soon, not only at the next append.
            wake(at: now &+ 1_000_000_000)
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
            wake(at: Self.now() &+ 1_000_000_000)
            return false
        }
    }

    /// In unordered order the consumer moves on at once; in strict order it waits, and is woken at `deadline`.
    private func waitOrMoveOn(until deadline: Int64) -> Bool {
        guard policy.order == .strict else {
            wake(at: deadline)
            return true
        }
        wake(at: deadline)
        return false
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
            if let change { ownVersion.withLock { $0 = max($0, change.version) } }
        }
    }

    private func resolve(_ offsets: [UInt64]) throws(WormholeError) {
        guard !offsets.isEmpty else { return }
        let change = try retries.update(sender: sender, direction: nil) { values in
            for offset in offsets { values.removeValue(forKey: QueueWorkNames.key(offset)) }
        }
        pending.withLock { pending in
            for offset in offsets { pending.removeValue(forKey: offset) }
            if let change { ownVersion.withLock { $0 = max($0, change.version) } }
        }
    }

    /// Dead letters first, then out of the retries: killed in between, the message is in both, and its next
    /// failure writes the same dead letter again.
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
        try resolve(messages.map(\.0.offset).filter { entry($0) != nil })
    }

    // MARK: Waking

    /// Cancels the consumer, from its own handler (which `cancel()` does not wait for).
    func cancelConsumer() {
        consumer.withLock { $0.core }?.cancel()
    }

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

    /// Wakes the consumer at `deadline` (nanoseconds since 1970), unless a timer is set for earlier.
    func wake(at deadline: Int64) {
        let generation: UInt64? = timer.withLock { timer in
            if let set = timer.deadline, set <= deadline, set > Self.now() { return nil }
            timer.deadline = deadline
            timer.generation &+= 1
            return timer.generation
        }
        guard let generation else { return }
        let wait = max(0, deadline &- Self.now())
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(min(wait, Int64(Int32.max) * 1000)))) {
            [weak self] in
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
}
