import Foundation

extension WormholeSession {
    // MARK: Application context

    /// Replaces the application context sent to the counterpart (`updateApplicationContext(_:)`).
    ///
    /// The context is stored at once: the counterpart receives it when it next activates (at once if it is
    /// activated), even if this process has exited by then. Only the newest context reaches it: updates made while
    /// it was away are not replayed one by one, and its handlers hear the keys that changed since the context it
    /// received before.
    ///
    /// - Throws: ``WormholeError/Code/notActivated``, ``WormholeError/Code/encodingFailed``, the engine's errors.
    public func updateApplicationContext(_ context: [String: JSONValue]) throws(WormholeError) {
        try requireActivated("update its application context")
        let record = SessionContextRecord(
            id: UUID().uuidString.lowercased(),
            context: context,
            sender: wormhole.sender,
            nanoseconds: ProcessFacts.wallClockNanoseconds()
        )
        _ = try wormhole.passMessageData(try Self.encode(record), identifier: outgoing.context)
    }

    /// Changes some keys of the application context sent to the counterpart, keeping the others, in one step.
    ///
    /// MMWormhole's context transiting works this way: each identifier is a key of the context.
    ///
    /// - Parameters:
    ///   - changes: The keys to set; a value of nil removes its key.
    func mergeApplicationContext(_ changes: [String: JSONValue?]) throws(WormholeError) {
        // Read, changed and written under one lock: two passes at once must not lose a key.
        try merging.withLock { (_) throws(WormholeError) in
            var context = try applicationContext
            for (key, value) in changes { context[key] = value }
            try updateApplicationContext(context)
        }
    }

    /// The application context this side sent last (`applicationContext`); empty when none.
    public var applicationContext: [String: JSONValue] {
        get throws(WormholeError) {
            guard let envelope = try wormhole.envelope(withIdentifier: outgoing.context) else { return [:] }
            return try Self.decode(SessionContextRecord.self, from: envelope.payload, identifier: outgoing.context)
                .context
        }
    }

    /// The application context this side last received from the counterpart (`receivedApplicationContext`);
    /// empty when none. Readable at any time, activated or not.
    public var receivedApplicationContext: [String: JSONValue] {
        get throws(WormholeError) {
            try receivedContext()?.context ?? [:]
        }
    }

    private func receivedContext() throws(WormholeError) -> SessionReceivedContext? {
        guard let envelope = try wormhole.envelope(withIdentifier: incoming.receivedContext) else { return nil }
        return try Self.decode(
            SessionReceivedContext.self,
            from: envelope.payload,
            identifier: incoming.receivedContext
        )
    }

    /// Hands the counterpart's newest context to the handlers if it is new, with the keys changed since the last
    /// one received; on the session's receiving queue, in order.
    ///
    /// The mailbox is read here rather than taken from the wake-up that asked for it: a wake-up handled late must
    /// never hand over an older context after a newer one.
    func receiveContext() {
        // With no handler, the context waits: recorded as received, it would never reach a handler registered later.
        guard activationState == .activated, !contextHandlers.isEmpty else { return }
        do throws(WormholeError) {
            guard let envelope = try wormhole.envelope(withIdentifier: incoming.context) else { return }
            let record = try Self.decode(
                SessionContextRecord.self,
                from: envelope.payload,
                identifier: incoming.context
            )
            let previous = try receivedContext()
            guard previous?.id != record.id else { return }
            let changed = record.context.changedKeys(comparedTo: previous?.context ?? [:])
            if !changed.isEmpty {
                let update = SessionContextUpdate(
                    context: record.context,
                    changedKeys: changed,
                    sender: record.sender,
                    date: Date(timeIntervalSince1970: Double(record.nanoseconds) / 1e9)
                )
                guard contextHandlers.deliverAndWait(update) else { return }
            }
            // Written after the handlers: a process killed in between gets this context again, never misses it.
            let received = SessionReceivedContext(id: record.id, context: record.context)
            _ = try wormhole.passMessageData(try Self.encode(received), identifier: incoming.receivedContext)
        } catch {
            report(error)
        }
    }

    /// Calls `handler` with each application context received, with the keys that changed; only when `keys` (if
    /// given) holds one of them.
    ///
    /// A context is received (and ``receivedApplicationContext`` changes) only while a handler is there: one that
    /// comes while none is waits for the first, which gets it at once.
    public func onApplicationContext(
        keys: Set<String>? = nil,
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (SessionContextUpdate) -> Void
    ) -> SessionListener {
        let listener = contextHandlers.listen(on: execution) { update in
            guard let keys else { return handler(update) }
            var filtered = update
            filtered.changedKeys = update.changedKeys.intersection(keys)
            if !filtered.changedKeys.isEmpty { handler(filtered) }
        }
        // A context that came while no handler was there is handed to this one.
        if activationState == .activated { receiveCurrentContext() }
        return listener
    }

    /// The application contexts received, as an `AsyncSequence`; see
    /// ``onApplicationContext(keys:on:handler:)``.
    public func applicationContexts(keys: Set<String>? = nil) -> ListeningSequence<SessionContextUpdate> {
        ListeningSequence { continuation in
            onApplicationContext(keys: keys, on: .notifierThread) { continuation.yield($0) }
        }
    }

    /// Reads the counterpart's context now and hands it over if it is new, on the receiving queue.
    func receiveCurrentContext() {
        receiving.async { [weak self] in self?.receiveContext() }
    }
}
