import Foundation

extension WormholeSession {
    // MARK: User info

    /// Queues a dictionary for the counterpart (`transferUserInfo(_:)`): delivered in order and once, when the
    /// counterpart is activated with a user info handler, across restarts of either side.
    ///
    /// - Returns: The transfer, which ``cancelUserInfoTransfer(_:)`` can cancel until the counterpart takes it.
    /// - Throws: ``WormholeError/Code/notActivated``, ``WormholeError/Code/encodingFailed``, the engine's errors
    ///   (nothing is queued then).
    @discardableResult
    public func transferUserInfo(_ userInfo: [String: JSONValue]) throws(WormholeError) -> SessionUserInfoTransfer {
        try queueUserInfo(userInfo, current: false)
    }

    /// Queues a dictionary as the "current" one (`transferCurrentComplicationUserInfo(_:)`): delivered as
    /// ``transferUserInfo(_:)`` delivers, except that it replaces a current one the counterpart has not taken yet,
    /// which is then cancelled: the counterpart gets the newest.
    @discardableResult
    public func transferCurrentComplicationUserInfo(
        _ userInfo: [String: JSONValue]
    ) throws(WormholeError) -> SessionUserInfoTransfer {
        try queueUserInfo(userInfo, current: true)
    }

    private func queueUserInfo(
        _ userInfo: [String: JSONValue],
        current: Bool
    ) throws(WormholeError) -> SessionUserInfoTransfer {
        try requireActivated("transfer user info")
        let transfer = SessionUserInfoTransfer(
            id: UUID().uuidString.lowercased(),
            userInfo: userInfo,
            isCurrentComplicationInfo: current,
            sender: wormhole.sender,
            queuedNanoseconds: ProcessFacts.wallClockNanoseconds()
        )
        let outbox = try wormhole.suite(outgoing.userInfoOutbox)
        var superseded: [String] = []
        // In the outbox first: the receiver delivers only what the outbox still holds, so an entry written after
        // the queue's record could be taken for a cancelled one.
        try outbox.update(direction: "queued") { values in
            if current {
                for key in values.keys {
                    if let entry = values[key, as: SessionOutboxEntry.self], entry.transfer.isCurrentComplicationInfo,
                        entry.state == .queued
                    {
                        values.removeValue(forKey: key)
                        superseded.append(key)
                    }
                }
            }
            try values.set(SessionOutboxEntry(transfer: transfer, state: .queued), forKey: transfer.id)
        }
        do throws(WormholeError) {
            try wormhole.queue(outgoing.userInfo).enqueueData(try Self.encode(transfer))
        } catch {
            do throws(WormholeError) {
                try outbox.update(direction: "cancelled") { values in values.removeValue(forKey: transfer.id) }
            } catch let cleanup {
                // Listed as outstanding until removed; the counterpart never gets it, as it was never queued.
                report(cleanup)
            }
            throw error
        }
        running.withLock { running in
            running.sentUserInfo[transfer.id] = transfer
            for id in superseded { running.sentUserInfo[id] = nil }
        }
        return transfer
    }

    /// The user info transfers this side queued that the counterpart has not received yet
    /// (`outstandingUserInfoTransfers`), oldest first.
    public var outstandingUserInfoTransfers: [SessionUserInfoTransfer] {
        get throws(WormholeError) {
            let values = try wormhole.suite(outgoing.userInfoOutbox).snapshot()
            return values.keys.compactMap { values[$0, as: SessionOutboxEntry.self]?.transfer }
                .sorted { ($0.queuedNanoseconds, $0.id) < ($1.queuedNanoseconds, $1.id) }
        }
    }

    /// Cancels a user info transfer the counterpart has not taken yet. Returns false when it was taken (or is being
    /// handled) already, or is unknown.
    @discardableResult
    public func cancelUserInfoTransfer(_ transfer: SessionUserInfoTransfer) throws(WormholeError) -> Bool {
        var cancelled = false
        try wormhole.suite(outgoing.userInfoOutbox).update(direction: "cancelled") { values in
            guard let entry = values[transfer.id, as: SessionOutboxEntry.self], entry.state == .queued else { return }
            values.removeValue(forKey: transfer.id)
            cancelled = true
        }
        if cancelled { _ = running.withLock { $0.sentUserInfo.removeValue(forKey: transfer.id) } }
        return cancelled
    }

