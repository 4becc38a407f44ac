import Foundation

/// A transfer channel's staging area in a directory: `IDENTIFIER.files/` beside the channel's queue, holding
/// `ID.part` while a sender copies, `ID.file` once whole, `ID.delivered` (the destination path) while a receiver
/// delivers, and `ID.claimed` while a receiver copies the file to another file system. `FORMAT.md` describes the
/// files.
final class DirectoryTransferStaging: TransferStaging {
    let staging: DirectoryHandle
    static let chunkSize = 1 << 20

    init(directory: DirectoryHandle, identifier: String) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        self.staging = try directory.subdirectory(named: identifier + ".files")
        // Staged files are flushed before their record is queued; their directory's name must be on the disk too.
        if case .failure(let errno) = directory.synchronizeEntries() {
            throw WormholeError.fileSystem(errno, "flush the directory of the staging area", path: directory.path)
        }
        // Delivery markers made by a process killed before their rename.
        staging.removeAbandonedTemporaryFiles()
    }

    func stage(
        id: String,
        from path: String,
        progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) -> UInt64 {
        let source: OwnedDescriptor
        // Not blocking: opening a FIFO with no writer would wait for one for good (it is refused below).
        switch Descriptor.open(path: path, flags: O_RDONLY | O_NONBLOCK) {
        case .success(let opened): source = opened
        case .failure(let errno): throw WormholeError.fileSystem(errno, "open the file to send", path: path)
        }
        guard case .success(let status) = source.descriptor.status(), status.isRegularFile else {
            throw WormholeError(.ioFailure, "Only regular files can be sent.", path: path)
        }
        let partial = id + ".part"
        let staged: OwnedDescriptor
        do {
            staged = try staging.openFile(named: partial, flags: O_WRONLY | O_CREAT | O_EXCL)
        } catch {
            throw WormholeError.fileSystem(error, "stage the file", path: staging.filePath(partial))
        }
        let copied: UInt64
        do throws(WormholeError) {
            copied = try Self.copy(
                from: source.descriptor,
                to: staged.descriptor,
                size: UInt64(status.size),
                progress: progress
            )
            if case .failure(let errno) = staged.descriptor.synchronize() {
                throw WormholeError.fileSystem(errno, "flush the staged file", path: staging.filePath(partial))
            }
            // Complete: it takes its final name.
            if case .failure(let errno) = staging.moveEntry(partial, to: staging, as: id + ".file") {
                throw WormholeError.fileSystem(errno, "stage the file", path: staging.filePath(partial))
            }
            // And its name: the queue's record of the transfer must never outlive the file in a power cut.
            if case .failure(let errno) = staging.synchronizeEntries() {
                throw WormholeError.fileSystem(errno, "flush the staging directory", path: staging.path)
            }
        } catch {
            _ = staging.removeFile(named: partial)
            throw error
        }
        // What was copied, which a file that grew or shrank meanwhile makes differ from its size when opened.
        return copied
    }

    /// Copies `source` from where it stands to the end, into `destination` from offset 0; returns the bytes copied.
    @discardableResult
    static func copy(
        from source: Descriptor,
        to destination: Descriptor,
        size: UInt64,
        progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) -> UInt64 {
        var buffer = [UInt8](repeating: 0, count: chunkSize)
        var copied: UInt64 = 0
        while true {
            let read = buffer.withUnsafeMutableBytes { source.read(into: $0) }
            let count: Int
            switch read {
            case .success(let n): count = n
            case .failure(let errno):
                throw WormholeError(.ioFailure, "Reading the file to send failed: \(errno).", underlyingError: errno)
            }
            if count == 0 { break }
            if case .failure(let errno) = destination.write(Array(buffer[0..<count]), at: Int(copied)) {
                throw WormholeError.fileSystem(errno, "copy the file", path: nil)
            }
            copied += UInt64(count)
            progress?(TransferProgress(bytesCopied: copied, totalBytes: max(size, copied)))
        }
        return copied
    }

    func remove(id: String) throws(WormholeError) -> Bool {
        switch staging.removeFile(named: id + ".file") {
        case .success: break
        case .failure(.noSuchFileOrDirectory): return false  // taken by a receiver (or claimed), or never staged
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "cancel the transfer", path: staging.filePath(id + ".file"))
        }
        if staging.synchronizes, case .failure(let errno) = staging.synchronizeEntries() {
            throw WormholeError.fileSystem(errno, "flush the cancellation", path: staging.path)
        }
        return true
    }

    func stagedIDs() throws(WormholeError) -> [String] {
        try staging.entries().filter { $0.hasSuffix(".file") }.map { String($0.dropLast(5)) }.sorted()
    }

    func deliver(_ transfer: FileTransfer, into destination: String) throws(WormholeError) -> ReceivedFile? {
        let target = try DirectoryHandle.open(path: destination, create: true, synchronizes: staging.synchronizes)
        let delivery = DirectoryTransferDelivery(transfer: transfer, staging: staging, target: target)
        // A delivery interrupted earlier: the marker names where the file was going.
        if let recorded = try delivery.recordedName() {
            if staging.hasEntry(delivery.staged) {
                // Interrupted before the move, or (where a move is a link then an unlink) between the two.
                if delivery.isStagedFile(named: recorded) {
                    _ = staging.removeFile(named: delivery.staged)
                    return try delivery.finish(as: recorded)
                }
            } else if staging.hasEntry(delivery.claimed) {
                // A copy to another file system: finished and named, or to be made again from the claimed file.
                if delivery.holdsDelivered(named: recorded) {
                    _ = staging.removeFile(named: delivery.claimed)
                    return try delivery.finish(as: recorded)
                }
                return try delivery.copyClaimed()
            } else if delivery.holdsDelivered(named: recorded) {
                return try delivery.finish(as: recorded)
            } else {
                // Cancelled before the move: nothing was delivered.
                _ = staging.removeFile(named: delivery.marker)
                return nil
            }
        }
        guard staging.hasEntry(delivery.staged) else { return nil }
        return try delivery.move()
    }

    func finishDelivery(id: String) {
        _ = staging.removeFile(named: id + ".delivered")
    }

    func removeAbandonedCopies(olderThan age: Duration) throws(WormholeError) {
        let seconds = Double(age.components.seconds) + Double(age.components.attoseconds) / 1e18
        // Partial copies of senders that stopped. Never a marker: one may be all that tells a receiver, back after a
        // long stop, that the file it moved before it was killed is its to handle (a marker goes when the delivery
        // after it starts, so at most one a consumer stays).
        for name in try staging.entries() where name.hasSuffix(".part") {
            if case .success(let status) = staging.status(ofEntry: name),
                Date().timeIntervalSince1970 - status.modificationTime > seconds
            {
                _ = staging.removeFile(named: name)
            }
        }
    }
}
