import Synchronization

/// A wormhole's subscriptions, by identifier.
final class ListenerRegistry: Sendable {
    private let subscriptions = Locked<[String: MailboxSubscription]>([:])
    private let nextID = Atomic<UInt64>(1)

    func makeID() -> UInt64 { nextID.add(1, ordering: .relaxed).oldValue }

    /// Adds a sink, observing the identifier's notifications first if nobody in this wormhole does yet.
    func add(
        _ sink: ListenerSink,
        identifier: String,
        transiting: any Transiting,
        notifier: any Notifier
    ) throws(WormholeError) {
        (notifier as? any PreparesObservation)?.prepareToObserve(Wormhole.notificationName(forIdentifier: identifier))
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