    /// Takes the counterpart's user info transfers in order while a handler is there.
    func consumeUserInfo() throws(WormholeError) -> QueueConsumer {
        let outbox = try wormhole.suite(incoming.userInfoOutbox)
        // On a queue of its own, never inline on the notifier's thread: the handler waits for the user's handlers,
        // which run where they were registered, perhaps on that very thread.
        return try wormhole.queue(incoming.userInfo).processData(
            consumer: name,
            // In order, never skipped: a transfer waits for the session's handlers however long it takes.
            retry: .forever,
            on: .serialQueue,
            errorHandler: { [weak self] error in self?.reportUnlessStopping(error) }
        ) { [weak self] message in
            // Not now: offered again at the next activation or handler (`wakeUp()`), or in a minute.
            guard let self, activationState == .activated, !userInfoHandlers.isEmpty else {
                return .later(Self.untilWoken)
            }
            let transfer: SessionUserInfoTransfer
            do throws(WormholeError) {
                transfer = try Self.decode(
                    SessionUserInfoTransfer.self,
                    from: message.value,
                    identifier: incoming.userInfo
                )
            } catch {
                // Unreadable now, unreadable later: offering it again would stop the queue for good.
                report(
                    WormholeError(
                        error.code,
                        error.message + " The record is passed over.",
                        identifier: incoming.userInfo
                    )
                )
                return .done
            }
            let outcome = try exclusively(incoming.userInfo, transfer.id) { () throws(WormholeError) -> QueueOutcome in
                if !running.withLock({ $0.handledUserInfo.contains(transfer.id) }) {
                    // Claimed in the outbox before the handlers run: from then on it cannot be cancelled, and if this
                    // process dies before it is done, it comes again and is delivered.
                    guard try claim(transfer.id, in: outbox) else { return .done }
                    // The last handler went while it was handed over: it waits for the next.
                    guard userInfoHandlers.deliverAndWait(transfer) else { return .later(Self.untilWoken) }
                    running.withLock { _ = $0.handledUserInfo.insert(transfer.id) }
                }
                // Handled: if this write fails, the transfer comes again and only this write is tried again.
                do throws(WormholeError) {
                    try outbox.update(direction: "delivered") { values in values.removeValue(forKey: transfer.id) }
                } catch {
                    retryConsumersLater()
                    throw error
                }
                running.withLock { _ = $0.handledUserInfo.remove(transfer.id) }
                return .done
            }
            // Another session of this process is handing it over: in a second.
            return outcome ?? .later(.seconds(1))
        }
    }

    /// How long a transfer waits for a handler, unless the session's next activation or handler wakes its consumer
    /// first.
    static let untilWoken = Duration.seconds(60)

    /// Marks a transfer of the counterpart's outbox as being delivered; false when it is not there (cancelled,
    /// replaced by a newer current one, or delivered before a crash).
    private func claim(_ id: String, in outbox: WormholeSuite) throws(WormholeError) -> Bool {
        var claimed = false
        do throws(WormholeError) {
            try outbox.update(direction: "delivering") { (values) throws(WormholeError) in
                guard values.json(forKey: id) != nil else { return }
                guard var entry = values[id, as: SessionOutboxEntry.self] else {
                    // There, but not in a form this build reads: neither delivered nor passed over.
                    throw WormholeError(
                        .unsupportedFormatVersion,
                        "The outbox entry of user info transfer \(id) is not one this build reads; it stays queued.",
                        identifier: incoming.userInfoOutbox
                    )
                }
                entry.state = .delivering
                try values.set(entry, forKey: id)
                claimed = true
            }
        } catch {
            retryConsumersLater()
            throw error
        }
        return claimed
    }

    /// Calls `handler` with each user info transfer from the counterpart, in order, once each
    /// (`didReceiveUserInfo`). The transfer is acknowledged when every handler has returned; a process killed before
    /// that gets it again.
    ///
    /// User info is taken from its queue only while at least one such handler is registered and the session is
    /// activated.
    public func onUserInfo(
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (SessionUserInfoTransfer) -> Void
    ) -> SessionListener {
        let listener = userInfoHandlers.listen(on: execution, handler)
        startConsumersReporting()
        // The consumer stays when the handler goes: with no handler, it leaves what comes for the next one.
        return listener
    }

    /// The user info transfers received, as an `AsyncSequence`; see ``onUserInfo(on:handler:)``.
    ///
    /// A transfer is acknowledged once it is handed to the sequence: one the iteration has not reached when the
    /// sequence ends is not delivered again. Use ``onUserInfo(on:handler:)`` to acknowledge after handling.
    public func userInfoTransfers() -> ListeningSequence<SessionUserInfoTransfer> {
        ListeningSequence { continuation in
            onUserInfo(on: .notifierThread) { continuation.yield($0) }
        }
    }

