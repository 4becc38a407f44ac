import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Descriptors kept open by key (a file's name, or what names it), so that a pass costs a few system calls and no path
/// lookup.
///
/// Each entry has its own lock, held while its descriptor is used: `flock` does not exclude threads that share
/// one open file description, so this process's threads take turns here before they lock against other
/// processes. A user of an entry checks the file's link count after locking it and reopens a file that was
/// replaced or removed (link count 0). At most `capacity` names are kept; an evicted entry's descriptor is
/// closed when its last user lets go of it.
final class OpenFileCache: Sendable {
    final class Entry: Sendable {
        /// The name of the file, made once when the entry is: a mailbox's pass builds no string for it.
        let name: String
        /// The open descriptor, or -1 before the first open and after a replaced file was closed.
        let descriptor = Locked<Int32>(-1)

        init(name: String) { self.name = name }

        deinit {
            descriptor.withLock { descriptor in
                if descriptor >= 0 { _ = close(descriptor) }
            }
        }
    }

    private let entries = Locked<[String: Entry]>([:])
    private let capacity: Int
    private let fileName: @Sendable (String) -> String

    /// A cache of at most `capacity` entries, whose files are named `fileName(key)`.
    init(capacity: Int = 256, fileName: @escaping @Sendable (String) -> String = { $0 }) {
        self.capacity = capacity
        self.fileName = fileName
    }

    func entry(_ key: String) -> Entry {
        entries.withLock { entries in
            if let entry = entries[key] { return entry }
            if entries.count >= capacity { entries.remove(at: entries.startIndex) }
            let entry = Entry(name: fileName(key))
            entries[key] = entry
            return entry
        }
    }
}

/// Closes a cached descriptor and marks the entry for reopening.
func closeCached(_ descriptor: inout Int32) {
    if descriptor >= 0 { _ = close(descriptor) }
    descriptor = -1
}
