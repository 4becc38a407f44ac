import Synchronization

/// The listeners of one identifier in one wormhole, sharing one notifier observation and one read per change.
final class MailboxSubscription: Sendable {
    let identifier: String
    /// Read with ``Transiting/readMessageOnWake(identifier:)``: a directory's own skips the checks of a descriptor
    /// checked before, after a wake-up of its mailbox file's watch.
    private let transiting: any Transiting
    /// The listeners, in the order of their ids: a change copies this array (no allocation) rather than sorting a
    /// dictionary's values into a new one.
    private let sinks = Locked<[ListenerSink]>([])
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

    /// Adds a sink, or replaces the one with its id.
    func add(_ sink: ListenerSink) {
        sinks.withLock { sinks in
            sinks.removeAll { $0.id == sink.id }
            let index = sinks.firstIndex { $0.id > sink.id } ?? sinks.endIndex
            sinks.insert(sink, at: index)
        }
    }

    /// Removes a sink; returns whether none is left.
    func remove(_ id: UInt64) -> Bool {
        sinks.withLock { sinks in
            sinks.removeAll { $0.id == id }
            return sinks.isEmpty
        }
    }

    func removeAll() -> [ListenerSink] {
        sinks.withLock { sinks in
            defer { sinks = [] }
            return sinks
        }
    }

    /// Reads the mailbox once and offers the result to every listener.
    private func mailboxChanged() {
        let current = sinks.withLock { $0 }
        guard !current.isEmpty else { return }
        let result: Result<Envelope?, WormholeError>
        do {
            // The identifier was validated when listening began.
            result = .success(try transiting.readMessageOnWake(identifier: identifier))
        } catch {
            result = .failure(error)
        }
        for sink in current { sink.offer(result) }
    }
}
