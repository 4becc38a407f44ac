import Foundation

/// A consumer's stored position: 16 bytes, `WHQC`, a CRC-32C of the offset, the offset (little-endian).
package final class QueueCursorFile: Sendable {
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
        let bytes: [UInt8]
        switch Descriptor(rawValue: descriptor).read(count: 16, at: 0) {
        case .success(let read): bytes = read
        case .failure(let errno):
            throw WormholeError.fileSystem(errno, "read the position of consumer \(name)", path: path)
        }
        guard let position = Self.decode(bytes) else {
            throw WormholeError(
                .corruptMessage,
                "The position of consumer \(name) is damaged. Remove the file to start that consumer over from the "
                    + "oldest message kept.",
                path: path
            )
        }
        return position.offset
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

    /// Stores an offset with one 16-byte write in place (within a sector, so a power cut keeps it whole or not at
    /// all); with `synchronize`, flushed before it returns.
    package func write(_ offset: UInt64, synchronize: Bool = false) throws(WormholeError) {
        let bytes = Self.encode(offset)
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
