import Foundation

/// Where a file-transfer channel keeps the files sent and not yet received.
///
/// ``WormholeTransfers`` queues a ``FileTransfer`` for each file on a ``QueueLog`` of the same engine; the staging
/// area holds the file's bytes. An engine's staging area keeps these promises, which the transfer contract tests
/// check for every engine:
///
/// - ``stage(id:from:progress:)`` copies a file of any size in chunks and makes it visible under `id` only once it is
///   whole; on failure nothing is left under `id`. An engine that stores files elsewhere than in memory never holds
///   the whole file in memory (the in-memory engine of `WormholeTesting`, a test double, does).
/// - ``deliver(_:into:)`` puts the staged file into the destination directory once: called again for the same
///   transfer (a receiver killed before acknowledging), it returns where the file went the first time.
/// - A transfer cancelled before delivery is gone: ``deliver(_:into:)`` returns nil.
///
/// Not yet stable: it may change in a minor release before 1.0 (see ``WormholeEngine``).
public protocol TransferStaging: Sendable {
    /// Copies the regular file at `path` into the staging area under `id`, calling `progress` after each chunk.
    ///
    /// - Returns: The file's size.
    func stage(
        id: String,
        from path: String,
        progress: (@Sendable (TransferProgress) -> Void)?
    ) throws(WormholeError) -> UInt64

    /// Removes a staged file; returns whether it was there (not yet delivered).
    func remove(id: String) throws(WormholeError) -> Bool

    /// The ids of the files staged and not yet delivered, sorted.
    func stagedIDs() throws(WormholeError) -> [String]

    /// Puts the staged file of `transfer` into the directory `destination`, under the transfer's name (with ` (2)`,
    /// ` (3)`… when the name is taken); nil when it was cancelled. Idempotent until ``finishDelivery(id:)``.
    func deliver(_ transfer: FileTransfer, into destination: String) throws(WormholeError) -> ReceivedFile?

    /// Forgets a delivery once its receiver has acknowledged it.
    func finishDelivery(id: String)

    /// Removes partial copies left by senders that stopped mid-copy, older than `age`.
    func removeAbandonedCopies(olderThan age: Duration) throws(WormholeError)
}
