import SystemPackage

/// Bytes in memory allocated once and reused from one call to the next: the queue reader's chunk of the log, and the
/// records a producer encodes before its one `write`.
///
/// A buffer grown for a large batch or a large record shrinks back once it is done with, so that one 64 MiB message
/// is not kept for good.
final class ReusableBuffer {
    // Used by one thread at a time (a reader's owner serialises its calls; a producer holds its lock): the run-time
    // exclusivity checks of these properties would be most of a small message's cost.
    @exclusivity(unchecked) private var storage: UnsafeMutableRawPointer
    @exclusivity(unchecked) private var capacity: Int
    private let usualCapacity: Int
    /// The most memory kept once done with.
    private let keptCapacity: Int
    /// The bytes held.
    @exclusivity(unchecked) private(set) var count = 0

    /// A buffer of `capacity` bytes, which gives back what it grew beyond `keptCapacity` once done with it.
    init(capacity: Int, keepingUpTo keptCapacity: Int) {
        usualCapacity = capacity
        self.keptCapacity = keptCapacity
        self.capacity = capacity
        storage = .allocate(byteCount: capacity, alignment: 16)
    }

    deinit { storage.deallocate() }

    var isEmpty: Bool { count == 0 }

    /// The bytes held.
    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: storage, count: count) }

    /// Forgets the bytes held, keeping the memory.
    func removeAll() { count = 0 }

    /// Makes room for `added` more bytes after those held and counts them in; returns where they go.
    func append(count added: Int) -> UnsafeMutableRawPointer {
        if count + added > capacity {
            let grown = max(count + added, capacity * 2)
            let larger = UnsafeMutableRawPointer.allocate(byteCount: grown, alignment: 16)
            larger.copyMemory(from: storage, byteCount: count)
            storage.deallocate()
            storage = larger
            capacity = grown
        }
        defer { count += added }
        return storage + count
    }

    /// Gives back the memory of a huge batch or record, once done with (forgetting the bytes, if it does).
    func shrinkAfterHugeBatch() {
        guard capacity > keptCapacity else { return }
        storage.deallocate()
        capacity = usualCapacity
        storage = .allocate(byteCount: capacity, alignment: 16)
        count = 0
    }

    /// Reads up to `wanted` bytes at `offset`, replacing the contents; returns how many were read.
    func read(_ descriptor: Descriptor, count wanted: Int, at offset: UInt64) -> Result<Int, Errno> {
        if wanted <= usualCapacity { shrinkAfterHugeBatch() }
        count = 0
        if wanted > capacity {
            storage.deallocate()
            capacity = wanted
            storage = .allocate(byteCount: capacity, alignment: 16)
        }
        let read = descriptor.read(into: storage, count: wanted, at: offset)
        count = (try? read.get()) ?? 0
        return read
    }
}