    /// Calls `handler` when the counterpart has received a user info transfer this side queued
    /// (`didFinish userInfoTransfer`), while this side is activated.
    public func onUserInfoTransferFinished(
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (SessionUserInfoTransfer) -> Void
    ) -> SessionListener {
        userInfoFinishedHandlers.listen(on: execution, handler)
    }

    // MARK: Files

    /// Queues a file for the counterpart (`transferFile(_:metadata:)`): copied into the wormhole in chunks, so
    /// the original may change or go afterwards, and delivered once into the counterpart's
    /// ``receivedFilesDirectory``, across restarts of either side.
    ///
    /// - Parameters:
    ///   - path: The file.
    ///   - name: The name the counterpart gets it under; the file's own by default.
    ///   - metadata: Anything the counterpart should know, as strings.
    ///   - progress: Called after each chunk copied.
    /// - Returns: The transfer, which ``cancelFileTransfer(_:)`` can cancel until the counterpart takes it.
    /// - Throws: ``WormholeError/Code/notActivated``, ``WormholeError/Code/ioFailure`` when the file cannot be read,
    ///   ``WormholeError/Code/diskFull``; nothing is queued then.
    @discardableResult
    public func transferFile(
        _ path: String,
        name: String? = nil,
        metadata: [String: String] = [:],
        progress: (@Sendable (TransferProgress) -> Void)? = nil
    ) throws(WormholeError) -> FileTransfer {
        try requireActivated("transfer a file")
        let transfer = try wormhole.transfers(outgoing.files).send(
            file: path,
            name: name,
            metadata: metadata,
            progress: progress
        )
        running.withLock { $0.sentFiles[transfer.id] = transfer }
        do throws(WormholeError) {
            let outbox = try wormhole.suite(outgoing.filesOutbox)
            try outbox.set(transfer, forKey: transfer.id, direction: "queued")
            // Received before its entry was written: the receiver found no entry to remove, so this side tidies up
            // and tells its handlers.
            if try !wormhole.transfers(outgoing.files).pendingTransferIDs().contains(transfer.id) {
                try outbox.removeValue(forKey: transfer.id, direction: "delivered")
                finishedFile(transfer.id)
            }
        } catch {
            // Queued already: the counterpart gets it; only the list of outstanding transfers misses it.
            report(error)
        }
        return transfer
    }

    /// The file transfers this side queued that the counterpart has not received yet (`outstandingFileTransfers`),
    /// ordered by id (the order they were queued in is not kept).
    public var outstandingFileTransfers: [FileTransfer] {
        get throws(WormholeError) {
            let pending = Set(try wormhole.transfers(outgoing.files).pendingTransferIDs())
            let values = try wormhole.suite(outgoing.filesOutbox).snapshot()
            return values.keys.filter(pending.contains).compactMap { values[$0, as: FileTransfer.self] }
                .sorted { $0.id < $1.id }
        }
    }

    /// Cancels a file transfer the counterpart has not taken yet. Returns false when it was taken already.
    @discardableResult
    public func cancelFileTransfer(_ transfer: FileTransfer) throws(WormholeError) -> Bool {
        let cancelled = try wormhole.transfers(outgoing.files).cancel(transfer.id)
        if cancelled {
            _ = running.withLock { $0.sentFiles.removeValue(forKey: transfer.id) }
            do throws(WormholeError) {
                try wormhole.suite(outgoing.filesOutbox).removeValue(forKey: transfer.id, direction: "cancelled")
            } catch {
                // Cancelled all the same: the outstanding list leaves out what is no longer staged.
                report(error)
            }
        }
        return cancelled
    }

    /// Takes the counterpart's files in order while a handler is there.
    func receiveFiles() throws(WormholeError) -> QueueConsumer {
        let outbox = try wormhole.suite(incoming.filesOutbox)
        // On a queue of its own, as `consumeUserInfo()`'s consumer.
        return try wormhole.transfers(incoming.files).receive(
            consumer: name,
            into: receivedFilesDirectory,
            on: .serialQueue,
            errorHandler: { [weak self] error in self?.reportUnlessStopping(error) }
        ) { [weak self] file in
            // Moved into the directory already: when it comes again, it is found there and not moved twice.
            guard let self, activationState == .activated else { throw NoHandlerLeft() }
            let id = file.transfer.id
            // A transfer's receive handler cannot put a file off: it throws, and the file comes again (in order).
            let handed: Void? = try exclusively(incoming.files, id) { () throws(WormholeError) in
                if !running.withLock({ $0.handledFiles.contains(id) }) {
                    guard fileHandlers.deliverAndWait(file) else { throw .noHandlerLeft }
                    running.withLock { _ = $0.handledFiles.insert(id) }
                }
                do throws(WormholeError) {
                    try outbox.removeValue(forKey: id, direction: "delivered")
                } catch {
                    retryConsumersLater()
                    throw error
                }
                running.withLock { _ = $0.handledFiles.remove(id) }
            }
            if handed == nil { throw NoHandlerLeft() }
        }
    }

