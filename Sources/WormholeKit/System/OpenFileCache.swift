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
        /// The sender of the last message read through this entry, as bytes and as text; only touched while
        /// `descriptor`'s lock is held. Most messages of a mailbox come from one or two senders: a read whose sender
        /// is the last one's makes no `String` (an allocation, for a name past 15 bytes).
        nonisolated(unsafe) private var lastSender: (bytes: [UInt8], text: String) = ([], "")

        /// The text of a sender's bytes, decoded only when they differ from the last sender's. Call it while holding
        /// `descriptor`'s lock.
        func senderText(_ bytes: UnsafeRawBufferPointer) -> String {
            let same = lastSender.bytes.withUnsafeBytes { last in
                last.count == bytes.count
                    && (bytes.isEmpty || memcmp(last.baseAddress!, bytes.baseAddress!, bytes.count) == 0)
            }
            if !same { lastSender = (Array(bytes), String(decoding: bytes, as: UTF8.self)) }
            return lastSender.text
        }

        init(name: String) { self.name = name }

        deinit {
            descriptor.withLock { descriptor in
                if descriptor >= 0 { _ = close(descriptor) }
            }
        }
    }

    private struct State {
        var entries: [String: Entry] = [:]
        /// The few entries asked for last, searched first: a process passing to one or two identifiers finds its
        /// entry by comparing strings, with no hashing (SipHash over the key, about 300 instructions a lookup).
        var recent: [(key: String, entry: Entry)] = []
    }

    private static let recentKept = 4
    private let state = Locked(State())
    private let capacity: Int
    private let fileName: @Sendable (String) -> String

    /// A cache of at most `capacity` entries, whose files are named `fileName(key)`.
    init(capacity: Int = 256, fileName: @escaping @Sendable (String) -> String = { $0 }) {
        self.capacity = capacity
        self.fileName = fileName
    }

    func entry(_ key: String) -> Entry {
        state.withLock { state in
            for recent in state.recent where recent.key == key { return recent.entry }
            let entry: Entry
            if let known = state.entries[key] {
                entry = known
            } else {
                if state.entries.count >= capacity {
                    let evicted = state.entries.remove(at: state.entries.startIndex)
                    state.recent.removeAll { $0.entry === evicted.value }
                }
                entry = Entry(name: fileName(key))
                state.entries[key] = entry
            }
            if state.recent.count >= Self.recentKept { state.recent.removeFirst() }
            state.recent.append((key, entry))
            return entry
        }
    }
}

/// Closes a cached descriptor and marks the entry for reopening.
func closeCached(_ descriptor: inout Int32) {
    if descriptor >= 0 { _ = close(descriptor) }
    descriptor = -1
}
