import Foundation
import Synchronization

/// A child process running this same executable, whose output lines are handed to a callback as they come.
///
/// The lines are read on a thread of their own, never on the cooperative pool.
package final class ChildProcess: Sendable {
    private let process: Process
    private let readiness = DispatchSemaphore(value: 0)
    private let outputEnded = DispatchSemaphore(value: 0)

    /// The path of the running executable, to start copies of it.
    package static var executablePath: String {
        #if os(Linux)
        if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { return path }
        #endif
        return Bundle.main.executablePath ?? CommandLine.arguments[0]
    }

    /// Starts `wormhole ARGUMENTS`; each line of its standard output goes to `onLine`, and a line equal to
    /// `readyLine` signals ``waitUntilReady(timeout:)``. Standard error is passed through.
    package init(arguments: [String], readyLine: String? = nil, onLine: @escaping @Sendable (String) -> Void) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.executablePath)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        self.process = process
        try process.run()
        let reader = pipe.fileHandleForReading
        let (readiness, outputEnded) = (self.readiness, self.outputEnded)
        let thread = Thread {
            defer { outputEnded.signal() }
            var pending = Data()
            while true {
                let chunk = reader.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                    pending.removeSubrange(pending.startIndex...newline)
                    if line == readyLine { readiness.signal() } else { onLine(line) }
                }
            }
            if !pending.isEmpty { onLine(String(decoding: pending, as: UTF8.self)) }
        }
        thread.start()
    }

    /// Waits for the ready line; false on time-out.
    package func waitUntilReady(timeout: Double) -> Bool {
        readiness.wait(timeout: .now() + timeout) == .success
    }

    /// Waits for the child to exit, up to `timeout` seconds; kills it after that. Returns its exit status.
    @discardableResult
    package func wait(timeout: Double) -> Int32 {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
            return -1
        }
        process.waitUntilExit()
        return process.terminationStatus
    }

    package func terminate() {
        if process.isRunning { process.terminate() }
    }

    /// Kills the child with SIGKILL, then waits until every line it wrote has gone to `onLine`.
    package func kill() {
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        _ = outputEnded.wait(timeout: .now() + 10)
    }
}
