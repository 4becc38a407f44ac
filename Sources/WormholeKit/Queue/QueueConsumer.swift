import Foundation
import Synchronization

/// An identifier of the calling thread.
func currentThreadID() -> UInt {
    #if canImport(Darwin)
    UInt(bitPattern: pthread_self())
    #else
    UInt(pthread_self())
    #endif
}

/// A running queue consumer; it stops when cancelled or released.
///
/// It is the callback core of queue consumption: woken by its cursor's observation, it reads what was appended,
/// hands it to the handler on the consumer's execution, and stores the position when the handler returns.
public final class QueueConsumer: WormholeCancellable {
    private let cursor: Locked<any QueueCursor>
    private let schedule: @Sendable (@escaping @Sendable () -> Void) -> Void
    /// Hands over a batch of records; returns the end of those handled, to acknowledge through (nil when none was:
    /// they stay unacknowledged). A handler may take fewer than it was given (a strict retry policy stops a batch
    /// at a message that waits): the rest is read again.
    private let deliver: @Sendable ([QueueRecord]) -> UInt64?
    /// Run at the start of every pass, with the stored position, before the queue is read: hands over the messages
    /// set aside for another attempt whose time has come (``QueueRetries``).
    private let prepare: (@Sendable (UInt64) -> Void)?
    /// Run by ``wakeUp()``: the owner is ready now, so that messages waiting for their time wait no longer.
    private let releaseWaits: (@Sendable () -> Void)?
    /// Run by ``cancel()``: what works for the consumer besides its observation (a retry policy's timers) stops.
    private let onCancel: (@Sendable () -> Void)?
    /// Run after each stored position: a scheduled log's consumer wakes the queue's consumer, whose messages from
    /// that log may be offered once the position is past them.
    private let onAcknowledged: (@Sendable () -> Void)?
    /// The most messages in one batch: 1 for a handler of single messages.
    private let batchSize: Int
    private let reportError: @Sendable (WormholeError) -> Void
    private let observation = Locked<NotifierObservation?>(nil)
    private let cancelled = Atomic<Bool>(false)
    private let scheduled = Atomic<Bool>(false)
    /// The cursor's stored position, readable without its lock.
    private let storedPosition: Atomic<UInt64>
    /// The thread delivering right now, so that `cancel()` called from a handler does not wait for itself.
    private let deliveringThread = Atomic<UInt>(0)
    /// The end of a batch handled whose acknowledgement failed (0 when none): it is retried before anything is read,
    /// so that a handled batch is not delivered again while this consumer lives. Changed under the cursor's lock.
    private let owedAcknowledgement = Atomic<UInt64>(0)
    /// The wait before the next try of an owed acknowledgement, in milliseconds: 50, doubling to 2,000.
    private let retryDelay = Atomic<Int>(50)
    /// The consumer's name.
    public let name: String

    init(
        cursor: any QueueCursor,
        execution: CallbackExecution,
        label: String,
        batchSize: Int,
        prepare: (@Sendable (UInt64) -> Void)? = nil,
        releaseWaits: (@Sendable () -> Void)? = nil,
        onCancel: (@Sendable () -> Void)? = nil,
        onAcknowledged: (@Sendable () -> Void)? = nil,
        deliver: @escaping @Sendable ([QueueRecord]) -> UInt64?,
        reportError: @escaping @Sendable (WormholeError) -> Void
    ) {
        self.prepare = prepare
        self.releaseWaits = releaseWaits
        self.onCancel = onCancel
        self.onAcknowledged = onAcknowledged
        self.name = cursor.consumer
        self.storedPosition = Atomic(cursor.position)
        self.batchSize = max(1, batchSize)
        self.cursor = Locked(cursor)
        self.schedule = execution.makeScheduler(label: label)
        self.deliver = deliver
        self.reportError = reportError
    }

    func start() throws(WormholeError) {
        let watch = try cursor.withLock { (cursor) throws(WormholeError) in
            try cursor.observeAppends { [weak self] in self?.wake() }
        }
        observation.withLock { $0 = watch }
        wake()  // catch up on what was appended while this consumer was away
    }

    /// The offset of the next message this consumer will handle.
    ///
    /// It can be read from a handler: it does not wait for the delivery under way.
    public var position: UInt64 { storedPosition.load(ordering: .acquiring) }