    /// Calls `handler` with each file from the counterpart, in order, once each (`didReceive file`). The file is in
    /// ``receivedFilesDirectory`` and is yours: move it or remove it. The transfer is acknowledged when every handler
    /// has returned.
    ///
    /// Files are taken from their queue only while at least one such handler is registered and the session is
    /// activated.
    public func onFile(
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (ReceivedFile) -> Void
    ) -> SessionListener {
        let listener = fileHandlers.listen(on: execution, handler)
        startConsumersReporting()
        return listener
    }

    /// The files received, as an `AsyncSequence`; see ``onFile(on:handler:)``. A file is acknowledged once it is
    /// handed to the sequence.
    public func files() -> ListeningSequence<ReceivedFile> {
        ListeningSequence { continuation in
            onFile(on: .notifierThread) { continuation.yield($0) }
        }
    }

    /// Calls `handler` when the counterpart has received a file this side sent (`didFinish fileTransfer`), while
    /// this side is activated.
    public func onFileTransferFinished(
        on execution: CallbackExecution = .automatic,
        handler: @escaping @Sendable (FileTransfer) -> Void
    ) -> SessionListener {
        fileFinishedHandlers.listen(on: execution, handler)
    }

    // MARK: Plumbing

    /// Tells the "finished" handlers of a file sent from here, once.
    private func finishedFile(_ id: String) {
        if let transfer = running.withLock({ $0.sentFiles.removeValue(forKey: id) }) {
            fileFinishedHandlers.deliver(transfer)
        }
    }

    /// Reports an error of a consumer, except the refusal of a consumer that is stopping, whose transfer stays for
    /// the next one.
    private func reportUnlessStopping(_ error: WormholeError) {
        if error.underlyingError is NoHandlerLeft { return }
        if let inner = error.underlyingError as? WormholeError, inner.underlyingError is NoHandlerLeft { return }
        if error.underlyingError is TransferCancelled {
            // The sender cancelled it: its outbox entry went with it, and nobody waits for it.
            logger.debug("session \(name)←\(counterpart): \(error.message)")
            return
        }
        report(error)
    }

    private func startConsumersReporting() {
        do throws(WormholeError) {
            try startConsumers()
        } catch {
            report(error)
        }
    }

    /// Watches this side's outboxes for the counterpart's deliveries, to tell the "finished" handlers.
    func observeOutboxes() throws(WormholeError) -> [any WormholeCancellable] {
        // Everything outstanding now may finish while this side is activated.
        let userInfoOutbox = try wormhole.suite(outgoing.userInfoOutbox)
        let filesOutbox = try wormhole.suite(outgoing.filesOutbox)
        let outstandingUserInfo = try outstandingUserInfoTransfers
        let filesValues = try filesOutbox.snapshot()
        let outstandingFiles = filesValues.keys.compactMap { filesValues[$0, as: FileTransfer.self] }
        running.withLock { running in
            for transfer in outstandingUserInfo { running.sentUserInfo[transfer.id] = transfer }
            for transfer in outstandingFiles { running.sentFiles[transfer.id] = transfer }
        }
        let userInfo = try userInfoOutbox.observe(includingOwnChanges: true, direction: "delivered") {
            [weak self] change in
            guard let self else { return }
            let finished = running.withLock { running in
                change.keys.sorted().compactMap { running.sentUserInfo.removeValue(forKey: $0) }
            }
            for transfer in finished { userInfoFinishedHandlers.deliver(transfer) }
        }
        let files = try filesOutbox.observe(includingOwnChanges: true, direction: "delivered") { [weak self] change in
            guard let self else { return }
            for id in change.keys.sorted() { finishedFile(id) }
        }
        return [userInfo, files]
    }
}

/// What a session's consumer throws when the session stopped, or its last handler went, while a transfer came: the
/// transfer stays unacknowledged, for the next activation or handler.
struct NoHandlerLeft: Error, Sendable {}

extension WormholeError {
    /// ``NoHandlerLeft`` where a `WormholeError` is thrown.
    static var noHandlerLeft: WormholeError {
        WormholeError(
            .handlerFailed,
            "No handler took the transfer; it stays queued.",
            underlyingError: NoHandlerLeft()
        )
    }
}
