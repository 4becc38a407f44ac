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
/// replaced or removed (link count 0), except a mailbox listener's read that the entry's watch allows to skip the
/// check (``Entry/isTrustedWhileWatched``). At most `capacity` names are kept, watched ones beyond it; an evicted
/// entry's descriptor is closed when its last user lets go of it.
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

        // MARK: Trust while watched

        /// The inotify watches of this entry's file that this process holds (through
        /// ``beginWatching()`` and ``endWatching()``).
        private let watches = Atomic<Int>(0)
        /// Changes whenever this entry's file may have been replaced, or had its links, owner or mode changed, as the
        /// watches' events say, and whenever a watch begins or ends.
        private let epoch = Atomic<UInt64>(1)
        /// Counts the descriptors opened into this entry; only touched while `descriptor`'s lock is held.
        nonisolated(unsafe) private var opens: UInt64 = 0
        /// The `opens` and `epoch` at which the open descriptor was last checked (its link, type and owner) while
        /// watched; only touched while `descriptor`'s lock is held.
        nonisolated(unsafe) private var trusted: (opens: UInt64, epoch: UInt64) = (0, 0)

        /// Call it, holding `descriptor`'s lock, each time a descriptor is opened into the entry.
        func opened() { opens &+= 1 }

        /// What to pass to ``checked(_:)`` once the open descriptor passed its checks: read before them, so that an
        /// event that comes during them leaves the descriptor untrusted; 0 (never trusted) while the file is not
        /// watched.
        func beforeCheck() -> UInt64 {
            let current = epoch.load(ordering: .acquiring)
            return watches.load(ordering: .acquiring) > 0 ? current : 0
        }

        /// Records, holding `descriptor`'s lock, that the open descriptor passed its checks (`beforeCheck` is what
        /// ``beforeCheck()`` gave before them; 0 leaves it untrusted).
        func checked(_ beforeCheck: UInt64) { trusted = (opens, beforeCheck) }

        /// Whether the open descriptor may be read again without its checks, holding `descriptor`'s lock: it passed
        /// them, as the file at the entry's path, while the path was watched, and the monitor has not said since that
        /// the file may have changed. Only a read in a handler of the inotify monitor may take this: an event that
        /// says the file was replaced may still be on its way to any other, and the monitor reads it before it runs
        /// that handler again.
        var isTrustedWhileWatched: Bool {
            trusted.epoch != 0 && trusted.opens == opens && trusted.epoch == epoch.load(ordering: .acquiring)
        }

        /// Whether a watch of this entry's file counts (evicting the entry would lose what the watch says).
        var isWatched: Bool { watches.load(ordering: .acquiring) > 0 }

        /// A watch of this entry's file begins (call it once the watch is made, so that no check made before then
        /// is trusted).
        func beginWatching() {
            watches.add(1, ordering: .acquiringAndReleasing)
            epoch.add(1, ordering: .acquiringAndReleasing)
        }

        /// A watch of this entry's file ended.
        func endWatching() {
            watches.subtract(1, ordering: .acquiringAndReleasing)
            epoch.add(1, ordering: .acquiringAndReleasing)
        }

        /// An event of a watch said the file may have been replaced, or had its links, owner or mode changed.
        func distrust() { epoch.add(1, ordering: .acquiringAndReleasing) }

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
                if state.entries.count >= capacity,
                    let index = state.entries.firstIndex(where: { !$0.value.isWatched })
                {
                    let evicted = state.entries.remove(at: index)
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
