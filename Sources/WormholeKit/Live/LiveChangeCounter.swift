import Foundation
import SystemPackage

#if os(Linux) || os(Android)
import CWormholeSystem
#endif

/// The count of changes to the `.live` directory's listeners, in the file `.live/.changes`, read and added to through
/// a shared mapping of it.
///
/// A listener adds 1 once its socket is in place and again once it removed it; a sender that removes a dead
/// listener's socket adds 1 too. A sender that finds the count as it was when it last read the directory knows that
/// its list of listeners is still whole: a load from memory, where the directory's modification time took an `fstat`
/// per message. The count is a plain little-endian 64-bit integer at the file's start (FORMAT.md, "Live messages").
///
/// Only on Linux, and on the local file systems whose shared mappings the queue's positions use too (ext4 and tmpfs);
/// elsewhere ``open(in:)`` gives nil and senders look at the directory's modification time instead.
final class LiveChangeCounter: @unchecked Sendable {
    /// The file's name in `.live`.
    static let fileName = ".changes"
    /// The mapped count. Read and written only with atomic operations, by every process of the group.
    private let count: UnsafeMutablePointer<UInt64>

    private init(count: UnsafeMutablePointer<UInt64>) { self.count = count }

    deinit { munmap(UnsafeMutableRawPointer(count), MemoryLayout<UInt64>.size) }

    /// Opens (or creates) the counter of `directory`, the `.live` directory; nil where the count cannot be shared
    /// through a mapping (another platform or file system), where every process of the directory looks at its
    /// modification time instead.
    ///
    /// - Throws: ``WormholeError`` when the count can be shared and this process cannot share it: the file is not one
    ///   the wormhole trusts (a link, another user's), or the process is out of descriptors, memory or disk space. A
    ///   listener it made would not be counted, and senders that read the count would not find it.
    static func open(in directory: DirectoryHandle) throws(WormholeError) -> LiveChangeCounter? {
        #if os(Linux) || os(Android)
        guard MappedFiles.fileSystemsWrittenInPlace.contains(cwormhole_file_system_type(directory.rawDescriptor))
        else { return nil }
        let path = directory.filePath(fileName)
        let file: OwnedDescriptor
        do { file = try directory.openFile(named: fileName, flags: O_RDWR | O_CREAT) } catch {
            throw WormholeError.fileSystem(error, "open \(fileName), the count of live listeners,", path: path)
        }
        let descriptor = file.descriptor
        // A planted file (a link, another user's) is refused, as every file of the wormhole is.
        guard try directory.trustedStatus(of: descriptor, name: fileName, identifier: nil) != nil else {
            throw WormholeError(.ioFailure, "\(fileName) was removed while it was opened; try again.", path: path)
        }
        // The count's block allocated (and the file grown to hold it, a new one being empty), never its bytes
        // overwritten: a store through the mapping then needs no new block, so a full disk cannot fault it.
        let allocated = posix_fallocate(descriptor.rawValue, 0, off_t(MemoryLayout<UInt64>.size))
        guard allocated == 0 else {
            throw WormholeError.fileSystem(
                Errno(rawValue: allocated),
                "make room for \(fileName), the count of live listeners,",
                path: path
            )
        }
        let mapping = mmap(
            nil,
            MemoryLayout<UInt64>.size,
            PROT_READ | PROT_WRITE,
            MAP_SHARED,
            descriptor.rawValue,
            0
        )
        guard let mapping, mapping != UnsafeMutableRawPointer(bitPattern: -1) else {
            throw WormholeError.fileSystem(currentErrno, "map \(fileName), the count of live listeners,", path: path)
        }
        return LiveChangeCounter(count: mapping.assumingMemoryBound(to: UInt64.self))
        #else
        return nil
        #endif
    }

    /// The count now.
    var value: UInt64 {
        #if os(Linux) || os(Android)
        cwormhole_shared_load(count)
        #else
        0
        #endif
    }

    /// Adds 1: the directory's listeners changed.
    func increment() {
        #if os(Linux) || os(Android)
        cwormhole_shared_increment(count)
        #endif
    }
}