    /// Whether the consumer has stopped.
    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    /// Stops the consumer. A message being handled finishes first, and is acknowledged if its handler returns:
    /// when `cancel()` returns (from outside a handler), no message is left handled but unacknowledged.
    public func cancel() {
        cancelled.store(true, ordering: .releasing)
        onCancel?()
        let watch = observation.withLock { watch in
            defer { watch = nil }
            return watch
        }
        watch?.cancel()
        // Wait for a delivery under way, unless this is that delivery's own thread; then one last try of an owed
        // acknowledgement, so that a consumer stopped while its engine was away does not leave it undone.
        if deliveringThread.load(ordering: .acquiring) != currentThreadID() {
            cursor.withLock { cursor in
                let owed = owedAcknowledgement.load(ordering: .acquiring)
                guard owed != 0 else { return }
                do throws(WormholeError) {
                    try cursor.acknowledge(through: owed)
                    owedAcknowledgement.store(0, ordering: .releasing)
                    storedPosition.store(cursor.position, ordering: .releasing)
                } catch {
                    reportError(error)
                }
            }
        }
    }

    deinit { cancel() }

    /// Reads again from the stored position, as an append would make it, and offers at once the messages that wait
    /// for their next attempt: for an owner that left messages unacknowledged on purpose and is now ready for them.
    func wakeUp() {
        guard !isCancelled else { return }
        releaseWaits?()
        wake()
    }

    /// Reads again from the stored position: some messages set aside came due.
    func wakeForDueMessages() {
        guard !isCancelled else { return }
        wake()
    }

    private func wake() {
        // Coalesce: one pass reads everything appended so far.
        guard !scheduled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        schedule { [self] in
            scheduled.store(false, ordering: .releasing)
            deliverPending()
        }
    }

    private func deliverPending() {
        // On the notifier's thread, a long backlog is handled in passes of a few milliseconds each (see
        // `CallbackDriver.passBudget`): the rest comes in the next pass.
        let passStarted = CallbackDriver.passStart()
        var stoppedEarly = false
        defer { if stoppedEarly { wake() } }
        // Cancelled: the cancel made its own last try of an owed acknowledgement.
        guard !isCancelled else { return }
        cursor.withLock { cursor in
            deliveringThread.store(currentThreadID(), ordering: .releasing)
            defer { deliveringThread.store(0, ordering: .releasing) }
            prepare?(cursor.position)
            do throws(WormholeError) {
                var batch: [QueueRecord]
                let owed = owedAcknowledgement.load(ordering: .acquiring)
                if owed != 0 {
                    // Handled already: acknowledged now, never handed over again.
                    batch = try cursor.acknowledge(through: owed, thenRead: batchSize)
                    acknowledged(cursor)
                } else {
                    batch = try cursor.read(maximumCount: batchSize)
                }
                while !cancelled.load(ordering: .relaxed) {
                    guard !batch.isEmpty, let end = deliver(batch) else { return }
                    // Let go of the batch before the next read, so that the cursor can reuse its memory.
                    batch = []
                    owedAcknowledgement.store(end, ordering: .releasing)
                    if CallbackDriver.passIsOverBudget(passStarted) {
                        try cursor.acknowledge(through: end)
                        acknowledged(cursor)
                        stoppedEarly = true
                        return
                    }
                    batch = try cursor.acknowledge(through: end, thenRead: batchSize)
                    acknowledged(cursor)
                }
            } catch {
                reportError(error)
                let owed = owedAcknowledgement.load(ordering: .acquiring)
                // Acknowledged, then the read failed: nothing is owed any more.
                if owed != 0, cursor.position >= owed { acknowledged(cursor) }
                if owedAcknowledgement.load(ordering: .acquiring) != 0 { retryLater() }
            }
        }
    }

    private func acknowledged(_ cursor: any QueueCursor) {
        owedAcknowledgement.store(0, ordering: .releasing)
        retryDelay.store(50, ordering: .relaxed)
        storedPosition.store(cursor.position, ordering: .releasing)
        onAcknowledged?()
    }

    /// Wakes the consumer again after a back-off, to retry an owed acknowledgement even when nothing is appended.
    private func retryLater() {
        let delay = retryDelay.load(ordering: .relaxed)
        retryDelay.store(min(delay * 2, 2_000), ordering: .relaxed)
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(delay)) { [weak self] in
            guard let self, !isCancelled else { return }
            wake()
        }
    }
}
