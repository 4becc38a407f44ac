/// The hand-over between a callback core, which yields on the thread that delivers, and the one task that iterates a
/// ``ListeningSequence``.
///
/// It does what an `AsyncThrowingStream` does for one consumer, for less per element, since a waiting task pays it
/// for every message:
/// - an element yielded while the task waits resumes it directly, with no buffer on the way;
/// - the state sits behind one lock (``Locked``, which keeps it out of line: no run-time exclusivity check per access);
/// - the code is `@inlinable`, so that it is specialised for the element type in the module that iterates. Run
///   unspecialised, as `AsyncThrowingStream`'s is, every element looked up the metadata of the generic types it
///   touched (`bench mailbox --only-listening`, Benchmarks/README.md, goal 1).
@usableFromInline
final class ListeningChannel<Element: Sendable>: @unchecked Sendable {
    /// What a call to ``next()`` ends with.
    @usableFromInline
    typealias Outcome = Result<Element?, WormholeError>
    /// The task, while it waits.
    @usableFromInline
    typealias Waiter = UnsafeContinuation<Outcome, Never>

    /// What the task finds once the elements before it are taken.
    @usableFromInline
    enum Ending: Sendable {
        /// Elements may still come.
        case open
        /// The end: its error is thrown once, then every call gets nil.
        case finished(WormholeError?)
    }

    @usableFromInline
    struct State: Sendable {
        /// The elements yielded and not yet taken, from `head` on. A slot is emptied as its element is taken, so that
        /// the buffer holds on to nothing the task has had (a live request left unanswered must be released to fail).
        @usableFromInline
        var buffer: [Element?] = []
        @usableFromInline
        var head = 0
        @usableFromInline
        var ending = Ending.open
        @usableFromInline
        var waiter: Waiter?
        /// Called once, when the channel ends (finished, or its task cancelled); not when it is released unended.
        @usableFromInline
        var onTermination: (@Sendable () -> Void)?

        @usableFromInline
        init() {}

        @inlinable
        var bufferedCount: Int { buffer.count - head }

        @inlinable
        mutating func takeFirst() -> Element? {
            guard head < buffer.count else { return nil }
            let element = buffer[head].take()
            head += 1
            if head == buffer.count {
                buffer.removeAll(keepingCapacity: true)
                head = 0
            } else if head >= 64 && head * 2 >= buffer.count {
                // The emptied slots are dropped in bulk, not one by one from the front.
                buffer.removeFirst(head)
                head = 0
            }
            return element
        }

        /// The first element, or the end once the channel has finished; nil while the task has to wait.
        @inlinable
        mutating func takeNext() -> Outcome? {
            if let element = takeFirst() { return .success(element) }
            guard case .finished(let error) = ending else { return nil }
            ending = .finished(nil)
            if let error { return .failure(error) }
            return .success(nil)
        }
    }

    @usableFromInline
    let policy: AsyncThrowingStream<Element, any Error>.Continuation.BufferingPolicy
    @usableFromInline
    let state = Locked(State())

    @usableFromInline
    init(policy: AsyncThrowingStream<Element, any Error>.Continuation.BufferingPolicy) {
        self.policy = policy
    }

    /// Whether a task waits for an element (for tests).
    var isWaiting: Bool { state.withLock { $0.waiter != nil } }

    /// Sets what runs once when the channel ends; runs it at once if the channel has ended already.
    @inlinable
    func setOnTermination(_ handler: @escaping @Sendable () -> Void) {
        let ended = state.withLock { state -> Bool in
            guard case .open = state.ending else { return true }
            state.onTermination = handler
            return false
        }
        if ended { handler() }
    }

    /// Hands `element` to the waiting task, or keeps it as the policy says; dropped once the channel has ended.
    @inlinable
    func yield(_ element: Element) {
        // An element dropped for a newer one is released after the lock, since its deinit may do anything.
        let (waiter, dropped) = state.withLock { state -> (Waiter?, Element?) in
            guard case .open = state.ending else { return (nil, nil) }
            if let waiter = state.waiter {
                state.waiter = nil
                return (waiter, nil)
            }
            switch policy {
            case .bufferingNewest(let limit):
                guard limit > 0 else { return (nil, nil) }
                let dropped = state.bufferedCount >= limit ? state.takeFirst() : nil
                state.buffer.append(element)
                return (nil, dropped)
            case .bufferingOldest(let limit):
                if state.bufferedCount < limit { state.buffer.append(element) }
            default:
                state.buffer.append(element)
            }
            return (nil, nil)
        }
        waiter?.resume(returning: .success(element))
        _ = dropped
    }

    /// Ends the channel: the task takes what is buffered, then `error` (once) or nil. Later calls, and elements
    /// yielded after it, are dropped.
    @inlinable
    func finish(throwing error: WormholeError?) {
        let (waiter, outcome, onTermination) = state.withLock { state -> (Waiter?, Outcome?, (@Sendable () -> Void)?) in
            guard case .open = state.ending else { return (nil, nil, nil) }
            state.ending = .finished(error)
            let onTermination = state.onTermination
            state.onTermination = nil
            // A task waits only on an empty buffer: it takes the end now.
            guard let waiter = state.waiter else { return (nil, nil, onTermination) }
            state.waiter = nil
            return (waiter, state.takeNext(), onTermination)
        }
        // The callback core stops before the task sees the end, as with an `AsyncThrowingStream`: code after the
        // loop finds the listener gone.
        onTermination?()
        waiter?.resume(returning: outcome ?? .success(nil))
    }

    /// The next element; nil once the channel has ended, after throwing its error if it had one.
    ///
    /// One task calls it: a second task calling it while the first waits is a programming error, and traps.
    @inlinable
    func next() async throws(WormholeError) -> Element? {
        // A cancelled task ends the channel even while elements keep coming (it takes those buffered, then nil).
        if Task.isCancelled { finish(throwing: nil) }
        // An element already here is taken without suspending.
        if let outcome = state.withLock({ $0.takeNext() }) { return try outcome.get() }
        return try await withTaskCancellationHandler {
            await withUnsafeContinuation { (waiter: Waiter) in
                let outcome = state.withLock { state -> Outcome? in
                    if let outcome = state.takeNext() { return outcome }
                    precondition(state.waiter == nil, "A ListeningSequence was iterated by two tasks at once.")
                    state.waiter = waiter
                    return nil
                }
                if let outcome { waiter.resume(returning: outcome) }
            }
        } onCancel: {
            // As an `AsyncStream` does: what is buffered is still taken, then nil.
            finish(throwing: nil)
        }.get()
    }
}
