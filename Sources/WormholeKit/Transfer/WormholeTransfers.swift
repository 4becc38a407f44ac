import Foundation

/// Files handed from one process of a group to another: WatchConnectivity's `transferFile`, between processes.
///
/// ```swift
/// let exports = try wormhole.transfers("exports")
/// let transfer = try exports.send(file: "/tmp/report.pdf", metadata: ["kind": "report"]) { progress in
///     print(progress.fraction)                      // for large files, as the copy goes
/// }
///
/// // In the receiving process:
/// let receiver = try exports.receive(consumer: "viewer", into: "/home/me/inbox") { file in
///     print("received", file.path)                  // the file is now the receiver's, in its directory
/// }
/// ```
///
/// A transfer is queued and survives restarts of either side; the channel's receiver gets each file once (it is
/// moved, not copied, into the destination): a file goes to one receiver, so a channel has one receiving consumer. A file of any size is streamed in chunks, never read into memory.
/// The sender may cancel a transfer until it is received. The wormhole's engine keeps the files (a
/// ``TransferStaging``) and the queue of transfers (a ``QueueLog``).
public final class WormholeTransfers: Sendable {
    /// The transfer channel's identifier.
    public let identifier: String
    let queue: WormholeQueue
    /// The engine's staging area of this channel.
    public let staging: any TransferStaging
    let sender: String

