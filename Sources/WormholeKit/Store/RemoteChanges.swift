import Foundation
import Synchronization

/// A consumer's place in a store's history.
package final class ConsumerCursor: Sendable {
    let history: any StoreHistory
    let name: String?
    let tables: Set<String>?
    let includingOwnWrites: Bool
    private let token: Locked<Int64>
    /// When the consumer was last marked as seen: a consumer that stays is never purged as gone, even when the
    /// store is idle or its handler keeps failing.
    private let lastSeen = Locked(ContinuousClock.now)
    /// A token this consumer moved to in memory but could not store (the server was away): stored before the next
    /// read, so that the transactions handled meanwhile are not delivered again by this process.
    private let owed = Locked<Int64?>(nil)

    /// Registers the consumer `name` (nil for a passing one) and starts at its stored token.
    package init(
        history: any StoreHistory,
        name: String?,
        tables: Set<String>?,
        includingOwnWrites: Bool
    ) throws(StoreError) {
        self.history = history
        self.name = name
        self.tables = tables
        self.includingOwnWrites = includingOwnWrites
        token = Locked(try history.registerConsumer(name))
    }

    var current: Int64 { token.withLock { $0 } }

    /// The next transactions for this consumer, and how far the history was looked at.
    func fetch(limit: Int = 100) throws(StoreError) -> (transactions: [StoreTransaction], scannedThrough: Int64) {
        if let name, let token = owed.withLock({ $0 }) {
            try history.storeToken(token, consumer: name)
            owed.withLock { if $0 == token { $0 = nil } }
        }
        if let name, lastSeen.withLock({ ContinuousClock.now - $0 > .seconds(60) }) {
            try history.storeToken(current, consumer: name)
            lastSeen.withLock { $0 = ContinuousClock.now }
        }
        let (batch, scanned) = try history.transactions(after: current, limit: limit, tables: tables)
        let kept = includingOwnWrites ? batch : batch.filter { $0.author != history.author }
        return (kept, scanned)
    }

    /// Moves the token to `id`, in memory and (for a durable consumer) in the store. When storing fails, the token
    /// still moves in memory, and is owed to the store: this process never delivers those transactions again, and
    /// stores the token before its next read (another process, or this one after a restart, may get them again).
    func acknowledge(through id: Int64) throws(StoreError) {
        token.withLock { $0 = max($0, id) }
        guard let name else { return }
        do {
            try history.storeToken(id, consumer: name)
            owed.withLock { if let owed = $0, owed <= id { $0 = nil } }
        } catch {
            owed.withLock { $0 = max($0 ?? id, id) }
            throw error
        }
    }
}

/// A running observation of remote changes; it stops when cancelled or released.
///
/// Made by `SharedStore.observeRemoteChanges` (SQLite, one host) and `PostgresStore.observeRemoteChanges` (across
/// hosts), which keep the same promises.
public final class RemoteChangeObserver: WormholeCancellable {
    private let cursor: ConsumerCursor
    private let handler: @Sendable (StoreTransaction) throws -> Void
    private let errorHandler: (@Sendable (StoreError) -> Void)?
    private let schedule: @Sendable (@escaping @Sendable () -> Void) -> Void
    /// Held while delivering, so that `cancel()` can wait for a delivery under way.
    private let delivering = Locked(())
    /// The thread delivering right now, so that `cancel()` called from a handler does not wait for itself.
    private let deliveringThread = Atomic<UInt>(0)
    private let scheduled = Atomic<Bool>(false)
    private let observation = Locked<NotifierObservation?>(nil)
    private let cancelled = Atomic<Bool>(false)

    /// Starts observing for `cursor`: it catches up at once, then after each commit.
    package init(
        cursor: ConsumerCursor,
        execution: CallbackExecution,
        handler: @escaping @Sendable (StoreTransaction) throws -> Void,
        errorHandler: (@Sendable (StoreError) -> Void)?
    ) throws(StoreError) {
        self.cursor = cursor
        self.handler = handler
        self.errorHandler = errorHandler
        self.schedule = execution.makeScheduler(label: "wormhole.store.observer")
        let watch = try cursor.history.observeCommits { [weak self] in self?.wake() }
        observation.withLock { $0 = watch }
        wake()  // catch up on what was committed while this consumer was away
    }

    func wake() {
        // Coalesce: one pass reads everything committed so far.
        guard !scheduled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        schedule { [self] in
            scheduled.store(false, ordering: .releasing)
            delivering.withLock { _ in
                deliveringThread.store(currentThreadID(), ordering: .releasing)
                defer { deliveringThread.store(0, ordering: .releasing) }
                deliverPending()
            }
        }
    }

    /// Whether the observer has stopped.
    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    /// The consumer's history token.
    public var historyToken: Int64 { cursor.current }

    /// Stops the observer. A transaction being handled finishes first, and is acknowledged if its handler returns:
    /// when `cancel()` returns (from outside a handler), nothing is left handled but unacknowledged.
    public func cancel() {
        cancelled.store(true, ordering: .relaxed)
        let watch = observation.withLock { watch in
            defer { watch = nil }
            return watch
        }
        watch?.cancel()
        // Wait for a delivery under way, unless this is that delivery's own thread.
        if deliveringThread.load(ordering: .acquiring) != currentThreadID() {
            delivering.withLock { _ in }
        }
    }

    deinit { cancel() }

