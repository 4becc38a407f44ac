import Foundation

/// A transfer channel's staging area in a directory: `IDENTIFIER.files/` beside the channel's queue, holding
/// `ID.part` while a sender copies, `ID.file` once whole, and `ID.delivered` (the destination path) while a receiver
/// delivers. `FORMAT.md` describes the files.
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
    }

    func stage(
        id: String,
        from path: String,
        progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) -> UInt64 {
        let source: OwnedDescriptor
        switch Descriptor.open(path: path, flags: O_RDONLY) {
        case .success(let opened): source = opened
        case .failure(let errno): throw WormholeError.fileSystem(errno, "open the file to send", path: path)
        }
        guard case .success(let status) = source.descriptor.status(), status.isRegularFile else {
            throw WormholeError(.ioFailure, "Only regular files can be sent.", path: path)
        }
        let size = UInt64(status.size)
        let partial = id + ".part"
        let staged: OwnedDescriptor
        do {
            staged = try staging.openFile(named: partial, flags: O_WRONLY | O_CREAT | O_EXCL)
        } catch {
            throw WormholeError.fileSystem(error, "stage the file", path: staging.filePath(partial))
        }
        do throws(WormholeError) {
            try Self.copy(from: source.descriptor, to: staged.descriptor, size: size, progress: progress)
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
        return size
    }

    static func copy(
        from source: Descriptor,
        to destination: Descriptor,
        size: UInt64,
        progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) {
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
    }

    func remove(id: String) throws(WormholeError) -> Bool {
        guard case .success = staging.removeFile(named: id + ".file") else { return false }
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
        let marker = transfer.id + ".delivered"
        let staged = transfer.id + ".file"
        // A delivery interrupted after the move: the marker says where the file went. Interrupted between the
        // marker and the move, the file is still staged: it is delivered again, from the start.
        if let recorded = try? String(contentsOfFile: staging.filePath(marker), encoding: .utf8), !recorded.isEmpty {
            if !staging.hasEntry(staged) { return ReceivedFile(transfer: transfer, path: recorded) }
            // A copy across file systems stopped after naming the copy, before removing the staged file: the copy
            // is whole (it was flushed before its rename).
            if let copied = try? FileManager.default.attributesOfItem(atPath: recorded)[.size] as? UInt64,
                copied == transfer.size
            {
                _ = staging.removeFile(named: staged)
                return ReceivedFile(transfer: transfer, path: recorded)
            }
            _ = staging.removeFile(named: marker)
        }
        guard staging.hasEntry(staged) else { return nil }
        let name = transfer.deliveryName { target.hasEntry($0) }
        let path = target.filePath(name)
        // Record where the file goes before it moves, so that a restart finds it there. The marker is written whole
        // (its bytes flushed before its name appears), so that the move can never reach the disk without it.
        let recording = staging.createFile(
            named: marker,
            bytes: Array(path.utf8),
            replacing: true,
            synchronize: staging.synchronizes
        )
        if case .failure(let errno) = recording {
            throw WormholeError.fileSystem(errno, "record the delivery", path: staging.filePath(marker))
        }
        if case .failure(let errno) = staging.moveEntry(staged, to: target, as: name) {
            guard errno == .improperLink else {
                _ = staging.removeFile(named: marker)
                if errno == .noSuchFileOrDirectory { return nil }  // cancelled meanwhile
                throw WormholeError.fileSystem(errno, "move the received file", path: path)
            }
            do throws(WormholeError) {
                try copyAcrossFileSystems(staged, to: name, in: target)
            } catch {
                // Nothing was delivered: the next attempt starts over instead of trusting the marker.
                _ = staging.removeFile(named: marker)
                throw error
            }
        }
        // With synchronizesWrites, the move is on the disk before the transfer is acknowledged: both directories'
        // entries, after the destination's own name (the receiver may have just made it).
        if staging.synchronizes {
            for result in [
                target.synchronizeParentEntries(), target.synchronizeEntries(), staging.synchronizeEntries(),
            ] {
                if case .failure(let errno) = result {
                    throw WormholeError.fileSystem(errno, "flush the delivery", path: target.path)
                }
            }
        }
        return ReceivedFile(transfer: transfer, path: path)
    }

    private func copyAcrossFileSystems(
        _ staged: String,
        to name: String,
        in target: DirectoryHandle
    ) throws(WormholeError) {
        let source: OwnedDescriptor
        do { source = try staging.openFile(named: staged, flags: O_RDONLY) } catch {
            throw WormholeError.fileSystem(error, "open the received file", path: staging.filePath(staged))
        }
        // Copied under a hidden name, flushed, then renamed: the receiver never finds a file cut short under the
        // transfer's name, whatever stops the copy.
        let partial = "." + name + ".part"
        let destination: OwnedDescriptor
        do { destination = try target.openFile(named: partial, flags: O_WRONLY | O_CREAT | O_TRUNC) } catch {
            throw WormholeError.fileSystem(error, "copy the received file", path: target.filePath(partial))
        }
        do throws(WormholeError) {
            try Self.copy(from: source.descriptor, to: destination.descriptor, size: 0, progress: nil)
            if case .failure(let errno) = destination.descriptor.synchronize() {
                throw WormholeError.fileSystem(errno, "flush the received file", path: target.filePath(partial))
            }
            if case .failure(let errno) = target.moveEntry(partial, to: target, as: name) {
                throw WormholeError.fileSystem(errno, "name the received file", path: target.filePath(name))
            }
        } catch {
            _ = target.removeFile(named: partial)
            throw error
        }
        // The copy's name on the disk before the only other copy goes.
        if case .failure(let errno) = target.synchronizeEntries() {
            throw WormholeError.fileSystem(errno, "flush the received file's name", path: target.filePath(name))
        }
        _ = staging.removeFile(named: staged)
    }

    func finishDelivery(id: String) {
        _ = staging.removeFile(named: id + ".delivered")
    }

    func removeAbandonedCopies(olderThan age: Duration) throws(WormholeError) {
        let seconds = Double(age.components.seconds) + Double(age.components.attoseconds) / 1e18
        // Partial copies of senders that stopped, and the markers of deliveries long done.
        for name in try staging.entries() where name.hasSuffix(".part") || name.hasSuffix(".delivered") {
            if case .success(let status) = staging.status(ofEntry: name),
                Date().timeIntervalSince1970 - status.modificationTime > seconds
            {
                _ = staging.removeFile(named: name)
            }
        }
    }
}
