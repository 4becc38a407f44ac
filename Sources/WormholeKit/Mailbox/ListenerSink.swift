import Synchronization

/// One listener's state: the newest message it has seen, and how to hand it the next.
///
/// Offers come from the notifier (one at a time) and, once, from the listener's set-up; the state lock keeps them
/// in order so that a listener never sees an older message after a newer one, nor one message twice.
final class ListenerSink: Sendable {
    let id: UInt64
    private let lastSeen = Locked<Envelope?>(nil)
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

    /// Records the message present when listening began, so that only later ones are delivered.
    func setBaseline(_ envelope: Envelope?) {
        lastSeen.withLock { last in if last == nil { last = envelope } }
    }

    /// Hands over what a read of the mailbox found, unless the listener has seen it (or a newer one) already.
    func offer(_ result: Result<Envelope?, WormholeError>) {
        lastSeen.withLock { last in
            guard !isCancelled else { return }
            switch result {
            case .success(nil):
                return  // emptied: nothing to deliver; the next message has a higher sequence
            case .success(let envelope?):
                if let previous = last, !envelope.supersedes(previous) { return }
                last = envelope
                // Delivering under the lock keeps the order; `deliver` only schedules (or, on the notifier
                // thread, runs a callback that must not re-enter this listener's offers).
                deliver(.success(envelope))
            case .failure(let error):
                deliver(.failure(error))
            }
        }
    }
}