    private func deliverPending() {
        // On the notifier's thread, a long backlog is handled in passes of a few milliseconds each (see
        // `CallbackDriver.passBudget`): the rest comes in the next pass.
        let passStarted = CallbackDriver.passStart()
        while !cancelled.load(ordering: .relaxed) {
            let before = cursor.current
            let batch: [StoreTransaction]
            let scanned: Int64
            do {
                (batch, scanned) = try cursor.fetch()
            } catch {
                return report(error)
            }
            for transaction in batch {
                guard !cancelled.load(ordering: .relaxed) else { return }
                for damaged in transaction.damagedChanges {
                    report(
                        StoreError(
                            .corruptHistory,
                            "History row \(damaged.changeID) of transaction \(transaction.id) (table \(damaged.table)) "
                                + "cannot be read: \(damaged.reason). The rest of the transaction is delivered.",
                            path: cursor.history.location
                        )
                    )
                }
                do {
                    try handler(transaction)
                } catch {
                    // Not merged: offered again at the next commit.
                    return report(
                        StoreError(
                            .handlerFailed,
                            "The handler threw on transaction \(transaction.id): \(error). It stays unacknowledged "
                                + "and is offered again at the next commit.",
                            path: cursor.history.location,
                            underlyingError: error
                        )
                    )
                }
                do { try cursor.acknowledge(through: transaction.id) } catch { return report(error) }
            }
            if scanned > cursor.current {
                do { try cursor.acknowledge(through: scanned) } catch { return report(error) }
            }
            cursor.history.purgeIfDue()
            // Done once a read finds nothing new: a batch whose transactions were all skipped (this author's, out of
            // scope) may have more behind it.
            if scanned <= before { return }
            if CallbackDriver.passIsOverBudget(passStarted) { return wake() }
        }
    }

    private func report(_ error: StoreError) {
        if let errorHandler {
            errorHandler(error)
        } else {
            cursor.history.logger.error("Remote change delivery failed", metadata: ["error": "\(error)"])
        }
    }
}

/// The transactions other processes commit to a shared store, as an `AsyncSequence`.
///
/// Made by `SharedStore.remoteChanges` (SQLite, one host) and `PostgresStore.remoteChanges` (across hosts). Iterate
/// it once. Asking for the next transaction acknowledges the previous one. The iteration's database work runs on
/// threads that may block, never on the cooperative thread pool; making the sequence registers a durable consumer
/// on the caller's thread (one short write, which waits for the database's lock at most the store's busy time-out),
/// so that nothing committed after it returns is missed.
public struct RemoteChangeSequence: AsyncSequence, Sendable {
    public typealias Element = StoreTransaction
    public typealias Failure = StoreError

    private let feed: Feed
    private let wakes: AsyncStream<Void>

    /// The cursor and the commit observation, shared by the sequence and its iterator.
    final class Feed: Sendable {
        let cursor: Result<ConsumerCursor, StoreError>
        let observation: NotifierObservation?

        init(cursor: Result<ConsumerCursor, StoreError>, observation: NotifierObservation?) {
            self.cursor = cursor
            self.observation = observation
        }

        deinit { observation?.cancel() }
    }

    /// Registers the consumer and starts observing commits at once, so that nothing committed after this returns is
    /// missed; a failure is thrown by the first `next()`.
    package init(history: any StoreHistory, consumer: String?, tables: Set<String>?, includingOwnWrites: Bool) {
        let (wakes, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        self.wakes = wakes
        do throws(StoreError) {
            let observation = try history.observeCommits { continuation.yield() }
            do throws(StoreError) {
                let cursor = try ConsumerCursor(
                    history: history,
                    name: consumer,
                    tables: tables,
                    includingOwnWrites: includingOwnWrites
                )
                feed = Feed(cursor: .success(cursor), observation: observation)
            } catch {
                observation.cancel()
                throw error
            }
        } catch {
            feed = Feed(cursor: .failure(error), observation: nil)
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(feed: feed, wakes: wakes.makeAsyncIterator())
    }

    /// The iterator. Asking for the next transaction acknowledges the previous one.
    public struct AsyncIterator: AsyncIteratorProtocol {
        let feed: Feed
        var wakes: AsyncStream<Void>.AsyncIterator
        var buffer: [StoreTransaction] = []
        var unacknowledged: Int64?

        /// The next transaction; throws a ``StoreError`` when the history cannot be read.
        public mutating func next() async throws(StoreError) -> StoreTransaction? {
            let cursor = try feed.cursor.get()
            if let previous = unacknowledged {
                try await runBlocking { () throws(StoreError) in
                    try cursor.acknowledge(through: previous)
                    cursor.history.purgeIfDue()
                }
                unacknowledged = nil
            }
            while true {
                if !buffer.isEmpty {
                    let transaction = buffer.removeFirst()
                    unacknowledged = transaction.id
                    return transaction
                }
                let (batch, advanced) = try await runBlocking { () throws(StoreError) in
                    let (batch, scanned) = try cursor.fetch()
                    let advanced = scanned > cursor.current
                    if batch.isEmpty, advanced { try cursor.acknowledge(through: scanned) }
                    return (batch, advanced)
                }
                if !batch.isEmpty {
                    buffer = batch
                    continue
                }
                // A batch whose transactions were all skipped may have more behind it: read on before waiting.
                if advanced { continue }
                guard await wakes.next() != nil, !Task.isCancelled else { return nil }
            }
        }
    }
}

/// An iterator belongs to the task that iterates: it is not `Sendable`.
@available(*, unavailable)
extension RemoteChangeSequence.AsyncIterator: Sendable {}