    init(identifier: String, wormhole: Wormhole) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        self.identifier = identifier
        self.queue = try wormhole.queue(identifier + ".transfers")
        self.staging = try wormhole.engine.transferStaging(identifier)
        self.sender = wormhole.sender
    }

    // MARK: Sending

    /// Copies a file into the wormhole and queues it for the receivers.
    ///
    /// - Parameters:
    ///   - path: The file to send; it is copied, and stays where it is.
    ///   - name: The name the receiver gets it under; the file's own name by default.
    ///   - metadata: Anything the receiver should know, as strings.
    ///   - progress: Called after each chunk copied.
    /// - Returns: The transfer, whose ``FileTransfer/id`` can cancel it.
    /// - Throws: ``WormholeError/Code/ioFailure`` when the file cannot be read, ``WormholeError/Code/diskFull``
    ///   (nothing is queued then, and the partial copy is removed).
    @discardableResult
    public func send(
        file path: String,
        name: String? = nil,
        metadata: [String: String] = [:],
        progress: (@Sendable (TransferProgress) -> Void)? = nil
    ) throws(WormholeError) -> FileTransfer {
        let id = UUID().uuidString.lowercased()
        let name = name ?? URL(fileURLWithPath: path).lastPathComponent
        try MessageIdentifier.validate(name)
        let size = try staging.stage(id: id, from: path, progress: progress)
        let transfer = FileTransfer(id: id, name: name, size: size, metadata: metadata, sender: sender)
        do throws(WormholeError) {
            try queue.enqueue(transfer)
        } catch {
            _ = try? staging.remove(id: id)
            throw error
        }
        return transfer
    }

    /// Cancels a transfer that no receiver has taken yet. Returns false when it was already taken (or unknown):
    /// once this returns true, the file is never delivered.
    ///
    /// - Throws: ``WormholeError/Code/invalidIdentifier`` for a string that is not a transfer id, and the file
    ///   system's error when the staged file is there but cannot be removed (nothing is cancelled then).
    @discardableResult
    public func cancel(_ transferID: String) throws(WormholeError) -> Bool {
        guard UUID(uuidString: transferID) != nil else {
            throw WormholeError(.invalidIdentifier, "\(transferID) is not a transfer id.", identifier: identifier)
        }
        return try staging.remove(id: transferID.lowercased())
    }

    /// The transfers sent and not yet received (nor cancelled), by the id of their staged file.
    public func pendingTransferIDs() throws(WormholeError) -> [String] {
        try staging.stagedIDs()
    }

    // MARK: Receiving

    /// Moves each file sent on this channel into `destination`, in order, and calls `handler` with it.
    ///
    /// The file is renamed into `destination` (copied when it is on another file system), under its transfer name,
    /// with ` (2)`, ` (3)`… added when the name is taken. The transfer is acknowledged when `handler` returns; a
    /// receiver killed before that gets the same file again (already in `destination`: it is not moved twice). A
    /// handler that throws gets it again, before any later file, after a wait of 1 s doubling to a minute, for as
    /// many times as it throws (``QueueRetryPolicy/forever``): a file is never skipped (a handler that throws
    /// `CancellationError` stops the receiver instead). A
    /// transfer cancelled before it was received is reported to `errorHandler` (or logged) and passed over, as is one
    /// whose staged file is not this package's (``WormholeError/Code/untrustedFile``) or whose chunks no sender
    /// writes (``WormholeError/Code/corruptMessage``): neither is handed over, and neither holds up the channel.
    ///
    /// - Returns: The receiver; it stops when cancelled or released.
    public func receive(
        consumer: String,
        into destination: String,
        on execution: CallbackExecution = .automatic,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (ReceivedFile) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        _ = try DirectoryHandle.open(path: destination, create: true)
        // The delivery whose marker is kept until the queue has acknowledged it: the next delivery's start.
        let acknowledged = Locked<String?>(nil)
        return try queue.consume(
            consumer: consumer,
            as: FileTransfer.self,
            retry: .forever,
            on: execution,
            errorHandler: errorHandler
        ) { [self] message in
            let transfer = message.value
            // The previous transfer's marker goes once its acknowledgement is on the disk: a power cut that kept the
            // marker's removal but lost the position would make the file look cancelled when it comes again.
            if let previous = acknowledged.withLock({ $0 }), (try? queue.log.synchronizePosition(of: consumer)) != nil {
                staging.finishDelivery(id: previous)
            }
            // What another process put in the queue names files: a name or id that could leave the destination or
            // the staging area is refused, never used.
            guard UUID(uuidString: transfer.id) != nil, transfer.id == transfer.id.lowercased(),
                MessageIdentifier.isValid(transfer.name)
            else {
                queue.report(
                    WormholeError(
                        .invalidIdentifier,
                        "A transfer with id \(transfer.id.debugDescription) and name \(transfer.name.debugDescription) "
                            + "is not one this package sends; it is passed over.",
                        identifier: identifier
                    ),
                    to: errorHandler
                )
                return
            }
            let delivered: ReceivedFile?
            do throws(WormholeError) {
                delivered = try staging.deliver(transfer, into: destination)
            } catch {
                guard error.code == .untrustedFile || error.code == .corruptMessage else { throw error }
                // A file or marker planted in the staging area, or chunks no sender writes: never handed over, and
                // they cannot block the channel (another try would find them as they are).
                var reported = error
                reported.message += " Transfer \(transfer.id) (\(transfer.name)) is passed over."
                queue.report(reported, to: errorHandler)
                return
            }
            guard let file = delivered else {
                queue.report(
                    WormholeError(
                        .ioFailure,
                        "Transfer \(transfer.id) (\(transfer.name)) was cancelled before it was received.",
                        identifier: identifier,
                        underlyingError: TransferCancelled()
                    ),
                    to: errorHandler
                )
                return
            }
            try handler(file)
            // Its marker says where the file went until the queue has stored that this transfer is done, so that a
            // receiver killed in between finds the file again; it goes when the next transfer starts, once this
            // acknowledgement is flushed (or with removeAbandonedCopies).
            acknowledged.withLock { $0 = transfer.id }
        }
    }

    /// The files received on this channel, as an `AsyncSequence`; see ``receive(consumer:into:on:errorHandler:handler:)``.
    ///
    /// A transfer is acknowledged once its file is in `destination` and handed to the sequence: a file the
    /// iteration has not reached yet when the sequence ends is already in `destination`, and is not delivered again.
    /// A transfer that cannot be delivered ends the sequence with its error.
    public func files(consumer: String, into destination: String) -> ListeningSequence<ReceivedFile> {
        ListeningSequence { (continuation) throws(WormholeError) in
            try receive(
                consumer: consumer,
                into: destination,
                on: .notifierThread,
                errorHandler: { continuation.finish(throwing: $0) }
            ) { file in continuation.yield(file) }
        }
    }

    /// Removes staged copies left by senders killed mid-copy, older than `age`.
    ///
    /// Delivery markers stay: one may be all that tells a receiver, back after a long stop, that a file it moved just
    /// before it was killed is still its to handle. A marker goes when its receiver's next delivery starts.
    public func removeAbandonedCopies(olderThan age: Duration = .seconds(3600)) throws(WormholeError) {
        try staging.removeAbandonedCopies(olderThan: age)
    }

    /// Removes staged copies left by senders killed mid-copy, older than `age` seconds.
    @available(*, deprecated, message: "Pass a Duration: removeAbandonedCopies(olderThan: .seconds(3600)).")
    public func removeAbandonedCopies(olderThan age: TimeInterval) throws(WormholeError) {
        try removeAbandonedCopies(olderThan: .milliseconds(Int64(age * 1000)))
    }
}
extension Wormhole {
    /// The file-transfer channel named `identifier`, kept by this wormhole's engine.
    public func transfers(_ identifier: String) throws(WormholeError) -> WormholeTransfers {
        try WormholeTransfers(identifier: identifier, wormhole: self)
    }
}

/// The ``WormholeError/underlyingError`` of the report that a transfer was cancelled before it was received: what a
/// receiver that expects cancellations (a session) passes over quietly.
struct TransferCancelled: Error, Sendable {}
