import Foundation

/// The storage of a key-value suite: its values, a version that grows with each change, and the recent changes.
///
/// ``WormholeSuite`` computes what each observer is told; a store keeps these promises, which the suite contract
/// tests check for every engine:
///
/// - ``update(sender:direction:_:)`` is atomic across processes: `body` sees the current values, and no other update
///   comes between its read and its write. A store may run `body` more than once (an optimistic one runs it again
///   when another update came in between); only the last run's values are written. A change is recorded
///   (version + 1, with its sender, direction, keys and values) only when a value differs; then observers are woken.
/// - ``changes(after:)`` returns the changes after a version, in order, while the store still keeps them all; when it
///   no longer does, it returns nil for the changes and the current state, so that the caller can report the
///   difference.
/// - ``observe(_:)`` calls its handler, at least once, after each recorded change that completes after it returned.
///
/// Not yet stable: it may change in a minor release before 1.0 (see ``WormholeEngine``).
public protocol SuiteStore: Sendable {
    /// The suite's name.
    var name: String { get }

    /// The current values and version.
    func read() throws(WormholeError) -> SuiteState

    /// Changes any number of keys atomically and records the change.
    ///
    /// - Returns: The change recorded, or nil when `body` changed nothing.
    @discardableResult
    func update(
        sender: String,
        direction: String?,
        _ body: (inout SuiteValues) throws(WormholeError) -> Void
    ) throws(WormholeError) -> SuiteChange?

    /// The current state, and the changes recorded after `version` in order (nil when some are no longer kept).
    func changes(after version: UInt64) throws(WormholeError) -> (state: SuiteState, changes: [SuiteChange]?)

    /// Calls `handler` after each recorded change, until the observation is cancelled or released.
    func observe(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation
}

/// A suite's values at a version.
public struct SuiteState: Sendable, Equatable {
    /// The number of changes recorded so far.
    public var version: UInt64
    /// Every key and value.
    public var values: SuiteValues
    /// Which history the version counts in: another lineage means the suite started over (its file was removed, say),
    /// so that versions of the two cannot be compared. 0 for a store that never starts over.
    public var lineage: UInt64

    /// Creates a state.
    public init(version: UInt64 = 0, values: SuiteValues = SuiteValues(), lineage: UInt64 = 0) {
        self.version = version
        self.values = values
        self.lineage = lineage
    }
}
