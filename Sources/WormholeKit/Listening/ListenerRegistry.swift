import Synchronization

/// One listener's state: the newest message it has seen, and how to hand it the next.
///
/// Offers come from the notifier (one at a time) and, once, from the listener's set-up; the state lock keeps them
/// in order so that a listener never sees an older message after a newer one, nor one message twice.
final class ListenerSink: Sendable {
    let id: UInt64
    private let lastSeen = Locked<Envelope?>(nil)
    private let cancelled = Atomic<Bool>(false)
    private let deliver: @Sendable (Result<Envelope, WormholeError>) -> Void
    /// Run once when the sink is cancelled, however: it ends the listener's `AsyncSequence`, if any.
    private let onCancel = Locked<(@Sendable () -> Void)?>(nil)

    init(id: UInt64, deliver: @escaping @Sendable (Result<Envelope, WormholeError>) -> Void) {
        self.id = id
        self.deliver = deliver
    }

    var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    func cancel() {
        guard !cancelled.exchange(true, ordering: .acquiringAndReleasing) else { return }
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

/// The listeners of one identifier in one wormhole, sharing one notifier observation and one read per change.
final class MailboxSubscription: Sendable {
    let identifier: String
    private let transiting: any Transiting
    private let sinks = Locked<[UInt64: ListenerSink]>([:])
    private let observation = Locked<NotifierObservation?>(nil)

    init(identifier: String, transiting: any Transiting) {
        self.identifier = identifier
        self.transiting = transiting
    }

    func start(notifier: any Notifier) throws(WormholeError) {
        let token = try notifier.observe(Wormhole.notificationName(forIdentifier: identifier)) { [weak self] in
            self?.mailboxChanged()
        }
        observation.withLock { $0 = token }
    }

    func stop() {
        let token = observation.withLock { token in
            defer { token = nil }
            return token
        }
        token?.cancel()
    }

    func add(_ sink: ListenerSink) { sinks.withLock { $0[sink.id] = sink } }

    /// Removes a sink; returns whether none is left.
    func remove(_ id: UInt64) -> Bool {
        sinks.withLock { sinks in
            sinks[id] = nil
            return sinks.isEmpty
        }
    }

    func removeAll() -> [ListenerSink] {
        sinks.withLock { sinks in
            defer { sinks = [:] }
            return Array(sinks.values)
        }
    }

    /// Reads the mailbox once and offers the result to every listener.
    private func mailboxChanged() {
        let current = sinks.withLock { $0.values.sorted { $0.id < $1.id } }
        guard !current.isEmpty else { return }
        let result: Result<Envelope?, WormholeError>
        do { result = .success(try transiting.readMessage(identifier: identifier)) } catch { result = .failure(error) }
        for sink in current { sink.offer(result) }
    }
}

/// A wormhole's subscriptions, by identifier.
final class ListenerRegistry: Sendable {
    private let subscriptions = Locked<[String: MailboxSubscription]>([:])
    private let nextID = Atomic<UInt64>(1)

    func makeID() -> UInt64 { nextID.add(1, ordering: .relaxed).oldValue }

    /// Adds a sink, observing the identifier's notifications first if nobody in this wormhole does yet.
    func add(
        _ sink: ListenerSink, identifier: String, transiting: any Transiting, notifier: any Notifier
    ) throws(WormholeError) {
        try subscriptions.withLock { (subscriptions) throws(WormholeError) in
            if let existing = subscriptions[identifier] {
                existing.add(sink)
                return
            }
            let subscription = MailboxSubscription(identifier: identifier, transiting: transiting)
            subscription.add(sink)
            try subscription.start(notifier: notifier)
            subscriptions[identifier] = subscription
        }
    }

    func remove(_ sink: ListenerSink, identifier: String) {
        sink.cancel()
        let emptied: MailboxSubscription? = subscriptions.withLock { subscriptions in
            guard let subscription = subscriptions[identifier], subscription.remove(sink.id) else { return nil }
            subscriptions[identifier] = nil
            return subscription
        }
        emptied?.stop()
    }

    /// How many identifiers have listeners; for tests.
    var countForTesting: Int { subscriptions.withLock { $0.count } }

    func removeAll(identifier: String) {
        let removed = subscriptions.withLock { $0.removeValue(forKey: identifier) }
        guard let removed else { return }
        for sink in removed.removeAll() { sink.cancel() }
        removed.stop()
    }
}
