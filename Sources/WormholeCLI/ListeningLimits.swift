import ArgumentParser
import Foundation
import Synchronization
import WormholeKit

/// `--count` and `--timeout` of the commands that listen (`listen`, `consume`, `live-listen`, `defaults watch`,
/// `transfer receive`, `store watch`), and the wait they share.
package struct ListeningLimits: ParsableArguments {
    @Option(help: "Exit after receiving this many.")
    package var count: Int?

    @Option(help: "Exit after this many seconds (status 1 if --count were not all received by then).")
    package var timeout: Double?

    package init() {}

    package func validate() throws {
        if let count, count < 1 { throw ValidationError("--count must be at least 1.") }
        if let timeout, timeout <= 0 { throw ValidationError("--timeout must be positive.") }
    }

    /// Starts listening with `start`, says `ready` on standard error, waits until the callback has called
    /// ``Tally/add()`` `--count` times, or for `--timeout`, or for ever, then stops listening.
    ///
    /// - Throws: an exit with status 1 when `--count` was given and did not all come before `--timeout`.
    package func listen(ready: String, _ start: (Tally) throws -> any WormholeCancellable) throws {
        let tally = Tally(limit: count)
        let handle = try start(tally)
        FileHandle.standardError.write(Data((ready + "\n").utf8))
        let finished = Output.wait(for: tally.done, timeout: timeout)
        handle.cancel()
        if !finished, let limit = count {
            throw Output.fail("timed out after \(timeout ?? 0) s with \(tally.value) of \(limit)")
        }
    }

    /// What a listening command has received so far.
    package final class Tally: Sendable {
        let limit: Int?
        let done = DispatchSemaphore(value: 0)
        private let count = Locked(0)

        init(limit: Int?) { self.limit = limit }

        /// How many were received.
        package var value: Int { count.withLock { $0 } }

        /// Whether `--count` were received: what comes after is left for the next command.
        package var isReached: Bool { count.withLock { $0 >= (limit ?? .max) } }

        /// Counts one received; call it after printing it, so that the command never exits before its last line.
        package func add() {
            if count.withLock({ count in
                count += 1
                return count
            }) == limit {
                done.signal()
            }
        }
    }
}
