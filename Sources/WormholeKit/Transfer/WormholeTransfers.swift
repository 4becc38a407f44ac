#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
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
///     open(file.path)                               // the file is now the receiver's, in its directory
/// }
/// ```
///
/// A transfer is queued and survives restarts of either side; each receiving consumer gets each file once (it is
/// moved, not copied, into the destination). A file of any size is streamed in 1 MiB chunks, never read into memory.
/// The sender may cancel a transfer until it is received.
public final class WormholeTransfers: Sendable {
    /// The transfer channel's identifier.
    public let identifier: String
    let queue: WormholeQueue
    let staging: DirectoryHandle
    let sender: String
    static let chunkSize = 1 << 20

    init(identifier: String, wormhole: Wormhole) throws(WormholeError) {
        try MessageIdentifier.validate(identifier)
        self.identifier = identifier
        self.queue = try wormhole.queue(identifier + ".transfers")
        self.staging = try queue.directory.subdirectory(named: identifier + ".files")
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
        let source = open(path, O_RDONLY | O_CLOEXEC)
        guard source >= 0 else { throw WormholeError.fileSystem(currentErrno, "open the file to send", path: path) }
        defer { _ = close(source) }
        var status = stat()
        guard fstat(source, &status) == 0, status.st_mode & S_IFMT == S_IFREG else {
            throw WormholeError(.ioFailure, "Only regular files can be sent.", path: path)
        }
        let id = UUID().uuidString.lowercased()
        let transfer = FileTransfer(
            id: id, name: name ?? URL(fileURLWithPath: path).lastPathComponent, size: UInt64(status.st_size),
            metadata: metadata, sender: sender)
        try MessageIdentifier.validate(transfer.name)
        let partial = id + ".part"
        let staged: OwnedDescriptor
        do {
            staged = try staging.openFile(named: partial, flags: O_WRONLY | O_CREAT | O_EXCL)
        } catch {
            throw WormholeError.fileSystem(error, "stage the file", path: staging.filePath(partial))
        }
        do throws(WormholeError) {
            try copy(from: source, to: staged.descriptor.rawValue, size: transfer.size, progress: progress)
            if case .failure(let errno) = staged.descriptor.synchronize() {
                throw WormholeError.fileSystem(errno, "flush the staged file", path: staging.filePath(partial))
            }
            // Complete: it takes its final name, then is queued.
            guard renameat(staging.rawDescriptor, partial, staging.rawDescriptor, id + ".file") == 0 else {
                throw WormholeError.fileSystem(currentErrno, "stage the file", path: staging.filePath(partial))
            }
            try queue.enqueue(transfer)
        } catch {
            _ = unlinkat(staging.rawDescriptor, partial, 0)
            _ = unlinkat(staging.rawDescriptor, id + ".file", 0)
            throw error
        }
        return transfer
    }

    private func copy(
        from source: Int32, to destination: Int32, size: UInt64, progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) {
        var buffer = [UInt8](repeating: 0, count: Self.chunkSize)
        var copied: UInt64 = 0
        while true {
            let count = buffer.withUnsafeMutableBytes { bytes in
                (try? valueOrErrno { read(source, bytes.baseAddress, bytes.count) }.get()) ?? -1
            }
            if count < 0 { throw WormholeError(.ioFailure, "Reading the file to send failed: \(currentErrno).") }
            if count == 0 { break }
            if case .failure(let errno) = Descriptor(rawValue: destination).write(Array(buffer[0..<count]), at: Int(copied)) {
                throw WormholeError.fileSystem(errno, "copy the file", path: nil)
            }
            copied += UInt64(count)
            progress?(TransferProgress(bytesCopied: copied, totalBytes: max(size, copied)))
        }
    }

    /// Cancels a transfer that no receiver has taken yet. Returns false when it was already received (or unknown).
    @discardableResult
    public func cancel(_ transferID: String) throws(WormholeError) -> Bool {
        guard UUID(uuidString: transferID) != nil else {
            throw WormholeError(.invalidIdentifier, "\(transferID) is not a transfer id.", identifier: identifier)
        }
        return unlinkat(staging.rawDescriptor, transferID.lowercased() + ".file", 0) == 0
    }

    /// The transfers sent and not yet received (nor cancelled), by the id of their staged file.
    public func pendingTransferIDs() throws(WormholeError) -> [String] {
        try staging.entries().filter { $0.hasSuffix(".file") }.map { String($0.dropLast(5)) }.sorted()
    }

    // MARK: Receiving

    /// Moves each file sent on this channel into `destination`, in order, and calls `handler` with it.
    ///
    /// The file is renamed into `destination` (copied when it is on another file system), under its transfer name,
    /// with ` (2)`, ` (3)`… added when the name is taken. The transfer is acknowledged when `handler` returns; a
    /// receiver killed before that gets the same file again (already in `destination`: it is not moved twice). A
    /// transfer cancelled before it was received is reported to `errorHandler` and passed over.
    public func receive(
        consumer: String,
        into destination: String,
        on execution: CallbackExecution = .serialQueue,
        errorHandler: (@Sendable (WormholeError) -> Void)? = nil,
        handler: @escaping @Sendable (ReceivedFile) throws -> Void
    ) throws(WormholeError) -> QueueConsumer {
        let target = try DirectoryHandle.open(path: destination, create: true)
        return try queue.consume(consumer: consumer, as: FileTransfer.self, on: execution, errorHandler: errorHandler) {
            [self] message in
            guard let file = try deliver(message.value, into: target) else {
                errorHandler?(
                    WormholeError(
                        .ioFailure, "Transfer \(message.value.id) (\(message.value.name)) was cancelled before it was received.",
                        identifier: identifier))
                return
            }
            try handler(file)
            _ = unlinkat(staging.rawDescriptor, message.value.id + ".delivered", 0)
        }
    }

