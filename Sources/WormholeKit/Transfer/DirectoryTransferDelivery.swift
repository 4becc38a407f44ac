import Foundation

/// One delivery of a staged file into a destination directory, in steps that a receiver killed at any point takes
/// up again (`FORMAT.md`, "Transfers"):
///
/// 1. `ID.delivered` records the destination path, written whole (its bytes flushed before its name appears);
/// 2. `ID.file` is renamed into the destination under a name free there, never over another file (a name taken
///    meanwhile means recording another); on another file system it is first claimed (renamed `ID.claimed`, which a
///    cancellation no longer removes), copied to `.ID.part` in the destination, flushed and renamed to its name,
///    and then `ID.claimed` goes;
/// 3. with `synchronizesWrites`, both directories are flushed.
///
/// A cancellation removes `ID.file`: it succeeds until the move or the claim, and nothing is delivered after it.
struct DirectoryTransferDelivery {
    let transfer: FileTransfer
    let staging: DirectoryHandle
    let target: DirectoryHandle

    /// Names taken in the destination while this delivery looks for a free one: past this many, it gives up.
    static let maximumAttempts = 100

    var marker: String { transfer.id + ".delivered" }
    var staged: String { transfer.id + ".file" }
    var claimed: String { transfer.id + ".claimed" }
    var partial: String { "." + transfer.id + ".part" }

