import Synchronization

/// A flag that is set once and read from any thread, held by reference so that callbacks can share it without
/// keeping the object it belongs to alive.
final class Flag: Sendable {
    private let value = Atomic<Bool>(false)

    /// Sets the flag; returns whether it was already set.
    @discardableResult
    func set() -> Bool { value.exchange(true, ordering: .acquiringAndReleasing) }

    /// Whether the flag is set.
    var isSet: Bool { value.load(ordering: .acquiring) }
}
