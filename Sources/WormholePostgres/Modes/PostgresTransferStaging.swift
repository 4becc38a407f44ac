import Foundation
import NIOCore
import NIOFoundationCompat
import PostgresNIO
import WormholeKit

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Files sent and not yet received, in `wormhole.transfer_chunks` as 1 MiB `bytea` chunks, with their state in
/// `wormhole.transfers`.
///
/// Neither side holds a whole file in memory: the sender inserts one chunk at a time, the receiver reads one chunk
/// at a time into a hidden file in the destination, flushes it and names it (a hard link, so that it never replaces a
/// file, then the hidden name removed). The transfer's row records where the
/// file goes before the copy starts, so a receiver killed mid-delivery finds it there, or starts again. The file's
/// name is flushed to the disk (the destination and its parent) before the server forgets the chunks: the server's
/// commit is durable, so a power cut must not take away the only copy left.
final class PostgresTransferStaging: TransferStaging {
    let engine: PostgresCore
    let channel: String
    static let chunkSize = 1 << 20

    init(engine: PostgresCore, channel: String) {
        self.engine = engine
        self.channel = channel
    }

    func stage(
        id: String,
        from path: String,
        progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) -> UInt64 {
        let attributes = try? FileManager.default.attributesOfItem(atPath: path)
        guard let attributes, attributes[.type] as? FileAttributeType == .typeRegular else {
            throw WormholeError(
                .ioFailure,
                "Only a regular file can be sent (not a directory, a device or a symbolic link), and it must exist.",
                path: path
            )
        }
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw WormholeError(.ioFailure, "Could not open the file to send.", path: path)
        }
        defer { try? handle.close() }
        let total = (attributes[.size] as? UInt64) ?? 0
        let what = "staging a file on \(channel)"
        try engine.connections.query(
            """
            INSERT INTO wormhole.transfers (grp, channel, id, state) VALUES (\(engine.group), \(channel), \(id), 'staging')
            """,
            doing: what
        )
        do throws(WormholeError) {
            var copied: UInt64 = 0
            var index: Int32 = 0
            while true {
                let chunk: Data
                do {
                    chunk = try handle.read(upToCount: Self.chunkSize) ?? Data()
                } catch {
                    throw WormholeError(.ioFailure, "Reading the file to send failed: \(error).", path: path)
                }
                if chunk.isEmpty { break }
                // The row's time moves with each chunk, so that a long send is not taken for an abandoned one; a row
                // removed meanwhile (by removeAbandonedCopies) stops the send, rather than leaving chunks of nothing.
                let stored = try engine.connections.query(
                    """
                    WITH touched AS (UPDATE wormhole.transfers SET updated = now()
                        WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(id) AND state = 'staging'
                        RETURNING id)
                    INSERT INTO wormhole.transfer_chunks (grp, channel, id, index, bytes)
                    SELECT \(engine.group), \(channel), id, \(index), \(ByteBuffer(data: chunk)) FROM touched
                    RETURNING index
                    """,
                    doing: what
                )
                guard !stored.isEmpty else { throw Self.removedWhileSent(path) }
                index += 1
                copied += UInt64(chunk.count)
                progress?(TransferProgress(bytesCopied: copied, totalBytes: max(total, copied)))
            }
            let staged = try engine.connections.query(
                """
                UPDATE wormhole.transfers SET state = 'staged', size = \(Int64(copied)), updated = now()
                WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(id) AND state = 'staging'
                RETURNING id
                """,
                doing: what
            )
            guard !staged.isEmpty else { throw Self.removedWhileSent(path) }
            return copied
        } catch {
            _ = try? remove(id: id)
            throw error
        }
    }

    private static func removedWhileSent(_ path: String) -> WormholeError {
        WormholeError(
            .ioFailure,
            "The transfer's row was removed while the file was being sent (by removeAbandonedCopies, or a cancel); "
                + "nothing was queued. Send it again.",
            path: path
        )
    }

    func remove(id: String) throws(WormholeError) -> Bool {
        let rows = try engine.connections.query(
            """
            WITH gone AS (DELETE FROM wormhole.transfers
                WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(id) AND state IN ('staging', 'staged')
                RETURNING state),
            chunks AS (DELETE FROM wormhole.transfer_chunks
                WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(id) AND EXISTS (SELECT 1 FROM gone))
            SELECT count(*) FILTER (WHERE state = 'staged') FROM gone
            """,
            doing: "removing a staged file"
        )
        return try decode(Int64.self, rows.first, doing: "removing a staged file") > 0
    }

    func stagedIDs() throws(WormholeError) -> [String] {
        let rows = try engine.connections.query(
            """
            SELECT id FROM wormhole.transfers WHERE grp = \(engine.group) AND channel = \(channel) AND state = 'staged'
            ORDER BY id COLLATE "C"
            """,
            doing: "listing staged files"
        )
        var ids: [String] = []
        for row in rows { ids.append(try decode(String.self, row, doing: "listing staged files")) }
        return ids
    }

    func deliver(_ transfer: FileTransfer, into given: String) throws(WormholeError) -> ReceivedFile? {
        let what = "receiving \(transfer.name)"
        // One spelling, so that a recorded path compares with it: `/d/` and `/d` are the same destination.
        var destination = given
        while destination.count > 1, destination.hasSuffix("/") { destination.removeLast() }
        let rows = try engine.connections.query(
            """
            SELECT state, path FROM wormhole.transfers
            WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(transfer.id)
            """,
            doing: what
        )
        guard let row = rows.first else { return nil }  // cancelled
        let (state, recorded): (String, String?)
        do { (state, recorded) = try row.decode((String, String?).self) } catch {
            throw WormholeError(.serverRejected, "Unexpected columns while \(what): \(error).")
        }
        let files = FileManager.default
        switch state {
        case "delivered":
            guard let recorded else { break }
            // The row's word is checked on the file itself: only a file this receiver made in its destination is
            // handed over again. The chunks went with the delivery, so anything else cannot be delivered anew.
            guard Self.isDelivery(of: transfer, at: recorded, in: destination) else {
                throw WormholeError(
                    .untrustedFile,
                    "The row of transfer \(transfer.id) says it was delivered to \(recorded.debugDescription), which is "
                        + "not a file this receiver made in \(destination): the row was changed by another program with "
                        + "the group's rights, or the file was moved. It is not handed over.",
                    path: recorded
                )
            }
            return ReceivedFile(transfer: transfer, path: recorded)
        case "delivering":
            // Killed after the rename and before recording it: the file is there, whole. A path that is not this
            // receiver's file is not believed: the transfer is delivered again from its chunks, which are still there.
            if let recorded {
                // Killed between naming the copy (a link) and removing its hidden name: that name goes first, so
                // that the file has its one link again.
                Self.removeHiddenName(destination + "/." + transfer.id + ".part", ifItIs: recorded)
            }
            if let recorded, Self.isDelivery(of: transfer, at: recorded, in: destination) {
                try flushName(of: recorded)
                try markDelivered(transfer, path: recorded)
                return ReceivedFile(transfer: transfer, path: recorded)
            }
        case "staged": break
        default: return nil
        }
        do {
            try files.createDirectory(
                atPath: destination,
                withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700]
            )
        } catch {
            throw WormholeError(.directoryUnavailable, "Could not create the destination: \(error).", path: destination)
        }
        // Where the file goes, recorded before it goes there; the same statement claims the transfer, so that a
        // cancellation after it fails, and one before it leaves no row to claim.
        guard var path = try record(transfer, in: destination) else { return nil }
        // Named by the transfer: two deliveries of files of one name never write into one hidden file.
        let partial = destination + "/." + transfer.id + ".part"
        // Opened in place, never through a link: `FileManager.createFile` writes a hidden `.dat.nosync…` file and
        // renames it, which a receiver killed in between left in the destination. A new file: a hidden name left by
        // an earlier try may be a link to a file delivered under another name, which truncating would empty.
        unlink(partial)
        let descriptor = open(partial, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw WormholeError(
                .ioFailure,
                "Could not create the received file (errno \(errno)).",
                path: partial
            )
        }
        let output = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        do throws(WormholeError) {
            defer { try? output.close() }
            var index: Int32 = 0
            var written: UInt64 = 0
            while true {
                let chunk = try engine.connections.query(
                    """
                    SELECT bytes FROM wormhole.transfer_chunks
                    WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(transfer.id) AND index = \(index)
                    """,
                    doing: what
                )
                guard let row = chunk.first else { break }
                let bytes = try decode(ByteBuffer.self, row, doing: what)
                // Checked as they arrive, before they are written: a chunk no sender makes, or one past the size the
                // transfer announced, never reaches the disk.
                guard bytes.readableBytes <= Self.chunkSize, written + UInt64(bytes.readableBytes) <= transfer.size
                else {
                    throw RowValues.corrupt(
                        "chunk \(index) of \(bytes.readableBytes) bytes, past the transfer's \(transfer.size) bytes "
                            + "or the 1 MiB a sender writes",
                        of: "transfer_chunks",
                        row: "transfer \(transfer.id) of group \(engine.group)"
                    )
                }
                do {
                    try output.write(contentsOf: bytes.readableBytesView)
                } catch {
                    throw WormholeError(.ioFailure, "Writing the received file failed: \(error).", path: partial)
                }
                index += 1
                written += UInt64(bytes.readableBytes)
            }
            guard written == transfer.size else {
                throw WormholeError(
                    .ioFailure,
                    "The server held \(written) of the transfer's \(transfer.size) bytes: chunks are missing, so the "
                        + "file is not handed over. The sender may send it again.",
                    path: path
                )
            }
            // F_FULLFSYNC on Darwin, where `fsync` (and FileHandle's `synchronize`) leave the drive's cache unflushed.
            if let errno = synchronizeToStableStorage(output.fileDescriptor) {
                throw WormholeError(.ioFailure, "Could not flush the received file: \(errno).", path: partial)
            }
            // Never over another file: a name taken since it was picked means another one, recorded first.
            var attempts = 0
            while link(partial, path) != 0 {
                let failure = errno
                attempts += 1
                guard failure == EEXIST, attempts < 100 else {
                    throw WormholeError(
                        .ioFailure,
                        "Could not name the received file: \(String(cString: strerror(failure))).",
                        path: path
                    )
                }
                guard let next = try record(transfer, in: destination) else {
                    throw WormholeError(.ioFailure, "The transfer's row went while it was received.", path: path)
                }
                path = next
            }
            unlink(partial)
            try flushName(of: path)
        } catch {
            try? files.removeItem(atPath: partial)
            throw error
        }
        try markDelivered(transfer, path: path)
        return ReceivedFile(transfer: transfer, path: path)
    }

    /// Whether `path` is a file this receiver made for `transfer` in `destination`: a plain name in that directory
    /// (under its spelling, or another spelling of it), a regular file reached without a link, with one link, this
    /// user's, of the transfer's size.
    static func isDelivery(of transfer: FileTransfer, at path: String, in destination: String) -> Bool {
        let name = (path as NSString).lastPathComponent
        guard !name.isEmpty, name != ".", name != "..", !name.utf8.contains(0) else {
            return false
        }
        guard path.hasSuffix("/" + name) else { return false }
        var directory = String(path.dropLast(name.count + 1))
        while directory.count > 1, directory.hasSuffix("/") { directory.removeLast() }
        guard sameDirectory(directory, destination) else { return false }
        var status = stat()
        guard lstat(path, &status) == 0 else { return false }
        return (status.st_mode & S_IFMT) == S_IFREG && status.st_nlink == 1 && status.st_uid == geteuid()
            && status.st_size >= 0 && UInt64(status.st_size) == transfer.size
    }

    /// Removes the hidden name `partial` when it is a link to the file at `path` (a receiver killed between linking
    /// the copy to its name and removing the hidden one); anything else there is left to the next copy.
    private static func removeHiddenName(_ partial: String, ifItIs path: String) {
        var hidden = stat()
        var named = stat()
        guard lstat(partial, &hidden) == 0, lstat(path, &named) == 0, hidden.st_dev == named.st_dev,
            hidden.st_ino == named.st_ino
        else { return }
        unlink(partial)
    }

    /// Whether two paths name one directory: the same string, or the same device and inode.
    private static func sameDirectory(_ one: String, _ other: String) -> Bool {
        if one == other { return true }
        var first = stat()
        var second = stat()
        guard stat(one, &first) == 0, stat(other, &second) == 0 else { return false }
        return first.st_dev == second.st_dev && first.st_ino == second.st_ino
    }

    /// Picks a free name in `destination` and records it in the transfer's row, claiming the transfer (`delivering`);
    /// nil when there is no row to claim (cancelled).
    private func record(_ transfer: FileTransfer, in destination: String) throws(WormholeError) -> String? {
        let name = transfer.deliveryName { FileManager.default.fileExists(atPath: destination + "/" + $0) }
        let path = destination + "/" + name
        let claimed = try engine.connections.query(
            """
            UPDATE wormhole.transfers SET state = 'delivering', path = \(path), updated = now()
            WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(transfer.id)
                AND state IN ('staged', 'delivering')
            RETURNING id
            """,
            doing: "receiving \(transfer.name)"
        )
        return claimed.isEmpty ? nil : path
    }

    /// Flushes a received file's name to the disk before the server deletes the chunks (and its directory's own
    /// name, which `createDirectory` may just have made).
    private func flushName(of path: String) throws(WormholeError) {
        let destination = (path as NSString).deletingLastPathComponent
        for directory in [(destination as NSString).deletingLastPathComponent, destination] {
            if let failure = Self.synchronizeDirectory(directory) {
                throw WormholeError(.ioFailure, "Could not flush \(directory): errno \(failure).", path: path)
            }
        }
    }

    /// `fsync` of a directory (`F_FULLFSYNC` on Darwin), for the entries in it; the errno when it failed.
    private static func synchronizeDirectory(_ path: String) -> Int32? {
        let descriptor = open(path.isEmpty ? "." : path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { return errno }
        defer { close(descriptor) }
        return synchronizeToStableStorage(descriptor)?.rawValue
    }

    private func markDelivered(_ transfer: FileTransfer, path: String) throws(WormholeError) {
        try engine.connections.query(
            """
            WITH chunks AS (DELETE FROM wormhole.transfer_chunks
                WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(transfer.id))
            UPDATE wormhole.transfers SET state = 'delivered', path = \(path), updated = now()
            WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(transfer.id)
            """,
            doing: "recording the delivery of \(transfer.name)"
        )
    }

    func finishDelivery(id: String) {
        engine.connections.submit(
            """
            DELETE FROM wormhole.transfers
            WHERE grp = \(engine.group) AND channel = \(channel) AND id = \(id) AND state = 'delivered'
            """,
            doing: "forgetting a delivered file"
        )
    }

    func removeAbandonedCopies(olderThan age: Duration) throws(WormholeError) {
        let seconds = age.secondsValue
        // Never a `delivered` row: it may be all that tells a receiver, back after a long stop, that the file it put in
        // place before it was killed is its to handle. Such a row goes when its receiver's next transfer starts.
        try engine.connections.query(
            """
            WITH old AS (DELETE FROM wormhole.transfers
                WHERE grp = \(engine.group) AND channel = \(channel) AND state = 'staging'
                    AND updated < now() - make_interval(secs => \(seconds))
                RETURNING id)
            DELETE FROM wormhole.transfer_chunks
            WHERE grp = \(engine.group) AND channel = \(channel) AND id IN (SELECT id FROM old)
            """,
            doing: "removing abandoned copies"
        )
    }
}
