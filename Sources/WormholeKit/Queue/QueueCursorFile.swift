import Foundation

/// A consumer's stored position: 16 bytes, `WHQC`, a CRC-32C of the offset, the offset (little-endian); then, since
/// the power-loss work, 20 optional bytes that name the record ending at the offset (its start and timestamp, with a
/// CRC-32C that covers the offset too), so that a position the log no longer backs is recognised. Readers of the
/// first 16 bytes alone are unaffected.
package final class QueueCursorFile: Sendable {
    /// The record a stored position ends: where it starts and its timestamp.
    package struct LastRecord: Equatable, Sendable {
        package var start: UInt64
        package var timestampNanoseconds: Int64

        package init(start: UInt64, timestampNanoseconds: Int64) {
            self.start = start
            self.timestampNanoseconds = timestampNanoseconds
        }
    }

    private static let magic: UInt32 = 0x4351_4857  // "WHQC"
    private let descriptor: Int32
    package let name: String
    package let path: String

    init(directory: DirectoryHandle, name: String, create: Bool) throws(WormholeError) {
        try MessageIdentifier.validate(name)
        self.name = name
        self.path = directory.filePath(name)
        let file: OwnedDescriptor
        do {
            file = try directory.openFile(named: name, flags: O_RDWR | (create ? O_CREAT : 0))
        } catch {
            throw WormholeError.fileSystem(
                error,
                "open the position of consumer \(name)",
                path: directory.filePath(name)
            )
        }
        guard try directory.trustedStatus(of: file.descriptor, name: name, identifier: nil) != nil else {
            throw WormholeError(.ioFailure, "The consumer's position file was removed while opening it.", path: path)
        }
        descriptor = file.release()
    }

    deinit { Descriptor(rawValue: descriptor).close() }

    /// The stored offset, or nil for a consumer that has not handled anything yet.
    package func read() throws(WormholeError) -> UInt64? {
        try readWithLastRecord()?.offset
    }

    /// The stored offset and, when stored with it, the record it ends.
    package func readWithLastRecord() throws(WormholeError) -> (offset: UInt64, last: LastRecord?)? {
        let bytes: [UInt8]
        switch Descriptor(rawValue: descriptor).read(count: 36, at: 0) {
        case .success(let read): bytes = read
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "read the position of consumer \(name)", path: path)
        }
        guard let position = Self.decode(bytes.count > 16 ? Array(bytes.prefix(16)) : bytes) else {
            throw WormholeError(
                .corruptMessage,
                "The position of consumer \(name) is damaged. Remove the file to start that consumer over from the "
                    + "oldest message kept.",
                path: path
            )
        }
        guard let offset = position.offset else { return nil }
        return (offset, Self.decodeLastRecord(bytes, offset: offset))
    }

    /// The record named after the first 16 bytes, if they hold a valid one for `offset` (an older writer's 16 bytes
    /// over a newer file leave a tail whose checksum no longer matches).
    package static func decodeLastRecord(_ bytes: [UInt8], offset: UInt64) -> LastRecord? {
        guard bytes.count >= 36 else { return nil }
        var covered = [UInt8](repeating: 0, count: 24)
        covered.store(offset, at: 0)
        covered.replaceSubrange(8..<24, with: bytes[16..<32])
        let slice = bytes[...]
        guard slice.load(at: 32) as UInt32 == CRC32C.checksum(covered[...]) else { return nil }
        return LastRecord(start: slice.load(at: 16), timestampNanoseconds: slice.load(at: 24))
    }

    /// The 20 bytes after the first 16 that name the record ending at `offset`.
    package static func encodeLastRecord(_ last: LastRecord, offset: UInt64) -> [UInt8] {
        var covered = [UInt8](repeating: 0, count: 24)
        covered.store(offset, at: 0)
        covered.store(last.start, at: 8)
        covered.store(last.timestampNanoseconds, at: 16)
        var bytes = Array(covered[8..<24])
        bytes += [0, 0, 0, 0]
        bytes.store(CRC32C.checksum(covered[...]), at: 16)
        return bytes
    }

    /// Decodes a position file's bytes: `.some(nil)` for an empty file, nil for damaged bytes.
    package static func decode(_ bytes: [UInt8]) -> (offset: UInt64?, Void)? {
        if bytes.isEmpty { return (nil, ()) }
        let slice = bytes[...]
        guard bytes.count == 16, slice.load(at: 0) as UInt32 == magic,
            slice.load(at: 4) as UInt32 == CRC32C.checksum(bytes[8..<16])
        else { return nil }
        return (slice.load(at: 8), ())
    }

    /// A position file's bytes.
    package static func encode(_ offset: UInt64) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 16)
        bytes.store(magic, at: 0)
        bytes.store(offset, at: 8)
        bytes.store(CRC32C.checksum(bytes[8..<16]), at: 4)
        return bytes
    }

    /// Stores an offset with one 36-byte write in place (within a sector, so a power cut keeps it whole or not at
    /// all); with `synchronize`, flushed before it returns.
    package func write(_ offset: UInt64, last: LastRecord? = nil, synchronize: Bool = false) throws(WormholeError) {
        // Without a record, the tail is rewritten too, so that an earlier one can never be taken for this offset's.
        let bytes =
            Self.encode(offset)
            + (last.map { Self.encodeLastRecord($0, offset: offset) } ?? [UInt8](repeating: 0, count: 20))
        var result = Descriptor(rawValue: descriptor).write(bytes, at: 0)
        if case .success = result, synchronize { result = Descriptor(rawValue: descriptor).synchronize() }
        if case .failure(let errno) = result {
            throw WormholeError.fileSystem(errno, "store the position of consumer \(name)", path: path)
        }
    }

    /// Flushes the stored position to the disk.
    package func synchronize() throws(WormholeError) {
        if case .failure(let errno) = Descriptor(rawValue: descriptor).synchronize() {
            throw WormholeError.fileSystem(errno, "flush the position of consumer \(name)", path: path)
        }
    }

    /// When the position was last stored: how recently the consumer was seen.
    package var lastWritten: Date? {
        guard case .success(let status) = Descriptor(rawValue: descriptor).status(), status.size > 0 else { return nil }
        return Date(timeIntervalSince1970: status.modificationTime)
    }
}
