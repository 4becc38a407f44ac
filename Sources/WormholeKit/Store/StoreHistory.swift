import Logging

/// What remote-change consumers need of a shared store, whatever holds it: its history, its durable consumers'
/// tokens, and a wake-up after each commit.
///
/// The SQLite store (`WormholeStore`) and the PostgreSQL store (`WormholePostgres`) each implement it; consumers,
/// observers and sequences (``RemoteChangeObserver``, ``RemoteChangeSequence``) are written once against it, so both
/// stores keep the same promises and are held to the same contract tests. Every call may block its thread for a
/// database round trip: callers make them on threads that may block, but for the registration and the first
/// observation of a ``RemoteChangeSequence``, made on the thread that creates it (so that nothing committed after it
/// is made is missed).
package protocol StoreHistory: Sendable {
    /// Who this process is in the history: its own transactions are skipped unless a consumer asks for them.
    var author: String { get }
    /// Where the store is, for errors: a file path or a server and store name (never a password).
    var location: String { get }
    /// Where delivery failures go when no error handler is given.
    var logger: Logger { get }

    /// Registers the durable consumer `name` (or refreshes when it was last seen) and returns its token; a new
    /// consumer starts at the newest transaction. With `name` nil, returns the newest token.
    func registerConsumer(_ name: String?) throws(StoreError) -> Int64

    /// Up to `limit` transactions after `token`, oldest first, those touching none of `tables` left out (and the
    /// others cut down to `tables`); `scannedThrough` is the last transaction looked at, kept or not.
    func transactions(
        after token: Int64,
        limit: Int,
        tables: Set<String>?
    ) throws(StoreError) -> (transactions: [StoreTransaction], scannedThrough: Int64)

    /// Stores `token` for the durable consumer `consumer`, unless its stored token is already further.
    func storeToken(_ token: Int64, consumer: String) throws(StoreError)

    /// Calls `handler` after each commit of the store (by any process), and after a lost notification may have
    /// hidden one.
    func observeCommits(_ handler: @escaping @Sendable () -> Void) throws(StoreError) -> NotifierObservation

    /// Deletes merged history when it is time to (a cheap no-op most of the time).
    func purgeIfDue()
}
