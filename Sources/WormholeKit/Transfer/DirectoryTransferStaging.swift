#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
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
    }

    func stage(
        id: String, from path: String, progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) -> UInt64 {
        let source = open(path, O_RDONLY | O_CLOEXEC)
        guard source >= 0 else { throw WormholeError.fileSystem(currentErrno, "open the file to send", path: path) }
        defer { _ = close(source) }
        var status = stat()
        guard fstat(source, &status) == 0, status.st_mode & S_IFMT == S_IFREG else {
            throw WormholeError(.ioFailure, "Only regular files can be sent.", path: path)
        }
        let size = UInt64(status.st_size)
        let partial = id + ".part"
        let staged: OwnedDescriptor
        do {
            staged = try staging.openFile(named: partial, flags: O_WRONLY | O_CREAT | O_EXCL)
        } catch {
            throw WormholeError.fileSystem(error, "stage the file", path: staging.filePath(partial))
        }
        do throws(WormholeError) {
            try Self.copy(from: source, to: staged.descriptor.rawValue, size: size, progress: progress)
            if case .failure(let errno) = staged.descriptor.synchronize() {
                throw WormholeError.fileSystem(errno, "flush the staged file", path: staging.filePath(partial))
            }
            // Complete: it takes its final name.
            guard renameat(staging.rawDescriptor, partial, staging.rawDescriptor, id + ".file") == 0 else {
                throw WormholeError.fileSystem(currentErrno, "stage the file", path: staging.filePath(partial))
            }
        } catch {
            _ = unlinkat(staging.rawDescriptor, partial, 0)
            throw error
        }
        return size
    }

    static func copy(
        from source: Int32, to destination: Int32, size: UInt64, progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) {
        var buffer = [UInt8](repeating: 0, count: chunkSize)
        var copied: UInt64 = 0
        while true {
            let count = buffer.withUnsafeMutableBytes { bytes in
                (try? valueOrErrno { read(source, bytes.baseAddress, bytes.count) }.get()) ?? -1
            }
            if count < 0 { throw WormholeError(.ioFailure, "Reading the file to send failed: \(currentErrno).") }
            if count == 0 { break }
            if case .failure(let errno) = Descriptor(rawValue: destination).write(
                Array(buffer[0..<count]), at: Int(copied))
            {
                throw WormholeError.fileSystem(errno, "copy the file", path: nil)
            }
            copied += UInt64(count)
            progress?(TransferProgress(bytesCopied: copied, totalBytes: max(size, copied)))
        }
    }

    func remove(id: String) throws(WormholeError) -> Bool {
        unlinkat(staging.rawDescriptor, id + ".file", 0) == 0
    }

    func stagedIDs() throws(WormholeError) -> [String] {
        try staging.entries().filter { $0.hasSuffix(".file") }.map { String($0.dropLast(5)) }.sorted()
    }

    func deliver(_ transfer: FileTransfer, into destination: String) throws(WormholeError) -> ReceivedFile? {
        let target = try DirectoryHandle.open(path: destination, create: true)
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
            throw WormholeError(.ioFailure, "Could not record the delivery: \(error).", underlyingError: error)
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

    private func copyAcrossFileSystems(
        _ staged: String, to name: String, in target: DirectoryHandle
    ) throws(WormholeError) {
        let source: OwnedDescriptor
        do { source = try staging.openFile(named: staged, flags: O_RDONLY) } catch {
            throw WormholeError.fileSystem(error, "open the received file", path: staging.filePath(staged))
        }
        let destination: OwnedDescriptor
        do { destination = try target.openFile(named: name, flags: O_WRONLY | O_CREAT | O_EXCL) } catch {
            throw WormholeError.fileSystem(error, "copy the received file", path: target.filePath(name))
        }
        try Self.copy(from: source.descriptor.rawValue, to: destination.descriptor.rawValue, size: 0, progress: nil)
        _ = unlinkat(staging.rawDescriptor, staged, 0)
    }

    func finishDelivery(id: String) {
        _ = unlinkat(staging.rawDescriptor, id + ".delivered", 0)
    }

    func removeAbandonedCopies(olderThan age: Duration) throws(WormholeError) {
        let seconds = Double(age.components.seconds) + Double(age.components.attoseconds) / 1e18
        // Partial copies of senders that stopped, and the markers of deliveries long done.
        for name in try staging.entries() where name.hasSuffix(".part") || name.hasSuffix(".delivered") {
            var status = stat()
            if fstatat(staging.rawDescriptor, name, &status, AT_SYMLINK_NOFOLLOW) == 0,
                Date().timeIntervalSince1970 - Double(status.st_mtim.tv_sec) > seconds
            {
                _ = unlinkat(staging.rawDescriptor, name, 0)
            }
        }
    }
}
