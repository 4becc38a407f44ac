import Dispatch
import PostgresNIO
import WormholeKit

/// Where an engine's connections come from.
enum ConnectionSource: Sendable, CustomStringConvertible {
    /// Connections of the engine's own, opened to the server at this location.
    case location(PostgresLocation)
    /// Connections borrowed from a `PostgresClient` the user runs.
    case client(PostgresClient)

    var description: String {
        switch self {
        case .location(let location): location.description
        case .client: "behind a PostgresClient"
        }
    }
}

/// A connection of a user's `PostgresClient`, lent to a synchronous caller.
///
/// A client lends its connections only to `async` code, for the time of a closure. So a task takes the lease and
/// hands the connection over, and the caller's thread blocks until it has it, runs its statements, and gives it back:
/// the task's closure then returns, and the client has its connection again. The task runs on a
/// ``PostgresClientExecutor`` of the engine's, never on Swift's cooperative pool, so a caller blocked for a lease never
/// waits for a thread of that pool (the client's own `run()` may, unless it runs on such an executor too).
final class ClientLease: Sendable {
    private enum State {
        /// The caller waits for a connection.
        case waiting
        /// The caller has the connection; the task waits for it back, and for whether to close it first.
        case lent(PostgresConnection, CheckedContinuation<Bool, Never>)
        /// The client could not lend one.
        case failed(any Error)
        /// The caller stopped waiting: a connection lent now goes straight back.
        case abandoned
        /// The connection was given back.
        case ended
    }

    private let state = Locked<State>(.waiting)
    private let handedOver = DispatchSemaphore(value: 0)

    private init() {}

    /// Borrows a connection from `client`, waiting at most `timeout`; give it back with ``giveBack(closing:)``.
    /// A failure's error names the client's server `server`.
    static func borrow(
        from client: PostgresClient,
        on executor: PostgresClientExecutor,
        within timeout: Duration,
        server: @autoclosure () -> String,
        doing what: @autoclosure () -> String
    ) throws(WormholeError) -> (PostgresConnection, ClientLease) {
        let lease = ClientLease()
        let task = Task(executorPreference: executor) {
            do {
                try await client.withConnection { connection in
                    let closing = await withCheckedContinuation { lease.lend(connection, $0) }
                    // A connection whose state is unknown (a statement failed on it, or its session could not be
                    // set back) goes back closed: the client replaces it.
                    if closing { try? await connection.close() }
                }
            } catch {
                lease.fail(error)
            }
        }
        if lease.handedOver.wait(timeout: .now() + timeout.dispatchInterval) == .timedOut {
            let gaveUp = lease.state.withLock { state in
                guard case .waiting = state else { return false }
                state = .abandoned
                return true
            }
            if gaveUp {
                task.cancel()
                throw WormholeError(
                    .serverUnavailable,
                    "The PostgresClient lent no connection within \(timeout) while \(what()). Check that its run() "
                        + "is running (in a ServiceGroup or a task of its own) and that its pool "
                        + "(maximumConnections) is not used up."
                )
            }
        }
        switch lease.state.withLock({ $0 }) {
        case .lent(let connection, _): return (connection, lease)
        case .failed(let error):
            throw Connections.wormholeError(error, doing: what(), server: server())
        case .waiting, .abandoned, .ended:
            preconditionFailure("A lease handed over nothing.")
        }
    }

    private func lend(_ connection: PostgresConnection, _ continuation: CheckedContinuation<Bool, Never>) {
        let taken = state.withLock { state in
            guard case .waiting = state else { return false }
            state = .lent(connection, continuation)
            return true
        }
        if taken { handedOver.signal() } else { continuation.resume(returning: false) }
    }

    private func fail(_ error: any Error) {
        let failed = state.withLock { state in
            guard case .waiting = state else { return false }
            state = .failed(error)
            return true
        }
        if failed { handedOver.signal() }
    }

    /// Gives the connection back to the client, closed first when `closing`.
    func giveBack(closing: Bool) {
        let continuation = state.withLock { state -> CheckedContinuation<Bool, Never>? in
            guard case .lent(_, let continuation) = state else { return nil }
            state = .ended
            return continuation
        }
        continuation?.resume(returning: closing)
    }
}
