import Synchronization

/// One listener's state: the newest message it has seen, and how to hand it the next.
///
/// Offers come from the notifier (one at a time); the listener's set-up ends with ``settle(current:deliveringCurrent:)``,
/// before which offers are held. The state lock keeps them in order so that a listener never sees an older message
/// after a newer one, nor one message twice.
final class ListenerSink: Sendable {
    let id: UInt64
    private let state = Locked(State())

    private struct State {
        /// The newest message seen (or the baseline).
        var last: Envelope?
        /// Whether registration read the mailbox: before, offers are held.
        var settled = false
        /// The last offer made while registering.
        var held: Result<Envelope?, WormholeError>?
    }
    private let cancelled: Flag
    private let deliver: @Sendable (Result<Envelope, WormholeError>) -> Void
    /// Run once when the sink is cancelled, however: it ends the listener's `AsyncSequence`, if any.
    private let onCancel = Locked<(@Sendable () -> Void)?>(nil)

    /// - Parameter cancelled: Set when the sink is cancelled; a scheduled delivery can check it before it runs.
    init(
        id: UInt64,
        cancelled: Flag = Flag(),
        deliver: @escaping @Sendable (Result<Envelope, WormholeError>) -> Void
    ) {
        self.id = id
        self.cancelled = cancelled
        self.deliver = deliver
    }

    var isCancelled: Bool { cancelled.isSet }

    func cancel() {
        guard !cancelled.set() else { return }
        let action = onCancel.withLock { action in
            defer { action = nil }
            return action
        }
        action?()
    }

    /// Sets what runs when the sink is cancelled; at once if it already is.
    func whenCancelled(_ action: @escaping @Sendable () -> Void) {
        onCancel.withLock { $0 = action }
        if isCancelled {
            onCancel.withLock { $0 = nil }
            action()
        }
    }

    /// Ends the listener's registration with what its read of the mailbox found: with `deliveringCurrent`, that is
    /// delivered; otherwise it is the baseline, and only later messages are. The last offer that came while
    /// registering (the notifier woke the listener before that read) was held: a message in it is delivered now if it
    /// is newer than the baseline, or if the read failed; an error in it is dropped, as the set-up's own is for a
    /// listener that did not ask for the current message (the next wake-up reads again).
    func settle(current: Result<Envelope?, WormholeError>, deliveringCurrent: Bool) {
        state.withLock { state in
            state.settled = true
            let held = state.held
            state.held = nil
            guard !isCancelled else { return }
            if deliveringCurrent {
                hand(current, to: &state)
            } else if case .success(let envelope) = current, state.last == nil {
                state.last = envelope
            }
            if let held, case .success = held { hand(held, to: &state) }
        }
    }

    /// Hands over what a read of the mailbox found, unless the listener has seen it (or a newer one) already; while
    /// the listener registers, keeps it until ``settle(current:deliveringCurrent:)``.
    func offer(_ result: Result<Envelope?, WormholeError>) {
        state.withLock { state in
            guard !isCancelled else { return }
            guard state.settled else {
                state.held = result
                return
            }
            hand(result, to: &state)
        }
    }

    private func hand(_ result: Result<Envelope?, WormholeError>, to state: inout State) {
        switch result {
        case .success(nil):
            return  // emptied: nothing to deliver; the next message has a higher sequence
        case .success(let envelope?):
            if let previous = state.last, !envelope.supersedes(previous) { return }
            state.last = envelope
            // Delivering under the lock keeps the order; `deliver` only schedules (or, on the notifier thread, runs
            // a callback that must not re-enter this listener's offers).
            deliver(.success(envelope))
        case .failure(let error):
            deliver(.failure(error))
        }
    }
}