    /// Moves a transfer's file into the destination, once; nil when it was cancelled.
    private func deliver(_ transfer: FileTransfer, into target: DirectoryHandle) throws(WormholeError) -> ReceivedFile? {
        let marker = transfer.id + ".delivered"
        // A delivery interrupted after the move: the marker says where the file went.
        if let recorded = try? String(contentsOfFile: staging.filePath(marker), encoding: .utf8), !recorded.isEmpty {
            return ReceivedFile(transfer: transfer, path: recorded)
        }
        let staged = transfer.id + ".file"
        guard faccessat(staging.rawDescriptor, staged, F_OK, AT_SYMLINK_NOFOLLOW) == 0 else { return nil }
        var name = transfer.name
        var attempt = 1
        while faccessat(target.rawDescriptor, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0 {
            attempt += 1
            let base = (transfer.name as NSString).deletingPathExtension
            let suffix = (transfer.name as NSString).pathExtension
            name = "\(base) (\(attempt))" + (suffix.isEmpty ? "" : "." + suffix)
        }
        let path = target.filePath(name)
        // Record where the file goes before it moves, so that a restart finds it there.
        do {
            try Data(path.utf8).write(to: URL(fileURLWithPath: staging.filePath(marker)))
        } catch {
            throw WormholeError(.ioFailure, "Could not record the delivery: \(error).", identifier: identifier, underlyingError: error)
        }
        if renameat(staging.rawDescriptor, staged, target.rawDescriptor, name) != 0 {
            let errno = currentErrno
            guard errno == .improperLink else {
                _ = unlinkat(staging.rawDescriptor, marker, 0)
                if errno == .noSuchFileOrDirectory { return nil }  // cancelled meanwhile
                throw WormholeError.fileSystem(errno, "move the received file", path: path)
            }
            try copyAcrossFileSystems(staged, to: name, in: target)
        }
        return ReceivedFile(transfer: transfer, path: path)
    }

    private func copyAcrossFileSystems(_ staged: String, to name: String, in target: DirectoryHandle) throws(WormholeError) {
        let source: OwnedDescriptor
        do { source = try staging.openFile(named: staged, flags: O_RDONLY) } catch {
            throw WormholeError.fileSystem(error, "open the received file", path: staging.filePath(staged))
        }
        let destination: OwnedDescriptor
        do { destination = try target.openFile(named: name, flags: O_WRONLY | O_CREAT | O_EXCL) } catch {
            throw WormholeError.fileSystem(error, "copy the received file", path: target.filePath(name))
        }
        try copy(from: source.descriptor.rawValue, to: destination.descriptor.rawValue, size: 0, progress: nil)
        _ = unlinkat(staging.rawDescriptor, staged, 0)
    }

    /// Removes staged copies left by senders killed mid-copy, older than `age`.
    public func removeAbandonedCopies(olderThan age: TimeInterval = 3600) throws(WormholeError) {
        for name in try staging.entries() where name.hasSuffix(".part") {
            var status = stat()
            if fstatat(staging.rawDescriptor, name, &status, AT_SYMLINK_NOFOLLOW) == 0,
                Date().timeIntervalSince1970 - Double(status.st_mtim.tv_sec) > age
            {
                _ = unlinkat(staging.rawDescriptor, name, 0)
            }
        }
    }
}

/// A file sent, as the queue carries it.
public struct FileTransfer: Codable, Sendable, Equatable {
    /// The transfer's id.
    public var id: String
    /// The name the receiver gets the file under.
    public var name: String
    /// Its size in bytes, when it was sent.
    public var size: UInt64
    /// What the sender attached.
    public var metadata: [String: String]
    /// Who sent it.
    public var sender: String
}

/// A file received: where it now is, and what came with it.
public struct ReceivedFile: Sendable, Equatable {
    /// The transfer.
    public var transfer: FileTransfer
    /// Where the file is now.
    public var path: String
}

/// How far a sender's copy has gone.
public struct TransferProgress: Sendable, Equatable {
    /// Bytes copied so far.
    public var bytesCopied: UInt64
    /// The file's size.
    public var totalBytes: UInt64
    /// From 0 to 1.
    public var fraction: Double { totalBytes == 0 ? 1 : Double(bytesCopied) / Double(totalBytes) }
}

extension Wormhole {
    /// The file-transfer channel named `identifier` in this wormhole's directory.
    public func transfers(_ identifier: String) throws(WormholeError) -> WormholeTransfers {
        try WormholeTransfers(identifier: identifier, wormhole: self)
    }
}