    /// The name in the destination that the marker records, or nil when there is no marker.
    ///
    /// The marker is another process's file: it is read without following a link, and what it names must be a file
    /// of this destination, or it is refused as ``WormholeError/Code/untrustedFile``.
    func recordedName() throws(WormholeError) -> String? {
        let file: OwnedDescriptor
        do {
            file = try staging.openFile(named: marker, flags: O_RDONLY)
        } catch .noSuchFileOrDirectory {
            return nil
        } catch {
            throw WormholeError.fileSystem(error, "read the delivery marker", path: staging.filePath(marker))
        }
        guard let status = try staging.trustedStatus(of: file.descriptor, name: marker, identifier: nil) else {
            return nil  // removed meanwhile
        }
        let bytes: [UInt8]
        switch file.descriptor.read(count: min(status.size, 64 * 1024), at: 0) {
        case .success(let read): bytes = read
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "read the delivery marker", path: staging.filePath(marker))
        }
        let recorded = String(decoding: bytes, as: UTF8.self)
        if recorded.isEmpty { return nil }  // cut short before its bytes were flushed: never a move after it
        let name = (recorded as NSString).lastPathComponent
        guard Self.isPlainName(name), recorded == target.filePath(name) || isTarget(directoryOf: recorded) else {
            throw WormholeError(
                .untrustedFile,
                "The delivery marker \(marker) names \(recorded.debugDescription), which is not a file of the "
                    + "destination \(target.path): it was not written by this package. Remove it.",
                path: staging.filePath(marker)
            )
        }
        return name
    }

    /// Whether the directory of `path` is the destination, reached by another spelling of its path.
    private func isTarget(directoryOf path: String) -> Bool {
        var raw = stat()
        guard stat((path as NSString).deletingLastPathComponent, &raw) == 0,
            case .success(let destination) = Descriptor(rawValue: target.rawDescriptor).status()
        else { return false }
        return UInt64(raw.st_dev) == destination.device && UInt64(raw.st_ino) == destination.inode
    }

    /// A file name that stays in its directory: not empty, not `.` or `..`, with no `/` and no NUL.
    static func isPlainName(_ name: String) -> Bool {
        !name.isEmpty && name != "." && name != ".." && !name.contains("/") && !name.utf8.contains(0)
            && name.utf8.count <= 255
    }

    /// Whether the destination holds the delivered file under `name`: a regular file of the transfer's size.
    func holdsDelivered(named name: String) -> Bool {
        guard case .success(let status) = target.status(ofEntry: name) else { return false }
        return status.isRegularFile && UInt64(status.size) == transfer.size
    }

    /// Whether `name` in the destination is the staged file itself: a move made as a link then an unlink (where
    /// `renameat2` is missing) stopped between the two.
    func isStagedFile(named name: String) -> Bool {
        guard case .success(let delivered) = target.status(ofEntry: name),
            case .success(let stagedFile) = staging.status(ofEntry: staged)
        else { return false }
        return delivered.device == stagedFile.device && delivered.inode == stagedFile.inode
    }

    /// Moves the staged file into the destination, or claims and copies it there when it is on another file system;
    /// nil when it was cancelled first.
    func move() throws(WormholeError) -> ReceivedFile? {
        guard try stagedFileIsTrusted() else { return nil }
        for _ in 0..<Self.maximumAttempts {
            let name = try record()
            switch staging.moveEntryWithoutReplacing(staged, to: target, as: name) {
            case .success:
                return try finish(as: name)
            case .failure(.fileExists):
                continue  // taken since it was picked: another name
            case .failure(.noSuchFileOrDirectory):
                _ = staging.removeFile(named: marker)
                return nil  // cancelled meanwhile
            case .failure(.improperLink):
                // Another file system: claimed first, so that a cancellation cannot succeed while the copy is made.
                switch staging.moveEntry(staged, to: staging, as: claimed) {
                case .success:
                    return try copyClaimed()
                case .failure(.noSuchFileOrDirectory):
                    _ = staging.removeFile(named: marker)
                    return nil
                case .failure(let errno):
                    _ = staging.removeFile(named: marker)
                    throw WormholeError.fileSystem(errno, "claim the received file", path: staging.filePath(staged))
                }
            case .failure(let errno):
                _ = staging.removeFile(named: marker)
                throw WormholeError.fileSystem(errno, "move the received file", path: target.filePath(name))
            }
        }
        throw noFreeName()
    }

    /// Copies the claimed file to `.ID.part` in the destination, flushes it, and names it (never over another file).
    func copyClaimed() throws(WormholeError) -> ReceivedFile {
        let source: OwnedDescriptor
        do { source = try staging.openFile(named: claimed, flags: O_RDONLY) } catch {
            throw WormholeError.fileSystem(error, "open the received file", path: staging.filePath(claimed))
        }
        // Copied under a hidden name of this transfer's, flushed, then renamed: the receiver never finds a file cut
        // short under its name, whatever stops the copy, and two deliveries never write into one file.
        let destination: OwnedDescriptor
        do { destination = try target.openFile(named: partial, flags: O_WRONLY | O_CREAT | O_TRUNC) } catch {
            throw WormholeError.fileSystem(error, "copy the received file", path: target.filePath(partial))
        }
        do throws(WormholeError) {
            try DirectoryTransferStaging.copy(
                from: source.descriptor,
                to: destination.descriptor,
                size: transfer.size,
                progress: nil
            )
            if case .failure(let errno) = destination.descriptor.synchronize() {
                throw WormholeError.fileSystem(errno, "flush the received file", path: target.filePath(partial))
            }
        } catch {
            _ = target.removeFile(named: partial)
            throw error
        }
        for _ in 0..<Self.maximumAttempts {
            let name = try record()
            switch target.moveEntryWithoutReplacing(partial, to: target, as: name) {
            case .success:
                // The copy's name on the disk before the only other copy goes.
                if case .failure(let errno) = target.synchronizeEntries() {
                    throw WormholeError.fileSystem(errno, "flush the received file's name", path: target.filePath(name))
                }
                _ = staging.removeFile(named: claimed)
                return try finish(as: name)
            case .failure(.fileExists):
                continue
            case .failure(let errno):
                _ = target.removeFile(named: partial)
                throw WormholeError.fileSystem(errno, "name the received file", path: target.filePath(name))
            }
        }
        throw noFreeName()
    }

    /// With `synchronizesWrites`, puts the move on the disk before the transfer is acknowledged: both directories'
    /// entries, after the destination's own name (the receiver may have just made it).
    func finish(as name: String) throws(WormholeError) -> ReceivedFile {
        if staging.synchronizes {
            for result in [
                target.synchronizeParentEntries(), target.synchronizeEntries(), staging.synchronizeEntries(),
            ] {
                if case .failure(let errno) = result {
                    throw WormholeError.fileSystem(errno, "flush the delivery", path: target.path)
                }
            }
        }
        return ReceivedFile(transfer: transfer, path: target.filePath(name))
    }

    /// Picks a name free in the destination and records it in the marker, written whole before anything moves.
    private func record() throws(WormholeError) -> String {
        let name = transfer.deliveryName { target.hasEntry($0) }
        let recording = staging.createFile(
            named: marker,
            bytes: Array(target.filePath(name).utf8),
            replacing: true,
            synchronize: staging.synchronizes
        )
        if case .failure(let errno) = recording {
            throw WormholeError.fileSystem(errno, "record the delivery", path: staging.filePath(marker))
        }
        return name
    }

    /// Whether the staged file is there and one this package wrote: a regular file with one link (and this user's,
    /// unless the directory is shared). A planted link or directory is refused as ``WormholeError/Code/untrustedFile``.
    private func stagedFileIsTrusted() throws(WormholeError) -> Bool {
        let file: OwnedDescriptor
        do {
            file = try staging.openFile(named: staged, flags: O_RDONLY)
        } catch .noSuchFileOrDirectory {
            return false
        } catch {
            throw WormholeError.fileSystem(error, "open the received file", path: staging.filePath(staged))
        }
        return try staging.trustedStatus(of: file.descriptor, name: staged, identifier: nil) != nil
    }

    private func noFreeName() -> WormholeError {
        WormholeError(
            .ioFailure,
            "No free name for \(transfer.name) in \(target.path) after \(Self.maximumAttempts) tries: other "
                + "processes took each one first. Receive into a directory of this receiver's own.",
            path: target.path
        )
    }
}
